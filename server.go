// The Server: its service table, its lifecycle and the dispatch of requests.

package dabb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dabbrpc/dabb/codec"
	"github.com/dabbrpc/dabb/health"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/transport"
)

// ErrServerClosed is returned by Serve after Shutdown or Close.
var ErrServerClosed = transport.ErrServerClosed

// Server serves registered services over dabb's protocol.
//
//	s := dabb.NewServer()
//	inventory.RegisterInventoryServer(s, impl)
//	err := s.ListenAndServe("127.0.0.1:20880")
type Server struct {
	log    *slog.Logger
	ts     *transport.Server
	pub    *publisher
	obs    transport.ServerObserver // WithObserver's; nil for none
	health healthState
	// drainDelay is WithDrainDelay's wait between the withdrawal and the
	// transport's shutdown.
	drainDelay time.Duration

	services atomic.Pointer[map[string]*service] // copied on write, under mu
	mu       sync.Mutex                          // serializes the copies of services

	decoders sync.Pool     // *decoder
	laxJSON  bool          // WithLaxJSON: requests are decoded with Unmarshal
	chain    []Interceptor // WithInterceptor's, first outermost; fixed at NewServer
	calls    sync.Pool     // *chainCall, when chain is not empty
	// unknownCodec marks the serialization ids already logged as not
	// imported: the log says it once per id, the callers every time.
	unknownCodec [32]atomic.Bool
}

// NewServer returns a server configured by opts. It does no I/O. The
// server already serves the built-in health service (health.ServiceName),
// which is never published to the registry.
func NewServer(opts ...Option) *Server {
	o := options{regTimeout: 5 * time.Second}
	for _, opt := range opts {
		opt(&o)
	}
	s := &Server{log: o.logger, drainDelay: o.drainDelay, laxJSON: o.laxJSON}
	if s.log == nil {
		s.log = slog.Default()
	}
	builtins := map[string]*service{health.ServiceName: s.healthService(!o.healthCredentials)}
	s.services.Store(&builtins)
	if !o.noReflection {
		s.installReflection()
	}
	s.pub = newPublisher(&o, s.log, func() map[string]*service { return *s.services.Load() })
	s.decoders.New = func() any { d := &decoder{}; d.fn = d.decode; return d }
	s.chain = o.interceptors
	s.calls.New = func() any { return newChainCall(s) }
	tc := o.transport
	if tc.Logger == nil {
		tc.Logger = s.log
	}
	s.obs = tc.Observer
	if tc.Serializations == nil {
		// A request in a serialization that is no codec of dabb's is
		// answered before its body is parsed: a Dubbo peer's hessian2 body
		// would otherwise be read as dabb's layout. One of dabb's codecs
		// not imported here is answered by ServeRPC, with what to import.
		tc.Serializations = codec.Known
	}
	s.ts = transport.NewServer(s, tc)
	return s
}

// RegisterService adds a service. Generated RegisterXServer functions call
// it. Registering the same service name twice is an error, and so is
// registering the name of a built-in service (health.ServiceName).
//
// A service registered while the server is serving is published at once,
// at every address it serves. Each Register is bounded by the registry
// timeout. If publishing fails, the service is taken back out and the
// error returned. If Shutdown or Close begins meanwhile, what it published
// is withdrawn, the service is taken out and the error wraps
// ErrServerClosed. A service registered once they began is not published.
func (s *Server) RegisterService(desc *ServiceDesc, impl any) error {
	svc, err := newService(desc, impl)
	if err != nil {
		return err
	}
	return s.pub.addService(svc,
		func() error {
			return s.swapServices(func(m map[string]*service) error {
				if old, dup := m[svc.name]; dup {
					if old.builtin {
						return fmt.Errorf("dabb: register service %s: the name is taken by a service every dabb server has built in", svc.name)
					}
					return fmt.Errorf("dabb: register service %s: already registered", svc.name)
				}
				m[svc.name] = svc
				return nil
			})
		},
		func() {
			_ = s.swapServices(func(m map[string]*service) error { delete(m, svc.name); return nil })
		})
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

// Serve accepts connections on l and serves them until Shutdown or Close.
// It then returns ErrServerClosed.
//
// With a registry, Serve first publishes every registered service at the
// advertised address. If that fails, it closes l and returns the error.
// If Shutdown or Close begins while it publishes, it withdraws what it
// registered, each bounded by the registry timeout. It then returns
// ErrServerClosed, joined with the withdrawal's error if that failed. With
// WithRegistryCheck(false) it serves at once and publishes in the
// background instead.
//
// If l fails on its own (closed by someone else), Serve withdraws what it
// published before it returns the accept error. Clients thus stop choosing
// an address nobody answers at. If that withdrawal fails too, Serve
// returns both errors joined.
func (s *Server) Serve(l net.Listener) error {
	s.health.serves.Add(1)
	defer s.health.serves.Add(-1)
	pub, err := s.pub.open(l.Addr())
	if err != nil {
		l.Close()
		return err
	}
	return s.pub.close(pub, s.ts.Serve(l))
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

// ListenAndServe listens on the TCP address addr and calls Serve.
func (s *Server) ListenAndServe(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("dabb: listen: %w", err)
	}
	return s.Serve(l)
}

// Shutdown stops the server gracefully. First the health service answers
// not serving for every service, and Ready fails. Shutdown then withdraws
// the instances from the registry, so clients stop choosing it. After
// WithDrainDelay's wait, if one was given, it stops accepting, tells
// clients it is read-only, lets in-flight calls finish and closes the
// connections. Live holds until Shutdown returns.
//
// Each instance's withdrawal takes at most 5 s, and the whole at most ctx.
// A registry that does not answer thus leaves the rest of ctx to the
// drain. When ctx ends first, Shutdown closes everything and cancels the
// handlers' contexts. It does not wait for handlers that ignore their
// contexts (see transport.ServerConfig.WaitForHandlers). Shutdowns and
// Closes may overlap: the withdrawal runs once, and every caller waits for
// it before it stops the server.
//
// Shutdown returns nil when it withdrew everything and drained in time.
// It returns ctx.Err() itself when ctx ended first, so err ==
// context.DeadlineExceeded holds. It returns the withdrawal's error when
// withdrawing failed. When both happened, as when ctx ends during the
// withdrawal, it returns the two joined, and errors.Is finds each.
func (s *Server) Shutdown(ctx context.Context) error {
	s.beginStop(true)
	werr := s.pub.withdraw(ctx)
	if s.drainDelay > 0 {
		t := time.NewTimer(s.drainDelay)
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	err := join(werr, s.ts.Shutdown(ctx))
	s.health.stopped.Store(true)
	return err
}

// Close stops the server at once. Listeners and connections close, and
// running handlers see their contexts cancelled. Close does not wait for
// them to return, unless transport.ServerConfig.WaitForHandlers is set.
// The health service answers not serving, and Live and Ready fail, from
// the moment Close is called. It first withdraws the published instances,
// within one second, and returns the withdrawal's error, or nil.
func (s *Server) Close() error {
	s.beginStop(false)
	s.health.stopped.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	werr := s.pub.withdraw(ctx)
	return join(werr, s.ts.Close())
}

// ServeRPC implements transport.Handler. It finds the service and method,
// decodes the payload with the codec the header names (strictly, unless
// WithLaxJSON: see codec.Strict), runs the method through the
// interceptors and encodes its result. A call to an unknown service or
// method, or in a serialization not imported, is refused before the
// interceptors.
func (s *Server) ServeRPC(ctx context.Context, req, resp *protocol.Message) {
	id := req.Header.Flags().Serialization()
	c, err := codec.ByID(id)
	if err != nil {
		if !s.unknownCodec[id&31].Swap(true) {
			s.log.Warn("dabb: a call uses a serialization this server did not import; it is refused (40)",
				"service", req.Service, "method", req.Method, "err", err)
		}
		s.rejected(transport.RejectBadRequest)
		setError(resp, protocol.StatusBadRequest, err.Error())
		return
	}
	svc := (*s.services.Load())[req.Service]
	if svc == nil {
		s.rejected(transport.RejectUnimplemented)
		setError(resp, protocol.StatusServiceNotFound, "service "+req.Service+" not found")
		return
	}
	m := svc.methods[req.Method]
	if m == nil {
		s.rejected(transport.RejectUnimplemented)
		setError(resp, protocol.StatusServiceNotFound, "method "+req.Service+"."+req.Method+" not found")
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
	if !s.laxJSON {
		d.strict, _ = c.(codec.Strict)
	}
	out, err := s.handle(ctx, req, svc, m, d.fn)
	d.codec, d.strict, d.data = nil, nil, nil
	s.decoders.Put(d)
	if err != nil {
		setHandlerError(resp, err)
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

// rejected tells the observer, if any, of a request refused before the
// interceptors.
func (s *Server) rejected(reason transport.Rejection) {
	if s.obs != nil {
		s.obs.Rejected(reason)
	}
}

// setHandlerError makes resp the error response of a handler's or an
// interceptor's error. A status the handler chose on purpose passes: a
// local *protocol.Error of 25, 40, 60 or 70. Everything else becomes 70.
// The Code and Details of a local *protocol.Error travel whatever its
// status.
func setHandlerError(resp *protocol.Message, err error) {
	s, pe := handlerStatus(err)
	if pe == nil {
		resp.SetError(&protocol.Error{Status: s, Msg: err.Error()})
		return
	}
	out := protocol.Error{Status: s, Code: pe.Code, Details: pe.Details, Msg: err.Error()}
	if s == pe.Status {
		// The status travels in the header: the text leaves out the
		// "status 60 (service not found)" the error would repeat.
		out.Msg = strings.Replace(out.Msg, pe.Error(), bareText(pe), 1)
	}
	resp.SetError(&out)
}

// handlerStatus is the status the server answers for a handler's error,
// and the local *protocol.Error whose code and details travel with it
// (nil for none). A local error of 25, 40, 60 or 70 keeps its status; any
// other error is 70.
func handlerStatus(err error) (protocol.Status, *protocol.Error) {
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Remote {
		// An error the handler got from a call of its own is Remote: the
		// caller must not mistake a downstream timeout for one of its
		// own. Nor a downstream's code: its "unauthenticated" speaks of
		// this server's credentials, not the caller's.
		return protocol.StatusServiceError, nil
	}
	switch pe.Status {
	case protocol.StatusSerializationError, protocol.StatusBadRequest,
		protocol.StatusServiceNotFound, protocol.StatusServiceError:
		return pe.Status, pe
	}
	return protocol.StatusServiceError, pe
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

// setError makes resp the server's own error response: status s saying
// msg. The server's own 60 says it has no such service or method, so it
// carries protocol.CodeUnimplemented. A handler's 60 goes through
// setHandlerError instead and carries the handler's code.
func setError(resp *protocol.Message, s protocol.Status, msg string) {
	e := protocol.Error{Status: s, Msg: msg}
	if s == protocol.StatusServiceNotFound {
		e.Code = protocol.CodeUnimplemented
	}
	resp.SetError(&e)
}

// decoder is pooled with its bound method value, so decoding a request
// allocates no closure.
type decoder struct {
	codec  codec.Codec
	strict codec.Strict // codec's, unless the server is lax; nil for none
	data   []byte
	method string
	fn     func(any) error
}

func (d *decoder) decode(v any) error {
	var err error
	if d.strict != nil {
		err = d.strict.UnmarshalStrict(d.data, v)
	} else {
		err = d.codec.Unmarshal(d.data, v)
	}
	if err != nil {
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
// is the request's own. It stays valid on a context kept after the call.
// Read it; do not modify it.
func Attachments(ctx context.Context) map[string]string {
	attachments, _ := requestMetadata(ctx)
	return attachments
}

// IdempotencyKey returns the idempotency key of the request being served,
// or "" when the caller sent none. Every attempt of one client call
// carries the same key, so a handler can use it to recognise a retry. A
// context kept after the call still answers with its own request's key.
func IdempotencyKey(ctx context.Context) string {
	_, key := requestMetadata(ctx)
	return key
}
