package proxy_test

import (
	"bufio"
	"context"
	"errors"
	"log/slog"
	"maps"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/balancer"
	pb "github.com/dabbrpc/dabb/internal/inventory/inventorypb"
	"github.com/dabbrpc/dabb/internal/wait"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
	"github.com/dabbrpc/dabb/transport"
	"go.uber.org/goleak"
	gproto "google.golang.org/protobuf/proto"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	testTimeout = 10 * time.Second
	service     = "test.Svc"
)

var quiet = slog.New(slog.DiscardHandler)

// seen is what a test server recorded of the last request it ran.
type seen struct {
	mu          sync.Mutex
	budget      time.Duration
	attachments map[string]string
	runs        atomic.Int64
	healed      atomic.Bool // a failing server answers OK from now on
	cancelled   atomic.Int64
	// cancels, if not nil, gets a value for each cancelled request
	// (waitCancel); give it room for all of them.
	cancels chan struct{}
}

// serve starts a transport server whose handler records the request and
// answers with status (OK when zero) and a StockReply naming addr.
func serve(t *testing.T, s *seen, status protocol.Status, cfg transport.ServerConfig) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	block := make(chan struct{})
	cfg.Logger = quiet
	srv := transport.NewServer(transport.HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
		s.runs.Add(1)
		s.mu.Lock()
		s.budget = req.Timeout
		// What travelled: the map, plus the key a read puts in its field.
		s.attachments = maps.Clone(req.Attachments)
		if req.IdempotencyKey != "" {
			if s.attachments == nil {
				s.attachments = map[string]string{}
			}
			s.attachments[protocol.AttachIdempotencyKey] = req.IdempotencyKey
		}
		s.mu.Unlock()
		if status == protocol.StatusServerThreadpoolExhausted {
			<-block // hold the only slot so the next request is rejected
		}
		if status == waitCancel {
			<-ctx.Done()
			s.cancelled.Add(1)
			if s.cancels != nil {
				s.cancels <- struct{}{}
			}
			return
		}
		if status == stall {
			select {
			case <-block:
			case <-time.After(2 * time.Second):
			}
		}
		if status == garbage {
			resp.Payload = append(resp.Payload[:0], 0xff, 0xff, 0xff)
			return
		}
		if status != 0 && status != protocol.StatusServerThreadpoolExhausted && !s.healed.Load() {
			resp.Header.SetStatus(status)
			resp.Payload = append(resp.Payload[:0], "test failure"...)
			return
		}
		b, _ := gproto.Marshal(&pb.StockReply{Sku: addr})
		resp.Payload = append(resp.Payload[:0], b...)
	}), cfg)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	t.Cleanup(func() {
		close(block)
		srv.Close()
		<-done
	})
	return addr
}

func client(t *testing.T, addrs []string, opts ...proxy.Option) *proxy.Client {
	t.Helper()
	var ins []registry.Instance
	for _, a := range addrs {
		ins = append(ins, registry.Instance{Service: service, ID: a, Addr: a})
	}
	c := newClient(t, static.New(ins...), append([]proxy.Option{proxy.WithLogger(quiet)}, opts...)...)
	t.Cleanup(func() { c.Close() })
	return c
}

// newClient is proxy.NewClient, failing t on an error.
func newClient(t *testing.T, r registry.Registry, opts ...proxy.Option) *proxy.Client {
	t.Helper()
	c, err := proxy.NewClient(r, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func invoke(ctx context.Context, c proxy.Caller, opts ...proxy.CallOption) (string, error) {
	resp := new(pb.StockReply)
	err := c.Invoke(ctx, service, "M", &pb.StockRequest{Sku: "x"}, resp, opts...)
	return resp.GetSku(), err
}

// deadAddr returns a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// Pseudo statuses for serve: garbage answers OK with bytes that are not
// protobuf; stall answers OK after two seconds.
const (
	garbage    protocol.Status = 1
	stall      protocol.Status = 2
	waitCancel protocol.Status = 3 // answers nothing until the caller gives up
)

// callRecorder is a middleware that keeps what the Call says of its
// attempt once next returns, as a middleware that blames an instance reads
// it.
type callRecorder struct {
	mu      sync.Mutex
	addr    string
	attempt int
}

func (r *callRecorder) middleware(next proxy.Invoker) proxy.Invoker {
	return func(ctx context.Context, call *proxy.Call) error {
		err := next(ctx, call)
		r.mu.Lock()
		r.addr, r.attempt = call.Addr, call.Attempt
		r.mu.Unlock()
		return err
	}
}

func (r *callRecorder) last() (string, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.addr, r.attempt
}

// attemptLog is an Observer that records the instance of every attempt,
// in the order the attempts end.
type attemptLog struct {
	mu    sync.Mutex
	addrs []string
}

func (o *attemptLog) Attempted(_, _, addr string, _ protocol.Status, _ time.Duration) {
	o.mu.Lock()
	o.addrs = append(o.addrs, addr)
	o.mu.Unlock()
}

func (o *attemptLog) Retried(string, string, protocol.Status) {}

func (o *attemptLog) BreakerChanged(string, string, string) {}

// take returns the attempts recorded since the last take.
func (o *attemptLog) take() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	got := o.addrs
	o.addrs = nil
	return got
}

// drainingServer accepts connections, sends each the read-only event and
// answers every request "server shutting down" (100), as a dabb server
// does once its Shutdown began.
func drainingServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			nc, err := l.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer nc.Close()
				if _, err := nc.Write(protocol.AppendReadOnly(nil, 1)); err != nil {
					return
				}
				rd := protocol.NewReader(bufio.NewReader(nc), 0)
				for {
					var req protocol.Message
					if err := rd.Read(&req); err != nil {
						return
					}
					var resp protocol.Message
					resp.Header.Init(protocol.MakeFlags(0, req.Header.Flags().Serialization()), protocol.StatusServerThreadpoolExhausted, req.Header.ID())
					resp.Payload = []byte("server shutting down")
					if _, err := nc.Write(protocol.AppendMessage(nil, &resp)); err != nil {
						return
					}
				}
			})
		}
	})
	return l.Addr().String()
}

func TestTimeoutPrecedence(t *testing.T) {
	s := &seen{}
	addr := serve(t, s, 0, transport.ServerConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	tests := []struct {
		name    string
		opts    []proxy.Option
		static  []proxy.CallOption
		perCall []proxy.CallOption
		ctxDl   time.Duration
		want    time.Duration
	}{
		{name: "default", want: proxy.DefaultTimeout},
		{name: "client default", opts: []proxy.Option{proxy.WithTimeout(700 * time.Millisecond)}, want: 700 * time.Millisecond},
		{name: "interface directive", static: []proxy.CallOption{proxy.Timeout(200 * time.Millisecond)}, want: 200 * time.Millisecond},
		{name: "client per method beats directive",
			opts:   []proxy.Option{proxy.WithMethodTimeout(service, "M", 300*time.Millisecond)},
			static: []proxy.CallOption{proxy.Timeout(200 * time.Millisecond)}, want: 300 * time.Millisecond},
		{name: "per call beats all",
			opts:    []proxy.Option{proxy.WithMethodTimeout(service, "M", 300*time.Millisecond)},
			static:  []proxy.CallOption{proxy.Timeout(200 * time.Millisecond)},
			perCall: []proxy.CallOption{proxy.Timeout(400 * time.Millisecond)}, want: 400 * time.Millisecond},
		{name: "earlier ctx deadline wins", ctxDl: 150 * time.Millisecond, want: 150 * time.Millisecond},
		{name: "later ctx deadline loses", ctxDl: 5 * time.Second, static: []proxy.CallOption{proxy.Timeout(250 * time.Millisecond)}, want: 250 * time.Millisecond},
		{name: "zero or negative timeouts are ignored",
			opts: []proxy.Option{proxy.WithTimeout(700 * time.Millisecond), proxy.WithTimeout(0),
				proxy.WithMethodTimeout(service, "M", 300*time.Millisecond), proxy.WithMethodTimeout(service, "M", -1)},
			static:  []proxy.CallOption{proxy.Timeout(0)},
			perCall: []proxy.CallOption{proxy.Timeout(-time.Second)}, want: 300 * time.Millisecond},
		{name: "zero client timeout keeps the default", opts: []proxy.Option{proxy.WithTimeout(0)}, want: proxy.DefaultTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := client(t, []string{addr}, tt.opts...)
			cctx := ctx
			if tt.ctxDl > 0 {
				var cancel context.CancelFunc
				cctx, cancel = context.WithTimeout(ctx, tt.ctxDl)
				defer cancel()
			}
			if tt.perCall != nil {
				cctx = proxy.WithCallOptions(cctx, tt.perCall...)
			}
			if _, err := invoke(cctx, c, tt.static...); err != nil {
				t.Fatal(err)
			}
			s.mu.Lock()
			got := s.budget
			s.mu.Unlock()
			// The budget is measured when sent, rounded up to a whole ms.
			if got > tt.want || got < tt.want-100*time.Millisecond {
				t.Fatalf("server saw a budget of %v, want about %v", got, tt.want)
			}
		})
	}
}

// countingRegistry counts Watch calls.
type countingRegistry struct {
	registry.Registry
	watches atomic.Int64
}

func (r *countingRegistry) Watch(ctx context.Context, service string) (registry.Watcher, error) {
	r.watches.Add(1)
	return r.Registry.Watch(ctx, service)
}

func TestOneWatchPerService(t *testing.T) {
	s := &seen{}
	addr := serve(t, s, 0, transport.ServerConfig{})
	reg := &countingRegistry{Registry: static.New(registry.Instance{Service: service, ID: addr, Addr: addr})}
	c := newClient(t, reg, proxy.WithLogger(quiet))
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 250 {
				if _, err := invoke(ctx, c); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if n := reg.watches.Load(); n != 1 {
		t.Fatalf("2000 calls started %d watches, want 1", n)
	}
}

// hangingRegistry is a registry whose Watch never answers, as one that is
// unreachable behind a silent network.
type hangingRegistry struct{ registry.Registry }

func (hangingRegistry) Watch(ctx context.Context, _ string) (registry.Watcher, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func TestFirstLookupWithinBudget(t *testing.T) {
	c := newClient(t, hangingRegistry{static.New()}, proxy.WithLogger(quiet),
		proxy.WithCache(registry.CacheConfig{InitialTimeout: 5 * time.Second, Logger: quiet}))
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	start := time.Now()
	_, err := invoke(ctx, c, proxy.Timeout(100*time.Millisecond))
	if !errors.Is(err, proxy.ErrTimeout) || !errors.Is(err, proxy.ErrNotSent) {
		t.Fatalf("got %v, want a timeout, not sent", err)
	}
	if el := time.Since(start); el > time.Second {
		t.Fatalf("the first call waited %v for the registry with a 100ms budget", el)
	}
}

// TestCanceledWhileResolving: a caller that cancels its context while the
// client waits for the service's first lookup gets ErrCanceled, not
// ErrUnavailable.
func TestCanceledWhileResolving(t *testing.T) {
	c := newClient(t, hangingRegistry{static.New()}, proxy.WithLogger(quiet),
		proxy.WithCache(registry.CacheConfig{InitialTimeout: 5 * time.Second, Logger: quiet}))
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	defer cancel()
	_, err := invoke(ctx, c, proxy.Timeout(5*time.Second))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want the caller's cancellation", err)
	}
	if !errors.Is(err, proxy.ErrCanceled) || errors.Is(err, proxy.ErrUnavailable) {
		t.Errorf("a call whose context was cancelled while resolving: %v; ErrCanceled = %v, ErrUnavailable = %v; want ErrCanceled only",
			err, errors.Is(err, proxy.ErrCanceled), errors.Is(err, proxy.ErrUnavailable))
	}
}

// TestInvalidServiceIsBadRequest: a service name the registry refuses
// fails the call as a bad request, not as an outage that retrying could
// cure.
func TestInvalidServiceIsBadRequest(t *testing.T) {
	c := client(t, []string{deadAddr(t)})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	err := c.Invoke(ctx, "bad/name", "M", &pb.StockRequest{Sku: "x"}, new(pb.StockReply))
	if !errors.Is(err, proxy.ErrBadRequest) || errors.Is(err, proxy.ErrUnavailable) || !errors.Is(err, registry.ErrInvalid) {
		t.Errorf("call to an invalid service name = %v; want ErrBadRequest wrapping registry.ErrInvalid, not ErrUnavailable", err)
	}
}

// outageRegistry lists its instances once, then fails every watch as a
// registry that went down does.
type outageRegistry struct {
	registry.Registry
	down chan struct{}
}

func (r *outageRegistry) Watch(ctx context.Context, service string) (registry.Watcher, error) {
	w, err := r.Registry.Watch(ctx, service)
	if err != nil {
		return nil, err
	}
	return &outageWatcher{Watcher: w, down: r.down}, nil
}

type outageWatcher struct {
	registry.Watcher
	down   chan struct{}
	listed bool
}

func (w *outageWatcher) Next(ctx context.Context) ([]registry.Instance, error) {
	if !w.listed {
		w.listed = true
		return w.Watcher.Next(ctx)
	}
	select {
	case <-w.down:
		return nil, errors.New("connection refused")
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TestClientSaysStale: a client whose registry went down keeps its
// instances and says they are stale.
func TestClientSaysStale(t *testing.T) {
	addr := deadAddr(t)
	reg := &outageRegistry{Registry: static.New(registry.Instance{Service: service, ID: addr, Addr: addr}), down: make(chan struct{})}
	c := newClient(t, reg, proxy.WithLogger(quiet))
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if ins, err := c.Instances(ctx, service); err != nil || len(ins) != 1 {
		t.Fatalf("Instances = %v, %v; want the one instance", ins, err)
	}
	if c.Stale(service) || c.Suspect(service) {
		t.Fatalf("fresh instances: Stale %v, Suspect %v; want neither", c.Stale(service), c.Suspect(service))
	}
	close(reg.down)
	wait.Until(t, testTimeout, time.Millisecond, "the client to say its instances are stale", func() bool {
		return c.Stale(service)
	})
	if ins, err := c.Instances(ctx, service); err != nil || len(ins) != 1 {
		t.Errorf("Instances with the registry down = %v, %v; want the one instance kept", ins, err)
	}
	if c.Stale("other.Service") {
		t.Error("a service never looked up is stale")
	}
}

// TestRestartedServerFoundAgain: after a graceful shutdown, a client with
// a static list calls a server restarted at the same address again (the
// read-only mark of the old one does not keep the address out forever).
func TestRestartedServerFoundAgain(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	srv, done := serveOK(l)
	c := client(t, []string{addr})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if _, err := invoke(ctx, c); err != nil {
		t.Fatalf("call before the restart: %v", err)
	}
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	<-done
	// Meanwhile the error says why the only instance is left out.
	if _, err := invoke(ctx, c); err == nil || !strings.Contains(err.Error(), "its only known instance is shutting down") {
		t.Errorf("call while the only instance is shut down = %v; want it to say the instance is shutting down", err)
	}

	restartAndCall(t, c, addr)
}

// serveOK serves l with a transport server answering every call with a
// StockReply naming l's address; the channel gets Serve's result.
func serveOK(l net.Listener) (*transport.Server, <-chan error) {
	addr := l.Addr().String()
	srv := transport.NewServer(transport.HandlerFunc(func(_ context.Context, _, resp *protocol.Message) {
		b, _ := gproto.Marshal(&pb.StockReply{Sku: addr})
		resp.Payload = append(resp.Payload[:0], b...)
	}), transport.ServerConfig{Logger: quiet})
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	return srv, done
}

// restartAndCall serves addr again, after its server went away, and calls
// through c until a call succeeds, within 5 s.
func restartAndCall(t *testing.T, c *proxy.Client, addr string) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("cannot listen again on %s: %v", addr, err)
	}
	srv, done := serveOK(l)
	defer func() { srv.Close(); <-done }()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := invoke(ctx, c)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server restarted at %s is not called within 5 s (breaker %s): %v", addr, c.BreakerState(addr), err)
		}
		time.Sleep(10 * time.Millisecond) // no event says the address is back: poll the calls
	}
}

// TestClientRegistry: Registry returns the registry NewClient was given.
func TestClientRegistry(t *testing.T) {
	reg := static.New()
	c := newClient(t, reg, proxy.WithLogger(quiet))
	if got := c.Registry(); got != registry.Registry(reg) {
		t.Errorf("Registry() = %v; want the registry given to NewClient", got)
	}
}

// TestDialBackoffLeavesInstanceOut: while a dead address's dial backoff
// runs, the balancer leaves it out and calls go to the live instance, not
// to an attempt refused at once that needs a retry. The retry budget is
// zero and round robin would pick the dead address every other call: none
// of 100 calls may fail with the backoff's refusal. A call whose attempt
// dialed the dead address (once per backoff period) fails, having no
// retry left; the breaker is off so that only the backoff leaves it out.
func TestDialBackoffLeavesInstanceOut(t *testing.T) {
	live := serve(t, &seen{}, 0, transport.ServerConfig{})
	dead := deadAddr(t)
	c := client(t, []string{dead, live}, proxy.WithBalancer(balancer.RoundRobin),
		proxy.WithBreaker(proxy.BreakerConfig{Disabled: true}),
		proxy.WithRetry(proxy.RetryPolicy{BudgetRatio: 1e-9, BudgetFloor: -1}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	dialed, refused := 0, 0
	for range 100 {
		_, err := invoke(ctx, c, proxy.Idempotent())
		switch {
		case err == nil:
		case errors.Is(err, transport.ErrDialBackoff):
			refused++
			if refused == 1 {
				t.Errorf("a call failed with the dial backoff's refusal: %v", err)
			}
		case errors.Is(err, proxy.ErrNotSent) && ctx.Err() == nil:
			dialed++ // the dead address was dialed: connection refused
		default:
			t.Fatalf("call = %v", err)
		}
	}
	if refused > 0 {
		t.Errorf("%d of 100 calls failed with the dial backoff's refusal; want none", refused)
	}
	if dialed == 0 {
		t.Fatal("no call dialed the dead address: the test proves nothing")
	}
	t.Logf("%d of 100 calls dialed the dead address and failed", dialed)
}
