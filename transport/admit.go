// Admission at MaxConns: a place for every new connection, made by closing an idle one when the server is full.

package transport

import (
	"math"
	"net"
	"slices"
	"sync/atomic"
	"time"
)

// evicting is the in-flight count evict gives the connection it closes.
// From then on dispatch runs no call of it.
const evicting = math.MinInt64 / 2

// full takes one of the MaxConns places for nc and reports false. When the
// server holds MaxConns connections already, it makes room (evict). When
// nothing can be evicted, it turns nc away (turnAway), counts it
// (RejectMaxConns) and reports true. forget gives the place back, and so
// does unplace for a connection track refused.
func (s *Server) full(nc net.Conn) bool {
	// The place is taken before the check: two listeners accepting at
	// once must not both see the last one free.
	if s.nconns.Add(1) <= int64(s.cfg.MaxConns) || s.evict() {
		return false
	}
	s.nconns.Add(-1)
	s.rejected(RejectMaxConns) // before the go-away or the close, which the peer sees
	s.turnAway(nc)
	// One line a second at most: a flood of connections must not become
	// a flood of log lines.
	if logNow(&s.refusedLog) {
		s.log.Warn("transport: too many connections and none to close for room; turning new ones away",
			"max_conns", s.cfg.MaxConns, "remote", nc.RemoteAddr())
	}
	return true
}

// turnAway refuses nc, which has no place. Up to maxLingering connections
// at once, it is served as one evict closed (retire): the go-away event,
// 100 to each request, and the close when the peer closes it or after
// evictLinger. Its peer may have sent a request already. Past
// maxLingering, or once the server stops serving, nc is closed at once.
func (s *Server) turnAway(nc net.Conn) {
	// A look before the serverConn is made: linger below is the bound.
	if s.current() != serving || s.lingering.Load() >= maxLingering {
		_ = nc.Close()
		return
	}
	sc := newServerConn(s, nc)
	sc.placeless = true
	sc.inflight.Store(evicting) // it runs no call
	if !s.track(sc) {
		_ = nc.Close()
		return
	}
	if sc.linger(evictLinger) {
		sc.goAway()
	} else {
		sc.close() // maxLingering reached meanwhile
	}
	go sc.serve() // on a closed connection it returns at once
}

// unplace gives back the place full took for a connection that track
// refused.
func (s *Server) unplace() { s.nconns.Add(-1) }

// evict closes one connection to make room for a new one, and reports
// whether it did. It closes, first, the oldest connection that has not
// completed a valid frame in its first s.grace. Then, of those with no
// call in flight, the oldest that never made a call, and then the one
// that has waited longest since its last answer, if that was more than
// s.grace ago. Then the oldest of those still in their first s.grace,
// and last those whose last answer left within s.grace. It never closes a connection with
// a call in flight. It evicts nothing once the server stops serving.
func (s *Server) evict() bool {
	// A few tries: the connection chosen may dispatch a call between the
	// choice and the claim.
	for range 4 {
		s.mu.Lock()
		var victim *serverConn
		if s.current() == serving {
			victim = s.victimLocked()
		}
		s.mu.Unlock()
		if victim == nil {
			return false
		}
		// The claim: dispatch sees evicting and runs nothing, so no call
		// is cut by the close below.
		if !victim.inflight.CompareAndSwap(0, evicting) {
			continue
		}
		s.retire(victim)
		s.evicted.Add(1)
		if logNow(&s.evictedLog) {
			s.log.Info("transport: at MaxConns; closed idle connections to make room for new ones",
				"max_conns", s.cfg.MaxConns, "closed", s.evicted.Swap(0))
		}
		return true
	}
	return false
}

// evictLinger is how long a connection evict closed stays open after its
// go-away event, unless its peer closes it first. Requests the peer sent
// before it saw the event arrive within a round trip.
const evictLinger = time.Second

// maxLingering bounds the connections left open for a while after their
// go-away event (retire, turnAway), beyond MaxConns. Past it, such a
// connection is closed at once.
const maxLingering = 64

// retire closes victim, claimed by evict, to make room. Its peer may have
// a request on its way: victim is sent the go-away event, gives its place
// back now and stays open until the peer closes it, or for evictLinger.
// Requests read meanwhile are answered 100, not run (dispatch). A
// connection whose grace ended without a valid frame is closed at once,
// as are victims past maxLingering.
func (s *Server) retire(victim *serverConn) {
	silent := !victim.watch.valid.Load() && victim.accepted <= time.Now().Add(-s.grace).UnixNano()
	if silent || !victim.linger(evictLinger) {
		victim.close()
		return
	}
	victim.goAway()
	s.givePlace(victim)
}

// givePlace gives back the MaxConns place of sc, once, whether evict or
// forget comes first.
func (s *Server) givePlace(sc *serverConn) {
	if sc.placed.CompareAndSwap(true, false) {
		s.nconns.Add(-1)
	}
}

// victimLocked returns the connection evict closes, or nil. The caller
// holds s.mu.
func (s *Server) victimLocked() *serverConn {
	born := time.Now().Add(-s.grace).UnixNano() // accepted after born: in its grace
	if sc := s.takeVictimLocked(born); sc != nil {
		return sc
	}
	s.refillLocked(born)
	return s.takeVictimLocked(born)
}

// candidate is a connection evict may close, as the last pass over the
// connections found it.
type candidate struct {
	sc   *serverConn
	rank evictRank
	key  int64 // the order within the rank: accepted, or idleSince
}

// evictRank orders the connections evict may close: the lower first.
type evictRank uint8

const (
	rankSilent   evictRank = iota // no valid frame, grace over
	rankUncalled                  // valid frames, never a call
	rankIdle                      // no call in flight since idleSince, grace over
	rankFresh                     // no valid frame yet, in its grace
	rankRecent                    // no call in flight, its last answered in the grace
)

// rankOf returns where sc stands for evict, or ok false when it has a
// call in flight.
func rankOf(sc *serverConn, born int64) (rank evictRank, key int64, ok bool) {
	switch {
	case sc.inflight.Load() < 0:
		return 0, 0, false // claimed already, lingering
	case !sc.watch.valid.Load() && sc.accepted <= born:
		return rankSilent, sc.accepted, true
	case !sc.watch.valid.Load():
		// A connection just accepted has had no time to send a frame.
		// Were it taken first, an attacker that reopens each closed
		// connection at once would make every new client's connection
		// the next to go, before its first request is read.
		return rankFresh, sc.accepted, true
	case sc.inflight.Load() != 0:
		return 0, 0, false
	}
	if t := sc.idleSince.Load(); t > born {
		// A client between two calls: its next request may be on the
		// wire now, and a close would cut it unanswered. So it goes
		// last, after the connections still in their grace.
		return rankRecent, t, true
	} else if t != 0 {
		return rankIdle, t, true
	}
	// Valid frames and no call: heartbeats at most. A client that calls
	// between long idle spells keeps its place over these.
	return rankUncalled, sc.accepted, true
}

func (a candidate) less(b candidate) bool {
	return a.rank < b.rank || (a.rank == b.rank && a.key < b.key)
}

// takeVictimLocked pops the candidates of the last pass until one still
// stands where the pass found it.
func (s *Server) takeVictimLocked(born int64) *serverConn {
	for len(s.victims) > 0 {
		c := s.victims[0]
		s.victims[0] = candidate{}
		s.victims = s.victims[1:]
		if _, open := s.conns[c.sc]; !open {
			continue
		}
		if rank, key, ok := rankOf(c.sc, born); ok && rank == c.rank && key == c.key {
			return c.sc
		}
	}
	return nil
}

// refillLocked makes one pass over the connections and keeps the first
// ones evict would close: one per 128 connections, so that the pass's
// cost spreads over as many evictions.
func (s *Server) refillLocked(born int64) {
	k := max(1, len(s.conns)/128)
	best := s.victims[:0]
	for sc := range s.conns {
		rank, key, ok := rankOf(sc, born)
		if !ok {
			continue
		}
		c := candidate{sc: sc, rank: rank, key: key}
		if len(best) == k && !c.less(best[k-1]) {
			continue
		}
		i, _ := slices.BinarySearchFunc(best, c, func(e, c candidate) int {
			if e.less(c) {
				return -1
			}
			return 1
		})
		if len(best) == k {
			best = best[:k-1]
		}
		best = slices.Insert(best, i, c)
	}
	s.victims = best
}

// evictGrace is the time a new connection has to send a valid frame
// before, at MaxConns, it is closed ahead of idle ones: 1s, or half of
// FirstFrameTimeout when that is less.
func evictGrace(cfg *ServerConfig) time.Duration {
	return min(time.Second, cfg.FirstFrameTimeout/2)
}

// logNow reports whether a rate-limited line may be logged now, at most
// once a second, and records that it was. last holds the time of the
// previous line in Unix nanoseconds.
func logNow(last *atomic.Int64) bool {
	now := time.Now().UnixNano()
	l := last.Load()
	return now-l >= int64(time.Second) && last.CompareAndSwap(l, now)
}
