// The open period of a breaker: how long it lasts, and the heartbeat that ends it.

package proxy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sony/gobreaker/v2"
)

// errNoHeartbeat is why a call is refused by a breaker whose instance has
// not answered the heartbeat since it opened.
var errNoHeartbeat = errors.New("proxy: open until the instance answers a heartbeat")

// errProbeFailed is what a breaker counts when its instance did not answer
// the heartbeat that ends an open period.
var errProbeFailed = errors.New("proxy: the instance did not answer a heartbeat")

// opened starts an open period of h, whose breaker just tripped (from
// closed) or re-opened (from half-open), and arms the heartbeat that ends
// it. It runs inside the breaker's state change, under its lock.
func (b *breakers) opened(h *instanceHealth, from gobreaker.State) {
	h.probe.Lock()
	defer h.probe.Unlock()
	h.admit.Store(false)
	now := time.Now()
	switch {
	case from == gobreaker.StateHalfOpen, now.Sub(h.closedAt) < h.period:
		// A failed probe, or a trip soon after the breaker closed (within
		// the last open period): the instance is still unwell, and is
		// left alone for longer each time.
		h.period = min(2*h.period, b.cfg.MaxOpenTimeout)
	default:
		h.period = b.cfg.OpenTimeout
	}
	h.period = max(h.period, b.cfg.OpenTimeout)
	if h.stopped || b.closing.Load() {
		return
	}
	if h.timer == nil {
		h.timer = time.AfterFunc(h.period, func() { b.heartbeat(h) })
	} else {
		h.timer.Reset(h.period)
	}
}

// closed records that h's breaker closed: a trip within the open period
// it just ended lengthens the next one.
func (h *instanceHealth) closed() {
	h.probe.Lock()
	defer h.probe.Unlock()
	h.admit.Store(false)
	h.closedAt = time.Now()
	if h.timer != nil {
		h.timer.Stop()
	}
}

// stop stops h's probing for good: its breaker went, or the client closed.
func (h *instanceHealth) stop() {
	h.probe.Lock()
	defer h.probe.Unlock()
	h.stopped = true
	if h.timer != nil {
		h.timer.Stop()
	}
}

// openPeriod returns the length of h's current or last open period.
func (h *instanceHealth) openPeriod() time.Duration {
	h.probe.Lock()
	defer h.probe.Unlock()
	return h.period
}

// heartbeat ends an open period of h: it sends a heartbeat to the
// instance. When the instance answers, the breaker turns half-open and
// lets HalfOpenProbes calls through. When it does not, the breaker opens
// again for a longer period. So no call waits on an instance that does
// not answer at all (a frozen process, a lost host).
func (b *breakers) heartbeat(h *instanceHealth) {
	b.life.Lock()
	if b.closing.Load() || h.isStopped() {
		b.life.Unlock()
		return
	}
	b.wg.Add(1)
	b.life.Unlock()
	defer b.wg.Done()
	// The timer fires a period after the breaker opened, and the breaker's
	// own OpenTimeout is at most that period: it reads half-open now,
	// unless it closed or opened anew meanwhile (and opened re-armed the
	// timer).
	if h.cb.State() != gobreaker.StateHalfOpen {
		return
	}
	var err error
	if b.ping != nil {
		ctx, cancel := context.WithTimeout(b.ctx, b.cfg.ProbeTimeout)
		err = b.ping(ctx, h.cb.Name())
		cancel()
		if b.ctx.Err() != nil {
			return // the client closed
		}
	}
	if err == nil {
		h.admit.Store(true)
		// Asking turns the breaker half-open: its OpenTimeout, at most the
		// period, has passed.
		if h.cb.State() == gobreaker.StateHalfOpen {
			b.gen.Add(1)
			b.log.Warn("dabb: circuit breaker", "addr", h.cb.Name(), "from", "open", "to", "half-open", "after", "a heartbeat answered")
			if b.observer != nil {
				b.observer.BreakerChanged(h.cb.Name(), gobreaker.StateOpen.String(), gobreaker.StateHalfOpen.String())
			}
		}
		return
	}
	// The failure goes through the breaker as a probe of its own: it
	// opens again, and opened arms the next heartbeat. The cause is
	// flattened: a dial backoff's error would be excluded from the counts.
	_, _ = h.cb.Execute(func() (struct{}, error) { return struct{}{}, fmt.Errorf("%w: %v", errProbeFailed, err) })
}

func (h *instanceHealth) isStopped() bool {
	h.probe.Lock()
	defer h.probe.Unlock()
	return h.stopped
}

// close stops every breaker's probing and waits for the heartbeats in
// flight.
func (b *breakers) close() {
	b.life.Lock()
	b.closing.Store(true)
	b.life.Unlock()
	b.cancel()
	for _, h := range *b.m.Load() {
		h.stop()
	}
	b.wg.Wait()
}
