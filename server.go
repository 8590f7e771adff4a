package dabb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dabbrpc/dabb/codec"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/transport"
)

// ErrServerClosed is returned by Serve after Shutdown or Close.
var ErrServerClosed = transport.ErrServerClosed

// Option configures a Server.
type Option func(*options)

type options struct {
	transport  transport.ServerConfig
	registry   registry.Registry
	advertise  string
	weight     int
	metadata   map[string]string
	regTimeout time.Duration
	lazy       bool // WithRegistryCheck(false)
}

// WithMaxConcurrent bounds the requests running at once; a request over the
// bound is answered at once with status 100 (overloaded), never queued.
// Default 10000.
func WithMaxConcurrent(n int) Option { return func(o *options) { o.transport.MaxConcurrent = n } }

// WithMaxBody limits the body of an incoming request (default 8 MiB). A
// larger request is dropped and answered with 40, and the connection stays;
// only a header claiming more than 64 MiB closes it. A handler's answer
// over the limit is replaced by status 50 (bad response) saying so; raise
// it with the clients' transport.Config.MaxBody to send larger answers.
func WithMaxBody(n uint32) Option { return func(o *options) { o.transport.MaxBody = n } }

// WithHeartbeat sets the idle interval after which a connection is probed
// (default 60 s); a peer silent for three intervals is disconnected.
func WithHeartbeat(d time.Duration) Option {
	return func(o *options) { o.transport.HeartbeatInterval = d }
}

// WithWaitForHandlers makes Close, and a Shutdown whose ctx ends first,
// wait for running handlers to return after cancelling their contexts.
// By default they return once the connections are closed (as net/http's
// Shutdown and gRPC's Stop do), so a handler that ignores its context
// cannot hold the process up; it runs on, and its answer goes nowhere.
func WithWaitForHandlers(wait bool) Option {
	return func(o *options) { o.transport.WaitForHandlers = wait }
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.transport.Logger = l } }

// WithRegistry publishes every registered service to r once the server
// listens, and withdraws it when the server shuts down, before draining.
func WithRegistry(r registry.Registry) Option { return func(o *options) { o.registry = r } }

// WithAdvertiseAddr sets the host:port published to the registry. By default
// it is the listener's address, with an unspecified host (0.0.0.0, ::)
// replaced by this machine's first non-loopback, non-link-local address
// (IPv4 preferred), or 127.0.0.1 when it has none: set the address then.
func WithAdvertiseAddr(addr string) Option { return func(o *options) { o.advertise = addr } }

// WithRegistryCheck sets what Serve does when the registry cannot be
// reached (an error wrapping registry.ErrUnavailable, or the registry
// timeout) as it publishes, like Dubbo's registry check. With true, the
// default, Serve publishes before it accepts, and fails if it cannot: a
// server nobody can find says so at start. With false, Serve accepts at
// once and publishes in the background, retrying with backoff while the
// registry cannot be reached, until it succeeds or the server stops, so a
// server restarted during a registry outage serves whoever knows its
// address and appears once the registry is back. Other publishing errors
// (the registry refuses the instance) are logged, and the server serves
// unpublished.
func WithRegistryCheck(check bool) Option { return func(o *options) { o.lazy = !check } }

// WithInstance sets the weight and metadata published with each instance.
func WithInstance(weight int, metadata map[string]string) Option {
	return func(o *options) { o.weight, o.metadata = weight, metadata }
}

// Server serves registered services over dabb's protocol.
//
//	s := dabb.NewServer()
//	inventory.RegisterInventoryServer(s, impl)
//	err := s.ListenAndServe("127.0.0.1:20880")
type Server struct {
	opts     options
	log      *slog.Logger
	ts       *transport.Server
	services atomic.Pointer[map[string]*service] // copy on write

	mu sync.Mutex // serializes RegisterService's copy-on-write of services

	// Registry I/O. pubSem (capacity 1) serializes publishing (Serve,
	// RegisterService, a failed listener's unpublish), and waiting for it
	// honours contexts. pubCtx ends when the withdrawal begins, so a Serve
	// or RegisterService still publishing gives up; what it registers
	// after that it withdraws itself (settle). pubMu guards published,
	// which nothing joins once pubCtx ended.
	pubSem    chan struct{}
	pubCtx    context.Context
	pubCancel context.CancelFunc
	serving   []string // advertised addresses of running Serves; guarded by pubSem
	pubMu     sync.Mutex
	published []registry.Instance // guarded by pubMu
	// The withdrawal runs once, in the first Shutdown or Close; later
	// ones wait for it (within their own context) and report its error.
	withdrawOnce sync.Once
	withdrawn    chan struct{} // closed when the withdrawal ended
	withdrawErr  error         // written before withdrawn closes

	decoders sync.Pool // *decoder
	// unknownCodec marks the serialization ids already logged as not
	// imported: the log says it once per id, the callers every time.
	unknownCodec [32]atomic.Bool
}

// NewServer returns a server; it does no I/O.
func NewServer(opts ...Option) *Server {
	s := &Server{}
	s.opts.regTimeout = 5 * time.Second
	for _, o := range opts {
		o(&s.opts)
	}
	s.log = s.opts.transport.Logger
	if s.log == nil {
		s.log = slog.Default()
	}
	empty := map[string]*service{}
	s.services.Store(&empty)
	s.pubSem = make(chan struct{}, 1)
	s.pubCtx, s.pubCancel = context.WithCancel(context.Background())
	s.withdrawn = make(chan struct{})
	s.decoders.New = func() any { d := &decoder{}; d.fn = d.decode; return d }
	s.ts = transport.NewServer(s, s.opts.transport)
	return s
}

// RegisterService adds a service; generated RegisterXServer functions call
// it. Registering the same service name twice is an error. A service
// registered while the server is serving is published at once at every
// address it serves (each Register bounded by the registry timeout); if
// that fails, the service is taken back out and the error returned. If
// Shutdown or Close begins meanwhile, what it published is withdrawn, the
// service is taken out and the error wraps ErrServerClosed; a service
// registered once they began is not published.
func (s *Server) RegisterService(desc *ServiceDesc, impl any) error {
	svc, err := newService(desc, impl)
	if err != nil {
		return err
	}
	// Holding pubSem while the service joins the table means a Serve
	// publishing at the same moment either sees it or is already in
	// serving: the service is published exactly once per address.
	locked := false
	if s.opts.registry != nil {
		select {
		case s.pubSem <- struct{}{}:
			locked = true
			defer func() { <-s.pubSem }()
		case <-s.pubCtx.Done(): // shutting down: nothing more is published
		}
	}
	if err := s.swapServices(func(m map[string]*service) error {
		if _, dup := m[svc.name]; dup {
			return fmt.Errorf("dabb: register service %s: already registered", svc.name)
		}
		m[svc.name] = svc
		return nil
	}); err != nil {
		return err
	}
	if !locked || s.pubCtx.Err() != nil || len(s.serving) == 0 {
		return nil
	}
	mine, err := s.register(s.pubCtx, svc, s.serving)
	if err := s.settle(mine, err); err != nil {
		_ = s.swapServices(func(m map[string]*service) error { delete(m, svc.name); return nil })
		if errors.Is(err, ErrServerClosed) {
			err = fmt.Errorf("dabb: register service %s: shut down while publishing: %w", svc.name, err)
		}
		return err
	}
	return nil
}

// swapServices replaces the service table with a copy changed by edit.
func (s *Server) swapServices(edit func(map[string]*service) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := *s.services.Load()
	next := make(map[string]*service, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	if err := edit(next); err != nil {
		return err
	}
	s.services.Store(&next)
	return nil
}

// Serve accepts connections on l and serves them until Shutdown or Close,
// when it returns ErrServerClosed. With a registry, it first publishes every
// registered service at the advertised address; if that fails it closes l
// and returns the error. If Shutdown or Close begins while it publishes, it
// withdraws what it registered (each bounded by the registry timeout) and
// returns ErrServerClosed, joined with the withdrawal's error if that
// failed. With WithRegistryCheck(false) it serves at once
// and publishes in the background instead. If l fails on its
// own (closed by someone else), Serve withdraws what it published before
// it returns the accept error, so clients stop choosing an address nobody
// answers at; if that withdrawal fails too, it returns both joined.
func (s *Server) Serve(l net.Listener) error {
	adv, err := s.advertised(l.Addr())
	if err != nil {
		l.Close()
		return err
	}
	var later *republisher
	switch {
	case adv == "":
	case s.opts.lazy:
		// Serve at once: the first attempt may take the registry's
		// whole timeout.
		later = s.republish(adv)
	default:
		if err := s.publishAt(s.pubCtx, adv); err != nil {
			l.Close()
			return err
		}
	}
	err = s.ts.Serve(l)
	if later != nil {
		later.stop()
	}
	if adv != "" && !errors.Is(err, ErrServerClosed) {
		s.log.Warn("dabb: listener failed; withdrawing its instances", "addr", adv, "err", err)
		err = join(err, s.unpublish(adv))
	}
	return err
}

// join is errors.Join, except that a single non-nil error is returned as
// itself, not wrapped: a caller comparing it (err == ctx.Err()) sees it.
func join(errs ...error) error {
	var one error
	for _, err := range errs {
		if err != nil {
			if one != nil {
				return errors.Join(errs...)
			}
			one = err
		}
	}
	return one
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

// Backoff between background publishing attempts.
const (
	republishMin = 100 * time.Millisecond
	republishMax = 30 * time.Second
)

// republish publishes adv in the background (WithRegistryCheck(false)): at
// once, then with jittered backoff while the registry cannot be reached,
// until it succeeds, fails for another reason, or stop (or the withdrawal)
// ends it.
func (s *Server) republish(adv string) *republisher {
	ctx, cancel := context.WithCancel(s.pubCtx)
	r := &republisher{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		delay := republishMin
		for attempt := 1; ; attempt++ {
			err := s.publishAt(ctx, adv)
			switch {
			case err == nil:
				if attempt > 1 {
					s.log.Info("dabb: published once the registry answered", "addr", adv)
				}
				return
			case ctx.Err() != nil:
				return
			case !unreachable(err):
				s.log.Error("dabb: publishing failed; serving unpublished", "addr", adv, "err", err)
				return
			case attempt == 1:
				s.log.Warn("dabb: registry unreachable; serving, and publishing in the background", "addr", adv, "err", err)
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

// ListenAndServe listens on the TCP address addr and calls Serve.
func (s *Server) ListenAndServe(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("dabb: listen: %w", err)
	}
	return s.Serve(l)
}

// Shutdown stops the server gracefully: it withdraws the instances from the
// registry, so clients stop choosing it, then stops accepting, tells clients
// it is read-only, lets in-flight calls finish and closes the connections.
// Each instance's withdrawal takes at most 5 s and the whole at most ctx, so
// a registry that does not answer leaves the rest of ctx to the drain. When
// ctx ends first it closes everything, cancels the handlers' contexts and
// returns without waiting for handlers that ignore their contexts (see
// WithWaitForHandlers). Shutdowns and Closes may overlap: the withdrawal
// runs once and every caller waits for it before it stops the server.
//
// Shutdown returns nil when it withdrew everything and drained in time;
// ctx.Err() itself when ctx ended first (so err ==
// context.DeadlineExceeded holds); the withdrawal's error when withdrawing
// failed; and the two joined when both happened, as when ctx ends during
// the withdrawal (errors.Is finds each).
func (s *Server) Shutdown(ctx context.Context) error {
	werr := s.withdraw(ctx)
	return join(werr, s.ts.Shutdown(ctx))
}

// Close stops the server at once: listeners and connections close and
// running handlers see their contexts cancelled (it does not wait for them
// to return unless WithWaitForHandlers). It withdraws published instances
// first, bounded by a short timeout, and returns the withdrawal's error,
// or nil.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	werr := s.withdraw(ctx)
	return join(werr, s.ts.Close())
}

// advertised returns the address to publish for a listener at addr, ""
// without a registry.
func (s *Server) advertised(addr net.Addr) (string, error) {
	if s.opts.registry == nil {
		return "", nil
	}
	return advertiseAddr(s.opts.advertise, addr)
}

// publishAt registers every service at adv, within ctx (the server's
// publishing context or one derived from it). A failure, or a withdrawal
// that began meanwhile, withdraws what this call registered (settle), so a
// Serve that fails or is shut down leaves nothing behind in the registry.
func (s *Server) publishAt(ctx context.Context, adv string) error {
	select {
	case s.pubSem <- struct{}{}:
	case <-ctx.Done():
		return ErrServerClosed
	}
	defer func() { <-s.pubSem }()
	if ctx.Err() != nil {
		return ErrServerClosed
	}
	var mine []registry.Instance
	var err error
	for _, svc := range *s.services.Load() {
		var in []registry.Instance
		in, err = s.register(ctx, svc, []string{adv})
		mine = append(mine, in...)
		if err != nil {
			break
		}
	}
	if err := s.settle(mine, err); err != nil {
		return err
	}
	s.serving = append(s.serving, adv)
	return nil
}

// settle ends a publishing attempt, with pubSem held: mine are the
// instances it registered (after a failure, with the one whose Register
// was interrupted, which the registry may still complete, as ZooKeeper's
// create may), err its error. If it succeeded and the withdrawal has not
// begun, mine joins the published instances. Otherwise settle withdraws
// mine itself, each bounded by the registry timeout: a withdrawal that
// began meanwhile took the published instances without these, or gave up
// waiting for this attempt, so nobody else would. Once the withdrawal
// began it returns ErrServerClosed, joined with any error withdrawing mine.
func (s *Server) settle(mine []registry.Instance, err error) error {
	s.pubMu.Lock()
	// The withdrawal ends pubCtx before it takes published under pubMu.
	closing := s.pubCtx.Err() != nil
	if err == nil && !closing {
		s.published = append(s.published, mine...)
		s.pubMu.Unlock()
		return nil
	}
	s.pubMu.Unlock()
	derr := s.deregister(context.Background(), mine)
	if closing {
		return join(ErrServerClosed, derr)
	}
	return join(err, derr)
}

// register publishes svc at each of the advertised addresses, with pubSem
// held, within ctx. It returns the instances registered; after a failure,
// with its error, those to withdraw: the ones registered and, if ctx
// interrupted it, the one whose Register was under way.
func (s *Server) register(ctx context.Context, svc *service, addrs []string) ([]registry.Instance, error) {
	var mine []registry.Instance
	for _, adv := range addrs {
		in := registry.Instance{
			Service:  svc.name,
			ID:       adv,
			Addr:     adv,
			Weight:   s.opts.weight,
			Metadata: s.opts.metadata,
		}
		rctx, cancel := context.WithTimeout(ctx, s.opts.regTimeout)
		err := s.opts.registry.Register(rctx, in)
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
		s.log.Info("dabb: published", "service", svc.name, "addr", adv)
	}
	return mine, nil
}

// unpublish withdraws the instances published at adv, whose Serve ended
// without a Shutdown. If a withdrawal already took them, it does nothing.
func (s *Server) unpublish(adv string) error {
	s.pubSem <- struct{}{} // its holders are bounded by the registry timeout
	if i := slices.Index(s.serving, adv); i >= 0 {
		s.serving = slices.Delete(s.serving, i, i+1)
	}
	var gone []registry.Instance
	// Unless another Serve advertises the same address and still runs.
	if !slices.Contains(s.serving, adv) {
		s.pubMu.Lock()
		kept := s.published[:0:0]
		for _, in := range s.published {
			if in.Addr == adv {
				gone = append(gone, in)
			} else {
				kept = append(kept, in)
			}
		}
		s.published = kept
		s.pubMu.Unlock()
	}
	<-s.pubSem
	return s.deregister(context.Background(), gone)
}

// withdraw takes the published instances out of the registry, once; a
// later caller waits for the first one's withdrawal, within ctx.
func (s *Server) withdraw(ctx context.Context) error {
	first := false
	s.withdrawOnce.Do(func() { first = true })
	if !first {
		select {
		case <-s.withdrawn:
			return s.withdrawErr
		case <-ctx.Done():
			return fmt.Errorf("dabb: waiting for another Shutdown's withdrawal from the registry: %w", ctx.Err())
		}
	}
	defer close(s.withdrawn)
	// Publishing still under way gives up, and withdraws what it
	// registers from now on itself (settle).
	s.pubCancel()
	if s.opts.registry == nil {
		return nil
	}
	s.pubMu.Lock()
	pub := s.published
	s.published = nil
	s.pubMu.Unlock()
	err := s.deregister(ctx, pub)
	// Wait for that publishing to end, so the server stops once nothing
	// of it is left in the registry.
	select {
	case s.pubSem <- struct{}{}:
		<-s.pubSem
	default:
		select {
		case s.pubSem <- struct{}{}:
			<-s.pubSem
		case <-ctx.Done():
			err = join(err, fmt.Errorf("dabb: waiting for publishing under way to end and withdraw itself: %w", ctx.Err()))
		}
	}
	s.withdrawErr = err
	return err
}

// deregister withdraws ins, each bounded by ctx and the registry timeout.
func (s *Server) deregister(ctx context.Context, ins []registry.Instance) error {
	var errs []error
	for _, in := range ins {
		dctx, cancel := context.WithTimeout(ctx, s.opts.regTimeout)
		err := s.opts.registry.Deregister(dctx, in)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("dabb: withdraw %s at %s: %w", in.Service, in.Addr, err))
		}
	}
	return join(errs...)
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

// ServeRPC implements transport.Handler: it finds the service and method,
// decodes the payload with the codec named by the header, runs the method
// and encodes its result.
func (s *Server) ServeRPC(ctx context.Context, req, resp *protocol.Message) {
	svc := (*s.services.Load())[req.Service]
	if svc == nil {
		setError(resp, protocol.StatusServiceNotFound, "service "+req.Service+" not found")
		return
	}
	m := svc.methods[req.Method]
	if m == nil {
		setError(resp, protocol.StatusServiceNotFound, "method "+req.Service+"."+req.Method+" not found")
		return
	}
	id := req.Header.Flags().Serialization()
	c, err := codec.ByID(id)
	if err != nil {
		if !s.unknownCodec[id&31].Swap(true) {
			s.log.Warn("dabb: a call uses a serialization this server did not import; it is refused (40)",
				"service", req.Service, "method", req.Method, "err", err)
		}
		setError(resp, protocol.StatusBadRequest, err.Error())
		return
	}
	if (req.Attachments != nil || req.IdempotencyKey != "") && transport.Request(ctx) != req {
		// A one-way request without a budget is served with the server's
		// base context, which does not carry the request: carry what
		// Attachments and IdempotencyKey read here. Every other handler
		// context answers transport.RequestMetadata itself, so reading
		// attachments costs no context per call.
		ctx = context.WithValue(ctx, metadataKey{}, &metadata{req.Attachments, req.IdempotencyKey})
	}
	d := s.decoders.Get().(*decoder)
	d.codec, d.data, d.method = c, req.Payload, m.Name
	out, err := m.Handler(svc.impl, ctx, d.fn)
	d.codec, d.data = nil, nil
	s.decoders.Put(d)
	if err != nil {
		status, msg := handlerStatus(err)
		setError(resp, status, msg)
		return
	}
	payload, err := c.Marshal(resp.Payload[:0], out)
	if err != nil {
		setError(resp, protocol.StatusSerializationError, "encode "+m.Name+" response: "+err.Error())
		return
	}
	resp.Payload = payload
	resp.Header.SetStatus(protocol.StatusOK)
}

// handlerStatus maps a handler's error to a response status. A status the
// handler chose on purpose (a local *protocol.Error of 25, 40, 60 or 70)
// passes; everything else, including errors the handler got from calls it
// made itself, becomes 70: the caller must not mistake a downstream
// timeout for one of its own.
func handlerStatus(err error) (protocol.Status, string) {
	var pe *protocol.Error
	if errors.As(err, &pe) && !pe.Remote {
		switch pe.Status {
		case protocol.StatusSerializationError, protocol.StatusBadRequest,
			protocol.StatusServiceNotFound, protocol.StatusServiceError:
			// The status travels in the header: the text leaves out the
			// "status 60 (service not found)" the error would repeat.
			return pe.Status, strings.Replace(err.Error(), pe.Error(), bareText(pe), 1)
		}
	}
	return protocol.StatusServiceError, err.Error()
}

// bareText is an error's text without its status: its message and cause.
func bareText(pe *protocol.Error) string {
	s := pe.Msg
	if pe.Err != nil && pe.Err.Error() != pe.Msg {
		if s != "" {
			s += ": "
		}
		s += pe.Err.Error()
	}
	if s == "" {
		s = pe.Status.String()
	}
	return s
}

func setError(resp *protocol.Message, s protocol.Status, msg string) {
	resp.Header.SetStatus(s)
	resp.Payload = append(resp.Payload[:0], msg...)
}

// decoder is pooled with its bound method value, so decoding a request
// allocates no closure.
type decoder struct {
	codec  codec.Codec
	data   []byte
	method string
	fn     func(any) error
}

func (d *decoder) decode(v any) error {
	if err := d.codec.Unmarshal(d.data, v); err != nil {
		return &protocol.Error{Status: protocol.StatusBadRequest, Msg: "decode " + d.method + " request", Err: err}
	}
	return nil
}

// metadata is what a one-way request's context carries of it.
type metadata struct {
	attachments    map[string]string
	idempotencyKey string
}

type metadataKey struct{}

// requestMetadata returns the attachments and idempotency key of the
// request ctx was made for.
func requestMetadata(ctx context.Context) (map[string]string, string) {
	if m, ok := ctx.Value(metadataKey{}).(*metadata); ok {
		return m.attachments, m.idempotencyKey
	}
	attachments, key, _ := transport.RequestMetadata(ctx)
	return attachments, key
}

// Attachments returns the attachments the caller sent with the request
// being served (trace ids, auth), or nil. The idempotency key and the
// timeout are not among them: see IdempotencyKey and ctx.Deadline. The map
// is the request's own and stays valid on a context kept after the call;
// read it, do not modify it.
func Attachments(ctx context.Context) map[string]string {
	attachments, _ := requestMetadata(ctx)
	return attachments
}

// IdempotencyKey returns the idempotency key of the request being served:
// every attempt of one client call carries the same key, so a handler can
// use it to recognise a retry. Empty when the caller sent none. A context
// kept after the call still answers with its own request's key.
func IdempotencyKey(ctx context.Context) string {
	_, key := requestMetadata(ctx)
	return key
}
