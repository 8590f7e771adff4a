package proxy_test

import (
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

	"go.uber.org/goleak"

	pb "github.com/dabbrpc/dabb/examples/inventory/inventorypb"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
	"github.com/dabbrpc/dabb/transport"
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

func TestMiddlewareOrderAndAttachments(t *testing.T) {
	s := &seen{}
	addr := serve(t, s, 0, transport.ServerConfig{})
	var order []string
	mw := func(name string) proxy.Middleware {
		return func(next proxy.Invoker) proxy.Invoker {
			return func(ctx context.Context, call *proxy.Call) error {
				order = append(order, name+">"+call.Service+"."+call.Method)
				call.SetAttachment("trace-id", "t-1")
				err := next(ctx, call)
				order = append(order, "<"+name)
				return err
			}
		}
	}
	c := client(t, []string{addr}, proxy.WithMiddleware(mw("a"), mw("b")))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if _, err := invoke(ctx, c, proxy.IdempotencyKey("k-9"), proxy.Attachment("user", "u")); err != nil {
		t.Fatal(err)
	}
	want := "a>test.Svc.M b>test.Svc.M <b <a"
	if got := strings.Join(order, " "); got != want {
		t.Fatalf("middleware order %q, want %q", got, want)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, v := range map[string]string{"trace-id": "t-1", protocol.AttachIdempotencyKey: "k-9", "user": "u"} {
		if s.attachments[k] != v {
			t.Errorf("server saw attachment %s=%q, want %q (all: %v)", k, s.attachments[k], v, s.attachments)
		}
	}
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

func TestFailoverWhenNotSent(t *testing.T) {
	s := &seen{}
	live := serve(t, s, 0, transport.ServerConfig{})
	c := client(t, []string{deadAddr(t), live})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	for i := range 10 {
		got, err := invoke(ctx, c)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if got != live {
			t.Fatalf("call %d answered by %q, want %q", i, got, live)
		}
	}
}

func TestFailoverWhenOverloaded(t *testing.T) {
	busy, free := &seen{}, &seen{}
	busyAddr := serve(t, busy, protocol.StatusServerThreadpoolExhausted, transport.ServerConfig{MaxConcurrent: 1})
	freeAddr := serve(t, free, 0, transport.ServerConfig{})
	c := client(t, []string{busyAddr, freeAddr})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	// Occupy busy's only slot: a call that lands there blocks its handler
	// until cleanup (the caller itself gives up after 100ms).
	for busy.runs.Load() == 0 {
		if ctx.Err() != nil {
			t.Fatal("no call reached the busy server")
		}
		invoke(ctx, c, proxy.Timeout(100*time.Millisecond), proxy.FailFast())
	}
	for i := range 6 {
		got, err := invoke(ctx, c)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if got != freeAddr {
			t.Fatalf("call %d answered by %q, want %q", i, got, freeAddr)
		}
	}
	if n := busy.runs.Load(); n != 1 {
		t.Fatalf("busy server ran %d calls, want only the blocking one", n)
	}
}

func TestNoRetryAfterTheServerActed(t *testing.T) {
	s1, s2 := &seen{}, &seen{}
	a1 := serve(t, s1, protocol.StatusServiceError, transport.ServerConfig{})
	a2 := serve(t, s2, protocol.StatusServiceError, transport.ServerConfig{})
	c := client(t, []string{a1, a2})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	_, err := invoke(ctx, c)
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Status != protocol.StatusServiceError || !pe.Remote {
		t.Fatalf("got %v, want a remote status 70", err)
	}
	if n := s1.runs.Load() + s2.runs.Load(); n != 1 {
		t.Fatalf("the call ran %d times, want once", n)
	}
}

func TestUnavailable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	t.Run("no instance", func(t *testing.T) {
		c := client(t, nil)
		_, err := invoke(ctx, c)
		if !errors.Is(err, proxy.ErrUnavailable) || !errors.Is(err, proxy.ErrNotSent) {
			t.Fatalf("got %v, want unavailable and not sent", err)
		}
		if !strings.Contains(err.Error(), "no instance of test.Svc") {
			t.Fatalf("message %q does not name the service", err)
		}
	})
	t.Run("all dead", func(t *testing.T) {
		c := client(t, []string{deadAddr(t), deadAddr(t)})
		_, err := invoke(ctx, c)
		if !errors.Is(err, proxy.ErrUnavailable) || !errors.Is(err, proxy.ErrNotSent) {
			t.Fatalf("got %v, want unavailable and not sent", err)
		}
	})
	t.Run("closed client", func(t *testing.T) {
		c := client(t, []string{deadAddr(t)})
		c.Close()
		_, err := invoke(ctx, c)
		if !errors.Is(err, proxy.ErrNotSent) || !strings.Contains(err.Error(), "client closed") {
			t.Fatalf("got %v, want client closed", err)
		}
	})
}

// Pseudo statuses for serve: garbage answers OK with bytes that are not
// protobuf; stall answers OK after two seconds.
const (
	garbage    protocol.Status = 1
	stall      protocol.Status = 2
	waitCancel protocol.Status = 3 // answers nothing until the caller gives up
)

func TestBadReply(t *testing.T) {
	s := &seen{}
	addr := serve(t, s, garbage, transport.ServerConfig{})
	c := client(t, []string{addr})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	_, err := invoke(ctx, c)
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Status != protocol.StatusBadResponse || pe.Remote || !errors.Is(err, proxy.ErrBadRequest) {
		t.Fatalf("got %v, want a local status 50", err)
	}
	if !strings.Contains(pe.Msg, "decode test.Svc.M reply") {
		t.Fatalf("message %q does not name the method", pe.Msg)
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

func TestRetryAfterTimeoutOnlyWhenIdempotent(t *testing.T) {
	slow, fast := &seen{}, &seen{}
	slowAddr := serve(t, slow, stall, transport.ServerConfig{})
	fastAddr := serve(t, fast, 0, transport.ServerConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	// Round robin from a random start: the slow one is first in half the
	// calls. Every call must succeed for the idempotent method.
	c := client(t, []string{slowAddr, fastAddr}, proxy.WithBalancer("round_robin"),
		proxy.WithRetry(proxy.RetryPolicy{PerTryTimeout: 100 * time.Millisecond}),
		proxy.WithBreaker(proxy.BreakerConfig{Disabled: true}))
	for i := range 6 {
		got, err := invoke(ctx, c, proxy.Idempotent(), proxy.Timeout(time.Second))
		if err != nil {
			t.Fatalf("idempotent call %d: %v", i, err)
		}
		if got != fastAddr {
			t.Fatalf("idempotent call %d answered by %q", i, got)
		}
	}
	if slow.runs.Load() == 0 {
		t.Fatal("no call tried the slow instance: the test proves nothing")
	}
	// Not idempotent: a timeout after sending is final, and the method ran
	// once.
	before := slow.runs.Load() + fast.runs.Load()
	var timedOut int
	for range 6 {
		_, err := invoke(ctx, c, proxy.Timeout(150*time.Millisecond))
		if err == nil {
			continue
		}
		var pe *protocol.Error
		if !errors.As(err, &pe) || pe.Status != protocol.StatusServerTimeout || pe.Remote {
			t.Fatalf("got %v, want a local 31", err)
		}
		timedOut++
	}
	if timedOut == 0 {
		t.Fatal("no non-idempotent call hit the slow instance")
	}
	if ran := slow.runs.Load() + fast.runs.Load() - before; ran != 6 {
		t.Fatalf("6 non-idempotent calls ran %d times", ran)
	}
}

func TestBreakerOpensAndRecovers(t *testing.T) {
	bad, good := &seen{}, &seen{}
	badAddr := serve(t, bad, protocol.StatusServerError, transport.ServerConfig{})
	goodAddr := serve(t, good, 0, transport.ServerConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	c := client(t, []string{badAddr, goodAddr}, proxy.WithBalancer("round_robin"),
		proxy.WithBreaker(proxy.BreakerConfig{ConsecutiveFailures: 3, OpenTimeout: 300 * time.Millisecond}))
	for c.BreakerState(badAddr) != "open" {
		if ctx.Err() != nil {
			t.Fatal("the breaker of the failing instance never opened")
		}
		invoke(ctx, c, proxy.FailFast())
	}
	if n := bad.runs.Load(); n != 3 {
		t.Fatalf("the breaker opened after %d calls, want 3", n)
	}
	opened := time.Now()
	// While open, calls go to the good instance only.
	for i := range 20 {
		got, err := invoke(ctx, c)
		if err != nil || got != goodAddr {
			t.Fatalf("call %d while open: %q, %v", i, got, err)
		}
	}
	if n := bad.runs.Load(); n != 3 && time.Since(opened) < 300*time.Millisecond {
		t.Fatalf("the open breaker let %d more calls through", n-3)
	}
	if c.BreakerState(goodAddr) != "closed" {
		t.Fatalf("good instance's breaker is %s", c.BreakerState(goodAddr))
	}
	// The instance recovers: after the open timeout a probe goes through
	// and the breaker closes.
	bad.healed.Store(true)
	for c.BreakerState(badAddr) != "closed" {
		if ctx.Err() != nil {
			t.Fatalf("the breaker did not close after recovery (state %s)", c.BreakerState(badAddr))
		}
		if _, err := invoke(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCancelledCallKeepsHalfOpenBreakerUsable: a call whose caller has
// already given up, made while a breaker is half-open, neither takes the
// probe nor leaves the instance out: the next call goes through, succeeds
// and closes the breaker. (A probe whose outcome the breaker excluded once
// counted as taken for good, and a healthy instance was lost until the
// process restarted; TestHalfOpenWithProbeInFlightIsUnavailable covers
// the excluded probe itself.)
func TestCancelledCallKeepsHalfOpenBreakerUsable(t *testing.T) {
	s := &seen{}
	addr := serve(t, s, protocol.StatusServerError, transport.ServerConfig{})
	const openFor = 50 * time.Millisecond
	c := client(t, []string{addr}, proxy.WithBreaker(proxy.BreakerConfig{ConsecutiveFailures: 1, OpenTimeout: openFor}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	// One 80 opens the breaker; then the instance recovers.
	if _, err := invoke(ctx, c, proxy.FailFast()); protocol.StatusOf(err) != protocol.StatusServerError {
		t.Fatalf("first call = %v, want a remote 80", err)
	}
	if st := c.BreakerState(addr); st != "open" {
		t.Fatalf("breaker %s after an 80 with ConsecutiveFailures 1, want open", st)
	}
	s.healed.Store(true)
	// Wait out the open timeout: BreakerState turns the breaker half-open.
	for c.BreakerState(addr) != "half-open" {
		if ctx.Err() != nil {
			t.Fatal("the breaker never turned half-open")
		}
		time.Sleep(5 * time.Millisecond) // a timer inside gobreaker; nothing to await
	}

	// The probe: a caller that has already given up. The call is picked,
	// goes through the breaker and fails as cancelled (excluded).
	gone, stop := context.WithCancel(ctx)
	stop()
	if _, err := invoke(gone, c); !errors.Is(err, proxy.ErrCanceled) {
		t.Fatalf("call with a cancelled context = %v, want ErrCanceled", err)
	}

	if _, err := invoke(ctx, c); err != nil {
		t.Fatalf("a healthy instance is left out after a cancelled call in half-open (breaker %s): %v",
			c.BreakerState(addr), err)
	}
	if st := c.BreakerState(addr); st != "closed" {
		t.Errorf("breaker %s after a successful call, want closed", st)
	}
}

func TestHedgedCall(t *testing.T) {
	slow, fast := &seen{cancels: make(chan struct{}, 16)}, &seen{}
	slowAddr := serve(t, slow, waitCancel, transport.ServerConfig{})
	fastAddr := serve(t, fast, 0, transport.ServerConfig{})
	c := client(t, []string{slowAddr, fastAddr}, proxy.WithBalancer("round_robin"),
		proxy.WithBreaker(proxy.BreakerConfig{Disabled: true}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	for i := range 6 {
		start := time.Now()
		got, err := invoke(ctx, c, proxy.Idempotent(), proxy.Hedge(30*time.Millisecond), proxy.Timeout(2*time.Second))
		if err != nil {
			t.Fatalf("hedged call %d: %v", i, err)
		}
		if got != fastAddr {
			t.Fatalf("hedged call %d answered by %q", i, got)
		}
		if el := time.Since(start); el > time.Second {
			t.Fatalf("hedged call %d took %v", i, el)
		}
	}
	hit := slow.runs.Load()
	if hit == 0 {
		t.Fatal("no attempt went to the slow instance: the test proves nothing")
	}
	// The losing attempts were cancelled on the server (the cancel event).
	for range hit {
		select {
		case <-slow.cancels:
		case <-ctx.Done():
			t.Fatalf("%d of %d losing attempts were cancelled on the server", slow.cancelled.Load(), hit)
		}
	}
	// A method that is not idempotent is never hedged.
	before := slow.runs.Load() + fast.runs.Load()
	for range 4 {
		invoke(ctx, c, proxy.Hedge(10*time.Millisecond), proxy.Timeout(100*time.Millisecond))
	}
	if ran := slow.runs.Load() + fast.runs.Load() - before; ran != 4 {
		t.Fatalf("4 non-idempotent calls with Hedge ran %d attempts", ran)
	}
}

// TestHedgedCallTakesTheFirstAnswer: a hedged call ends with the first
// answer from a server, also when that answer is a failure no retry may
// change (70: the method ran and said no), cancelling the other attempt;
// it used to wait for the hanging attempt and time out with a 31. Round
// robin alternates the first pick, so one call starts on the hanging
// instance and hedges to the one that answers 70.
func TestHedgedCallTakesTheFirstAnswer(t *testing.T) {
	hang, fails := &seen{}, &seen{}
	hangAddr := serve(t, hang, waitCancel, transport.ServerConfig{})
	failAddr := serve(t, fails, protocol.StatusServiceError, transport.ServerConfig{})
	c := client(t, []string{hangAddr, failAddr}, proxy.WithBalancer("round_robin"),
		proxy.WithBreaker(proxy.BreakerConfig{Disabled: true}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	const budget = 600 * time.Millisecond
	for i := range 2 {
		start := time.Now()
		_, err := invoke(ctx, c, proxy.Idempotent(), proxy.Hedge(20*time.Millisecond), proxy.Timeout(budget))
		el := time.Since(start)
		if got := protocol.StatusOf(err); got != protocol.StatusServiceError {
			t.Errorf("hedged call %d = %v after %v; want the remote 70 one attempt got", i, err, el.Round(time.Millisecond))
			continue
		}
		if el > budget/2 {
			t.Errorf("hedged call %d returned its 70 after %v, the budget being %v: it waited for the hanging attempt", i, el, budget)
		}
	}
	if hang.runs.Load() == 0 || fails.runs.Load() < 2 {
		t.Fatalf("the hanging instance ran %d attempts, the failing one %d: the test proves nothing", hang.runs.Load(), fails.runs.Load())
	}
}

// TestNotSentOnlyWhenNoAttemptWasSent: a call whose first attempt was
// sent (it ran on the server and timed out after sending) and whose retry
// then failed before sending (a dead instance) does not say ErrNotSent,
// "provably never left this process": it returns the error of the attempt
// that may have acted.
func TestNotSentOnlyWhenNoAttemptWasSent(t *testing.T) {
	slow := &seen{}
	slowAddr, dead := serve(t, slow, stall, transport.ServerConfig{}), deadAddr(t)
	log := &attemptLog{} // the instance of each attempt
	c := client(t, []string{slowAddr, dead}, proxy.WithBalancer("random"), proxy.WithObserver(log),
		proxy.WithRetry(proxy.RetryPolicy{MaxAttempts: 2, PerTryTimeout: 50 * time.Millisecond}),
		proxy.WithBreaker(proxy.BreakerConfig{Disabled: true}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	// A call that starts on the slow instance (sent, runs there, times out
	// after 50 ms) retries on the dead one; random picks it first in half
	// the calls.
	for i := range 30 {
		_, err := invoke(ctx, c, proxy.Idempotent(), proxy.Timeout(time.Second))
		if err == nil {
			t.Fatalf("call %d succeeded against a stalled and a dead instance", i)
		}
		if got := log.take(); len(got) != 2 || got[0] != slowAddr {
			continue // not the order this test is about
		}
		if errors.Is(err, proxy.ErrNotSent) {
			t.Fatalf("call %d ran on %s (its first attempt timed out after sending), yet its error says ErrNotSent, never left this process: %v",
				i, slowAddr, err)
		}
		return
	}
	t.Fatal("no call started on the slow instance: the test proves nothing")
}

// labelObserver sends the service and method of every attempt it is told
// of.
type labelObserver struct{ attempts chan string }

func (o *labelObserver) Attempted(svc, method, _ string, _ protocol.Status, _ time.Duration) {
	o.attempts <- svc + "." + method
}
func (o *labelObserver) Retried(string, string, protocol.Status) {}
func (o *labelObserver) BreakerChanged(string, string, string)   {}

// TestHedgedLoserOutlivesCall: the losing attempt of a hedged call ends
// after Invoke has returned (and recycled its Call) and after the caller
// took its request back; it must still report the right method and never
// touch what the caller owns (the race detector watches the request).
func TestHedgedLoserOutlivesCall(t *testing.T) {
	slow, fast := &seen{}, &seen{}
	slowAddr := serve(t, slow, waitCancel, transport.ServerConfig{})
	fastAddr := serve(t, fast, 0, transport.ServerConfig{})
	obs := &labelObserver{attempts: make(chan string, 64)}
	c := client(t, []string{slowAddr, fastAddr}, proxy.WithBalancer("round_robin"), proxy.WithObserver(obs),
		proxy.WithBreaker(proxy.BreakerConfig{Disabled: true}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	req := &pb.StockRequest{Sku: "x"}
	for i := range 6 {
		resp := new(pb.StockReply)
		if err := c.Invoke(ctx, service, "M", req, resp, proxy.Idempotent(), proxy.Hedge(20*time.Millisecond),
			proxy.Timeout(2*time.Second)); err != nil {
			t.Fatalf("hedged call %d: %v", i, err)
		}
		req.Sku = strings.Repeat("y", i+1) // the caller's again
		// Another call right away reuses the recycled Call.
		if _, err := invoke(ctx, c, proxy.FailFast(), proxy.Timeout(50*time.Millisecond)); err != nil &&
			!errors.Is(err, context.DeadlineExceeded) && protocol.StatusOf(err) != protocol.StatusServerTimeout {
			t.Fatalf("plain call after hedged call %d: %v", i, err)
		}
	}
	if slow.runs.Load() == 0 {
		t.Fatal("no attempt went to the slow instance: the test proves nothing")
	}
	// Every attempt is reported once it ends, the losers' last.
	for n := slow.runs.Load() + fast.runs.Load(); n > 0; n-- {
		select {
		case got := <-obs.attempts:
			if want := service + ".M"; got != want {
				t.Fatalf("an attempt was reported as %q, want %q", got, want)
			}
		case <-ctx.Done():
			t.Fatalf("%d attempts never reported their end", n)
		}
	}
}

// TestHedgeFollowsRetryPolicy: the backup attempt is a retry. MaxAttempts
// 1 or a spent retry budget stop it, and after an early failure it goes
// only when that failure may be retried, never with FailFast.
func TestHedgeFollowsRetryPolicy(t *testing.T) {
	t.Run("no backup after timeout", func(t *testing.T) {
		for _, p := range []proxy.RetryPolicy{{MaxAttempts: 1}, {BudgetRatio: 1e-9, BudgetFloor: -1}} {
			slow, fast := &seen{}, &seen{}
			slowAddr := serve(t, slow, waitCancel, transport.ServerConfig{})
			fastAddr := serve(t, fast, 0, transport.ServerConfig{})
			c := client(t, []string{slowAddr, fastAddr}, proxy.WithBalancer("round_robin"), proxy.WithRetry(p),
				proxy.WithBreaker(proxy.BreakerConfig{Disabled: true}))
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			failed := 0
			for range 4 {
				if _, err := invoke(ctx, c, proxy.Idempotent(), proxy.Hedge(10*time.Millisecond), proxy.Timeout(100*time.Millisecond)); err != nil {
					failed++
				}
			}
			cancel()
			if slow.runs.Load() != 2 || fast.runs.Load() != 2 || failed != 2 {
				t.Errorf("policy %+v: slow ran %d, fast %d, %d of 4 failed; want 2, 2 (no backup) and 2",
					p, slow.runs.Load(), fast.runs.Load(), failed)
			}
		}
	})
	t.Run("no backup after a failure with FailFast", func(t *testing.T) {
		live := &seen{}
		c := client(t, []string{deadAddr(t), serve(t, live, 0, transport.ServerConfig{})}, proxy.WithBalancer("round_robin"))
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		failed := 0
		for range 4 {
			if _, err := invoke(ctx, c, proxy.Idempotent(), proxy.FailFast(), proxy.Hedge(time.Second)); err != nil {
				failed++
			}
		}
		if failed != 2 || live.runs.Load() != 2 {
			t.Errorf("4 FailFast calls, every other one starting on a dead instance: %d failed, the live one ran %d; want 2 and 2",
				failed, live.runs.Load())
		}
	})
}

// TestHedgeLeavesNothingInFlight: a backup that is not sent (the budget
// is spent by the time the first attempt failed) must not stay counted
// in flight by the balancer, or least_active shuns that instance for good.
func TestHedgeLeavesNothingInFlight(t *testing.T) {
	slow, fast := &seen{}, &seen{}
	slowAddr := serve(t, slow, waitCancel, transport.ServerConfig{})
	fastAddr := serve(t, fast, 0, transport.ServerConfig{})
	c := client(t, []string{slowAddr, fastAddr}, proxy.WithBalancer("least_active"),
		proxy.WithBreaker(proxy.BreakerConfig{Disabled: true}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	// Calls whose first attempt lands on the slow instance time out
	// before the hedge delay, with no budget left for a backup.
	for slow.runs.Load() < 3 {
		if ctx.Err() != nil {
			t.Fatal("no call reached the slow instance")
		}
		invoke(ctx, c, proxy.Idempotent(), proxy.Hedge(time.Second), proxy.Timeout(30*time.Millisecond))
	}
	before := fast.runs.Load()
	for range 20 {
		invoke(ctx, c, proxy.FailFast(), proxy.Timeout(20*time.Millisecond))
	}
	if got := fast.runs.Load() - before; got == 0 {
		t.Fatal("the fast instance got none of 20 calls with nothing in flight: an unsent backup stayed counted in flight")
	}
}

// TestOversizedRequestKeepsBreakersClosed: a request over the server's
// MaxBody is the caller's fault. It fails with status 40 and is not
// retried, and it counts against no instance: other callers keep calling.
func TestOversizedRequestKeepsBreakersClosed(t *testing.T) {
	s1, s2 := &seen{}, &seen{}
	a1 := serve(t, s1, 0, transport.ServerConfig{MaxBody: 1024})
	a2 := serve(t, s2, 0, transport.ServerConfig{MaxBody: 1024})
	c := client(t, []string{a1, a2}, proxy.WithBreaker(proxy.BreakerConfig{ConsecutiveFailures: 3}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	big := &pb.StockRequest{Sku: strings.Repeat("x", 4096)}
	for i := range 4 {
		err := c.Invoke(ctx, service, "M", big, new(pb.StockReply), proxy.Idempotent())
		if got := protocol.StatusOf(err); got != protocol.StatusBadRequest {
			t.Fatalf("oversized call %d: status %d (%v), want 40", i, got, err)
		}
	}
	for _, a := range []string{a1, a2} {
		if st := c.BreakerState(a); st != "closed" {
			t.Errorf("breaker of %s is %s after oversized requests, want closed", a, st)
		}
	}
	if _, err := invoke(ctx, c); err != nil {
		t.Fatalf("a well-formed call after the oversized ones: %v", err)
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
