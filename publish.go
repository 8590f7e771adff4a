// Publishing a Server's services to its registry, and withdrawing them.

package dabb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dabbrpc/dabb/registry"
)

// Backoff between background publishing attempts.
const (
	republishMin = 100 * time.Millisecond
	republishMax = 30 * time.Second
)

// publisher publishes the services of one Server at the addresses it
// serves, and withdraws them once, at the first Shutdown or Close.
type publisher struct {
	reg       registry.Registry // nil: publish nothing
	advertise string            // WithAdvertiseAddr
	weight    int
	metadata  map[string]string
	timeout   time.Duration // bounds each Register and Deregister
	lazy      bool          // WithRegistryCheck(false)
	log       *slog.Logger
	services  func() map[string]*service

	// sem (capacity 1) serializes publishing: Serve, RegisterService and
	// a failed listener's unpublish. Waiting for it honours contexts.
	sem chan struct{}
	// ctx ends when the withdrawal begins. Publishing still under way
	// gives up, and withdraws itself what it registers after that.
	ctx     context.Context
	cancel  context.CancelFunc
	serving []string // advertised addresses of running Serves; guarded by sem
	// nserving is len(serving), for Ready, which must not wait for sem.
	nserving atomic.Int32

	mu        sync.Mutex          // guards published
	published []registry.Instance // nothing joins it once ctx ended

	// The withdrawal runs once, in the first Shutdown or Close. Later
	// ones wait for it, within their own context, and report its error.
	withdrawOnce sync.Once
	withdrawn    chan struct{} // closed when the withdrawal ended
	withdrawErr  error         // written before withdrawn closes
}

// newPublisher returns the publisher of a server with options o, whose
// service table services returns.
func newPublisher(o *options, log *slog.Logger, services func() map[string]*service) *publisher {
	p := &publisher{
		reg:       o.registry,
		advertise: o.advertise,
		weight:    o.weight,
		metadata:  o.metadata,
		timeout:   o.regTimeout,
		lazy:      o.lazy,
		log:       log,
		services:  services,
		sem:       make(chan struct{}, 1),
		withdrawn: make(chan struct{}),
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	return p
}

// addService runs add, which puts svc in the service table, and publishes
// svc at every address served. If publishing fails, it runs remove and
// returns the error.
func (p *publisher) addService(svc *service, add func() error, remove func()) error {
	// Holding sem while the service joins the table means a Serve
	// publishing at the same moment either sees it or is already in
	// serving: the service is published exactly once per address.
	locked := false
	if p.reg != nil {
		select {
		case p.sem <- struct{}{}:
			locked = true
			defer func() { <-p.sem }()
		case <-p.ctx.Done(): // shutting down: nothing more is published
		}
	}
	if err := add(); err != nil {
		return err
	}
	if !locked || p.ctx.Err() != nil || len(p.serving) == 0 {
		return nil
	}
	mine, err := p.register(p.ctx, svc, p.serving)
	if err := p.settle(mine, err); err != nil {
		remove()
		if errors.Is(err, ErrServerClosed) {
			err = fmt.Errorf("dabb: register service %s: shut down while publishing: %w", svc.name, err)
		}
		return err
	}
	return nil
}

// publication is what one Serve published: its advertised address, ""
// without a registry, and its background publishing, if any.
type publication struct {
	adv   string
	later *republisher
}

// open publishes the services for a Serve on a listener at addr. By
// default it publishes before it returns. With WithRegistryCheck(false)
// it publishes in the background instead.
func (p *publisher) open(addr net.Addr) (publication, error) {
	if p.reg == nil {
		return publication{}, nil
	}
	adv, err := advertiseAddr(p.advertise, addr)
	if err != nil {
		return publication{}, err
	}
	if p.lazy {
		// Serve at once: the first attempt may take the registry's
		// whole timeout.
		return publication{adv: adv, later: p.republish(adv)}, nil
	}
	if err := p.publishAt(p.ctx, adv); err != nil {
		return publication{}, err
	}
	return publication{adv: adv}, nil
}

// close ends the publishing of a Serve that ended with serveErr, and
// returns what Serve returns. A listener that failed on its own has its
// instances withdrawn: clients stop choosing an address nobody answers at.
func (p *publisher) close(pub publication, serveErr error) error {
	if pub.later != nil {
		pub.later.stop()
	}
	if pub.adv == "" || errors.Is(serveErr, ErrServerClosed) {
		return serveErr
	}
	p.log.Warn("dabb: listener failed; withdrawing its instances", "addr", pub.adv, "err", serveErr)
	return join(serveErr, p.unpublish(pub.adv))
}

// unreachable reports a publishing error that a later attempt may not
// have: the registry could not be reached, or did not answer in time.
func unreachable(err error) bool {
	return errors.Is(err, registry.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)
}

// republisher publishes one address in the background (Serve, when the
// registry could not be reached).
type republisher struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// republish publishes adv in the background: at once, then with jittered
// backoff while the registry cannot be reached. It ends when publishing
// succeeds or fails for another reason, or at stop or the withdrawal.
func (p *publisher) republish(adv string) *republisher {
	ctx, cancel := context.WithCancel(p.ctx)
	r := &republisher{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		delay := republishMin
		for attempt := 1; ; attempt++ {
			err := p.publishAt(ctx, adv)
			switch {
			case err == nil:
				if attempt > 1 {
					p.log.Info("dabb: published once the registry answered", "addr", adv)
				}
				return
			case ctx.Err() != nil:
				return
			case !unreachable(err):
				p.log.Error("dabb: publishing failed; serving unpublished", "addr", adv, "err", err)
				return
			case attempt == 1:
				p.log.Warn("dabb: registry unreachable; serving, and publishing in the background", "addr", adv, "err", err)
			}
			t := time.NewTimer(delay/2 + rand.N(delay/2+1))
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			delay = min(2*delay, republishMax)
		}
	}()
	return r
}

// stop ends the background publishing and waits for it.
func (r *republisher) stop() {
	r.cancel()
	<-r.done
}

// publishAt registers every service at adv, within ctx: p.ctx or one
// derived from it. A failure, or a withdrawal that began meanwhile,
// withdraws what this call registered (settle). A Serve that fails or is
// shut down thus leaves nothing behind in the registry.
func (p *publisher) publishAt(ctx context.Context, adv string) error {
	select {
	case p.sem <- struct{}{}:
	case <-ctx.Done():
		return ErrServerClosed
	}
	defer func() { <-p.sem }()
	if ctx.Err() != nil {
		return ErrServerClosed
	}
	var mine []registry.Instance
	var err error
	for _, svc := range p.services() {
		if svc.builtin {
			continue
		}
		var in []registry.Instance
		in, err = p.register(ctx, svc, []string{adv})
		mine = append(mine, in...)
		if err != nil {
			break
		}
	}
	if err := p.settle(mine, err); err != nil {
		return err
	}
	p.serving = append(p.serving, adv)
	p.nserving.Store(int32(len(p.serving)))
	return nil
}

// settle ends a publishing attempt, with sem held. mine are the instances
// it registered, err its error. If it succeeded and the withdrawal has not
// begun, mine joins the published instances. Otherwise settle withdraws
// mine itself, each bounded by the registry timeout. Once the withdrawal
// began it returns ErrServerClosed, joined with any error withdrawing mine.
func (p *publisher) settle(mine []registry.Instance, err error) error {
	p.mu.Lock()
	// The withdrawal ends ctx before it takes published under mu.
	closing := p.ctx.Err() != nil
	if err == nil && !closing {
		p.published = append(p.published, mine...)
		p.mu.Unlock()
		return nil
	}
	p.mu.Unlock()
	// A withdrawal that began meanwhile took the published instances
	// without mine, or gave up waiting for this attempt: nobody else
	// would withdraw them.
	derr := p.deregister(context.Background(), mine)
	if closing {
		return join(ErrServerClosed, derr)
	}
	return join(err, derr)
}

// mergeMetadata returns the server's metadata with the service's over it.
// Either map is returned as is when the other is empty.
func mergeMetadata(server, service map[string]string) map[string]string {
	if len(service) == 0 {
		return server
	}
	if len(server) == 0 {
		return service
	}
	m := make(map[string]string, len(server)+len(service))
	for k, v := range server {
		m[k] = v
	}
	for k, v := range service {
		m[k] = v
	}
	return m
}

// register publishes svc at each of the advertised addresses, with sem
// held, within ctx. It returns the instances registered. After a failure
// it returns, with its error, those to withdraw.
func (p *publisher) register(ctx context.Context, svc *service, addrs []string) ([]registry.Instance, error) {
	var mine []registry.Instance
	for _, adv := range addrs {
		in := registry.Instance{
			Service:  svc.name,
			ID:       adv,
			Addr:     adv,
			Weight:   p.weight,
			Metadata: mergeMetadata(p.metadata, svc.desc.Metadata),
		}
		rctx, cancel := context.WithTimeout(ctx, p.timeout)
		err := p.reg.Register(rctx, in)
		cancel()
		if err != nil {
			if ctx.Err() != nil && errors.Is(err, context.Canceled) {
				// Interrupted: the registry may finish a Register its
				// caller gave up on (ZooKeeper's create may), so withdraw
				// this one too.
				mine = append(mine, in)
			}
			return mine, fmt.Errorf("dabb: publish %s at %s: %w", svc.name, adv, err)
		}
		mine = append(mine, in)
		p.log.Info("dabb: published", "service", svc.name, "addr", adv)
	}
	return mine, nil
}

// unpublish withdraws the instances published at adv, whose Serve ended
// without a Shutdown. If a withdrawal already took them, it does nothing.
func (p *publisher) unpublish(adv string) error {
	p.sem <- struct{}{} // its holders are bounded by the registry timeout
	if i := slices.Index(p.serving, adv); i >= 0 {
		p.serving = slices.Delete(p.serving, i, i+1)
		p.nserving.Store(int32(len(p.serving)))
	}
	var gone []registry.Instance
	// Unless another Serve advertises the same address and still runs.
	if !slices.Contains(p.serving, adv) {
		p.mu.Lock()
		kept := p.published[:0:0]
		for _, in := range p.published {
			if in.Addr == adv {
				gone = append(gone, in)
			} else {
				kept = append(kept, in)
			}
		}
		p.published = kept
		p.mu.Unlock()
	}
	<-p.sem
	return p.deregister(context.Background(), gone)
}

// withdraw takes the published instances out of the registry, once. A
// later caller waits for the first one's withdrawal, within ctx.
func (p *publisher) withdraw(ctx context.Context) error {
	first := false
	p.withdrawOnce.Do(func() { first = true })
	if !first {
		select {
		case <-p.withdrawn:
			return p.withdrawErr
		case <-ctx.Done():
			return fmt.Errorf("dabb: waiting for another Shutdown's withdrawal from the registry: %w", ctx.Err())
		}
	}
	defer close(p.withdrawn)
	// Publishing still under way gives up, and withdraws what it
	// registers from now on itself (settle).
	p.cancel()
	if p.reg == nil {
		return nil
	}
	p.mu.Lock()
	pub := p.published
	p.published = nil
	p.mu.Unlock()
	err := p.deregister(ctx, pub)
	// Wait for that publishing to end, so the server stops once nothing
	// of it is left in the registry.
	select {
	case p.sem <- struct{}{}:
		<-p.sem
	default:
		select {
		case p.sem <- struct{}{}:
			<-p.sem
		case <-ctx.Done():
			err = join(err, fmt.Errorf("dabb: waiting for publishing under way to end and withdraw itself: %w", ctx.Err()))
		}
	}
	p.withdrawErr = err
	return err
}

// deregister withdraws ins, each bounded by ctx and the registry timeout.
func (p *publisher) deregister(ctx context.Context, ins []registry.Instance) error {
	var errs []error
	for _, in := range ins {
		dctx, cancel := context.WithTimeout(ctx, p.timeout)
		err := p.reg.Deregister(dctx, in)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("dabb: withdraw %s at %s: %w", in.Service, in.Addr, err))
		}
	}
	return join(errs...)
}

// listed reports whether serves running Serves have all published every
// service, as far as publishing knows: always, without a registry.
func (p *publisher) listed(serves int32) bool {
	return p.reg == nil || p.nserving.Load() >= serves
}

// advertiseAddr picks the address to publish: the configured one, else the
// listener's with an unspecified host replaced by a real one.
func advertiseAddr(configured string, addr net.Addr) (string, error) {
	if configured != "" {
		return configured, nil
	}
	tcp, ok := addr.(*net.TCPAddr)
	if !ok {
		return addr.String(), nil
	}
	if !tcp.IP.IsUnspecified() {
		return tcp.String(), nil
	}
	ip, err := hostIP()
	if err != nil {
		return "", fmt.Errorf("dabb: find an address to advertise (set WithAdvertiseAddr): %w", err)
	}
	return net.JoinHostPort(ip.String(), fmt.Sprint(tcp.Port)), nil
}

// hostIP returns this machine's first address that is neither loopback
// nor link-local, IPv4 first, or 127.0.0.1 when it has none.
func hostIP() (net.IP, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var v6 net.IP
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok || ipn.IP.IsLoopback() || ipn.IP.IsLinkLocalUnicast() {
			continue
		}
		if ipn.IP.To4() != nil {
			return ipn.IP, nil
		}
		if v6 == nil {
			v6 = ipn.IP
		}
	}
	if v6 != nil {
		return v6, nil
	}
	return net.IPv4(127, 0, 0, 1), nil
}
