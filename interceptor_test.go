package dabb_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"regexp"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dabbrpc/dabb"
	pb "github.com/dabbrpc/dabb/internal/inventory/inventorypb"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
)

// trail records the steps of interceptors and handlers, in order.
type trail struct {
	mu    sync.Mutex
	steps []string
}

func (t *trail) add(s string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.steps = append(t.steps, s)
}

func (t *trail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(t.steps, " ")
}

// recording returns an interceptor that adds name> before next and <name after.
func recording(tr *trail, name string) dabb.Interceptor {
	return func(ctx context.Context, info *dabb.CallInfo, next dabb.CallHandler) (any, error) {
		tr.add(name + ">")
		reply, err := next(ctx)
		tr.add("<" + name)
		return reply, err
	}
}

type ctxTag struct{}

func TestInterceptorOrder(t *testing.T) {
	tr := &trail{}
	p := newProbe()
	p.record = func(ctx context.Context) {
		tag, _ := ctx.Value(ctxTag{}).(string)
		tr.add("handler(" + tag + ")")
	}
	var info dabb.CallInfo
	// inspect copies the CallInfo and hands the handler a context of its own.
	inspect := func(ctx context.Context, ci *dabb.CallInfo, next dabb.CallHandler) (any, error) {
		info = *ci
		return next(context.WithValue(ctx, ctxTag{}, "tagged"))
	}
	_, addr := startServer(t, p,
		dabb.WithInterceptor(recording(tr, "a"), nil, recording(tr, "b")),
		dabb.WithInterceptor(recording(tr, "c"), inspect))
	c := newClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	reply, err := call(ctx, c, "key", proxy.IdempotencyKey("order-7"), proxy.Attachment("trace", "t1"))
	if err != nil {
		t.Fatal(err)
	}
	if reply.GetSku() != "order-7" || reply.GetCount() != 1 {
		t.Errorf("handler saw key %q and %d attachments, want order-7 and 1", reply.GetSku(), reply.GetCount())
	}
	if got, want := tr.String(), "a> b> c> handler(tagged) <c <b <a"; got != want {
		t.Errorf("steps %q, want %q: the first given is the outermost, the nil one skipped", got, want)
	}
	if info.Service != probeDesc.Name || info.Method != "Do" || info.Idempotent ||
		info.IdempotencyKey != "order-7" || info.Attachments["trace"] != "t1" || len(info.Attachments) != 1 {
		t.Errorf("CallInfo %+v, want test.Probe.Do, not idempotent, key order-7, attachments {trace: t1}", info)
	}
}

func TestInterceptorRejects(t *testing.T) {
	var mu sync.Mutex
	var observed []protocol.Status
	observe := func(ctx context.Context, info *dabb.CallInfo, next dabb.CallHandler) (any, error) {
		reply, err := next(ctx)
		mu.Lock()
		observed = append(observed, dabb.StatusOf(err))
		mu.Unlock()
		return reply, err
	}
	reject := func(ctx context.Context, info *dabb.CallInfo, next dabb.CallHandler) (any, error) {
		switch info.Attachments["verdict"] {
		case "bad":
			return nil, &protocol.Error{Status: protocol.StatusBadRequest, Code: protocol.CodeInvalidArgument, Msg: "verdict: bad"}
		case "plain":
			return nil, errors.New("verdict: plain")
		}
		return next(ctx)
	}
	p := newProbe()
	_, addr := startServer(t, p, dabb.WithInterceptor(observe, reject))
	c := newClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	var clientSaw []protocol.Status
	for _, tc := range []struct {
		verdict string
		status  protocol.Status
		msg     string
	}{
		{"bad", protocol.StatusBadRequest, "verdict: bad"},
		{"plain", protocol.StatusServiceError, "verdict: plain"},
	} {
		_, err := call(ctx, c, "echo", proxy.Attachment("verdict", tc.verdict))
		pe := statusOf(t, err)
		if pe.Status != tc.status || pe.Msg != tc.msg {
			t.Errorf("verdict %s: client got %v, want status %v saying %q", tc.verdict, err, tc.status, tc.msg)
		}
		clientSaw = append(clientSaw, pe.Status)
	}
	if n := p.ran.Load(); n != 0 {
		t.Fatalf("the handler ran %d times for rejected calls, want 0", n)
	}
	if _, err := call(ctx, c, "bad"); err != nil {
		clientSaw = append(clientSaw, statusOf(t, err).Status)
	}
	if _, err := call(ctx, c, "echo"); err != nil {
		t.Fatalf("admitted call: %v", err)
	}
	clientSaw = append(clientSaw, protocol.StatusOK)
	if p.ran.Load() != 2 {
		t.Errorf("the handler ran %d times for two admitted calls", p.ran.Load())
	}
	mu.Lock()
	defer mu.Unlock()
	if !equalStatuses(observed, clientSaw) {
		t.Errorf("StatusOf in the interceptor said %v, the client saw %v", observed, clientSaw)
	}
}

func equalStatuses(a, b []protocol.Status) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestInterceptorObservesOutcome(t *testing.T) {
	type outcome struct {
		sku     string
		status  protocol.Status
		elapsed time.Duration
	}
	got := make(chan outcome, 1)
	observe := func(ctx context.Context, info *dabb.CallInfo, next dabb.CallHandler) (any, error) {
		start := time.Now()
		reply, err := next(ctx)
		o := outcome{status: dabb.StatusOf(err), elapsed: time.Since(start)}
		if r, ok := reply.(*pb.StockReply); ok {
			o.sku = r.GetSku()
		}
		got <- o
		return reply, err
	}
	_, addr := startServer(t, newProbe(), dabb.WithInterceptor(observe))
	c := newClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	if _, err := call(ctx, c, "sleep:30ms"); err != nil {
		t.Fatal(err)
	}
	o := <-got
	if o.sku != "sleep:30ms" || o.status != protocol.StatusOK || o.elapsed < 30*time.Millisecond {
		t.Errorf("observed %+v, want the reply, status ok and at least 30ms", o)
	}
}

// panicID finds the id in a client's "handler panic (id ...)" message.
var panicID = regexp.MustCompile(`^handler panic \(id ([0-9a-f]{16})\)$`)

func TestPanic(t *testing.T) {
	observed := make(chan error, 1)
	outer := func(ctx context.Context, info *dabb.CallInfo, next dabb.CallHandler) (any, error) {
		reply, err := next(ctx)
		observed <- err
		return reply, err
	}
	panicky := func(ctx context.Context, info *dabb.CallInfo, next dabb.CallHandler) (any, error) {
		if info.Attachments["panic"] == "before" {
			panic("interceptor: asked to panic")
		}
		reply, err := next(ctx)
		if info.Attachments["panic"] == "after" {
			panic("interceptor: asked to panic after the handler")
		}
		return reply, err
	}
	for _, tc := range []struct {
		name, sku, attach string
		opts              []dabb.Option
		where, value      string
		ran               int64
	}{
		{"Handler", "panic", "", nil, "dabb: handler panic", "probe: asked to panic", 1},
		{"HandlerInChain", "panic", "", []dabb.Option{dabb.WithInterceptor(outer, panicky)},
			"dabb: handler panic", "probe: asked to panic", 1},
		{"InterceptorBefore", "echo", "before", []dabb.Option{dabb.WithInterceptor(outer, panicky)},
			"dabb: interceptor 2 panic", "interceptor: asked to panic", 0},
		{"InterceptorAfter", "echo", "after", []dabb.Option{dabb.WithInterceptor(outer, panicky)},
			"dabb: interceptor 2 panic", "interceptor: asked to panic after the handler", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &logLines{}
			p := newProbe()
			opts := append([]dabb.Option{dabb.WithLogger(slog.New(slog.NewTextHandler(logs, nil)))}, tc.opts...)
			_, addr := startServer(t, p, opts...)
			c := newClient(t, addr)
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()

			_, err := call(ctx, c, tc.sku, proxy.Attachment("panic", tc.attach))
			pe := statusOf(t, err)
			m := panicID.FindStringSubmatch(pe.Msg)
			if pe.Status != protocol.StatusServiceError || m == nil {
				t.Fatalf("client got %v, want status 70 saying \"handler panic (id <16 hex>)\"", err)
			}
			id := m[1]
			if n := logs.count("id=" + id); n != 1 {
				t.Errorf("the server logged id %s %d times, want once; log:\n%s", id, n, logs.String())
			}
			for _, want := range []string{tc.where, tc.value, `stack="goroutine `, "service=test.Probe method=Do"} {
				if logs.count(want) != 1 {
					t.Errorf("the log does not say %q once:\n%s", want, logs.String())
				}
			}
			if strings.Contains(logs.String(), "transport: handler panic") {
				t.Errorf("the transport recovered the panic too:\n%s", logs.String())
			}
			if n := p.ran.Load(); n != tc.ran {
				t.Errorf("the handler ran %d times, want %d", n, tc.ran)
			}
			if tc.opts == nil {
				return
			}
			var perr *dabb.PanicError
			if err := <-observed; !errors.As(err, &perr) || perr.ID != id || perr.Value != tc.value ||
				dabb.StatusOf(err) != protocol.StatusServiceError {
				t.Errorf("the outer interceptor observed %v, want a *PanicError with id %s and value %q, status 70", err, id, tc.value)
			}
			// The server lives on.
			if _, err := call(ctx, c, "echo"); err != nil {
				t.Fatalf("call after the panic: %v", err)
			}
			<-observed
		})
	}
}

func TestNilReply(t *testing.T) {
	t.Run("Handler", func(t *testing.T) {
		observed := make(chan error, 1)
		outer := func(ctx context.Context, info *dabb.CallInfo, next dabb.CallHandler) (any, error) {
			reply, err := next(ctx)
			observed <- err
			return reply, err
		}
		_, addr := startServer(t, newProbe(), dabb.WithInterceptor(outer))
		c := newClient(t, addr)
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		_, err := call(ctx, c, "nil")
		pe := statusOf(t, err)
		want := "test.Probe.Do: handler returned a nil reply and a nil error"
		if pe.Status != protocol.StatusServiceError || pe.Msg != want || !errors.Is(err, proxy.ErrServiceError) {
			t.Errorf("client got %v, want status 70 saying %q", err, want)
		}
		if err := <-observed; dabb.StatusOf(err) != protocol.StatusServiceError {
			t.Errorf("the interceptor observed %v, want the status 70 error", err)
		}
	})
	t.Run("Interceptor", func(t *testing.T) {
		lazy := func(ctx context.Context, info *dabb.CallInfo, next dabb.CallHandler) (any, error) {
			return (*pb.StockReply)(nil), nil
		}
		p := newProbe()
		_, addr := startServer(t, p, dabb.WithInterceptor(lazy))
		c := newClient(t, addr)
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		_, err := call(ctx, c, "echo")
		want := "test.Probe.Do: interceptor 1 returned a nil reply and a nil error"
		if pe := statusOf(t, err); pe.Status != protocol.StatusServiceError || pe.Msg != want {
			t.Errorf("client got %v, want status 70 saying %q", err, want)
		}
		if p.ran.Load() != 0 {
			t.Errorf("the handler ran")
		}
	})
	t.Run("OneWay", func(t *testing.T) {
		// No reply goes back to a one-way request: nil is its reply.
		desc := dabb.ServiceDesc{Name: "test.Nil", Methods: []dabb.MethodDesc{{Name: "Get",
			Handler: func(srv any, ctx context.Context, dec func(any) error) (any, error) {
				return (*pb.StockReply)(nil), nil
			}}}}
		s := dabb.NewServer(dabb.WithLogger(quiet))
		if err := s.RegisterService(&desc, struct{}{}); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			kind protocol.Flags
			want protocol.Status
		}{
			{protocol.FlagRequest, protocol.StatusOK},
			{protocol.FlagRequest | protocol.FlagTwoWay, protocol.StatusServiceError},
		} {
			req, resp := &protocol.Message{Service: desc.Name, Method: "Get"}, &protocol.Message{}
			req.Header.Init(protocol.MakeFlags(tc.kind, 22), 0, 1)
			s.ServeRPC(context.Background(), req, resp)
			if got := resp.Header.Status(); got != tc.want {
				t.Errorf("flags %#x: status %v (%s), want %v", tc.kind, got, resp.Payload, tc.want)
			}
		}
	})
}

var staticReply = &pb.StockReply{Sku: "static", Count: 7}

// staticDesc's method answers staticReply without decoding: ServeRPC's
// allocations are then the server's own.
var staticDesc = dabb.ServiceDesc{
	Name: "test.Static",
	Methods: []dabb.MethodDesc{{
		Name:       "Get",
		Idempotent: true,
		Handler: func(srv any, ctx context.Context, dec func(any) error) (any, error) {
			return staticReply, nil
		},
	}},
}

// serveStatic calls ServeRPC for test.Static.Get and returns the response.
func serveStatic(s *dabb.Server, req, resp *protocol.Message) {
	resp.Payload = resp.Payload[:0]
	s.ServeRPC(context.Background(), req, resp)
}

func staticRequest() *protocol.Message {
	req := &protocol.Message{Service: staticDesc.Name, Method: "Get"}
	req.Header.Init(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, 22), 0, 1)
	return req
}

func TestServeRPCAllocs(t *testing.T) {
	s := dabb.NewServer(dabb.WithLogger(quiet))
	if err := s.RegisterService(&staticDesc, struct{}{}); err != nil {
		t.Fatal(err)
	}
	req, resp := staticRequest(), &protocol.Message{Payload: make([]byte, 0, 64)}
	serveStatic(s, req, resp)
	if resp.Header.Status() != protocol.StatusOK {
		t.Fatalf("status %v: %s", resp.Header.Status(), resp.Payload)
	}
	// With no interceptor, a call allocates nothing of the server's: the
	// chain costs nothing unless configured. (Under the race detector the
	// pooled decoder is lost now and then: half an allocation a call,
	// which AllocsPerRun rounds down.)
	if n := testing.AllocsPerRun(1000, func() { serveStatic(s, req, resp) }); n != 0 {
		t.Errorf("ServeRPC with no interceptor allocates %v times a call, want 0", n)
	}

	var info dabb.CallInfo
	s = dabb.NewServer(dabb.WithLogger(quiet), dabb.WithInterceptor(
		func(ctx context.Context, ci *dabb.CallInfo, next dabb.CallHandler) (any, error) {
			info = *ci
			return next(ctx)
		}))
	if err := s.RegisterService(&staticDesc, struct{}{}); err != nil {
		t.Fatal(err)
	}
	serveStatic(s, req, resp)
	if resp.Header.Status() != protocol.StatusOK || !info.Idempotent || info.Service != staticDesc.Name {
		t.Fatalf("status %v, CallInfo %+v: want ok and an idempotent test.Static.Get", resp.Header.Status(), info)
	}
	// The chain is bound once per pooled call: it allocates nothing
	// either. The race detector's sync.Pool drops a quarter of what is
	// put back, which costs the chain's four allocations a time.
	if raceEnabled() {
		return
	}
	if n := testing.AllocsPerRun(1000, func() { serveStatic(s, req, resp) }); n != 0 {
		t.Errorf("ServeRPC with one interceptor allocates %v times a call, want 0", n)
	}
}

// raceEnabled reports a test binary built with -race.
func raceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

// A server that logs every call with its status and duration, and admits
// only callers with a token. The log interceptor is outermost, so it sees
// the rejections too.
func ExampleWithInterceptor() {
	logCalls := func(ctx context.Context, info *dabb.CallInfo, next dabb.CallHandler) (any, error) {
		start := time.Now()
		reply, err := next(ctx)
		slog.InfoContext(ctx, "call", "service", info.Service, "method", info.Method,
			"status", dabb.StatusOf(err), "took", time.Since(start))
		return reply, err
	}
	tokens := dabb.NewTokenSet(os.Getenv("API_TOKEN"))
	s := dabb.NewServer(dabb.WithInterceptor(logCalls, tokens.Intercept))
	_ = s // register services, then s.ListenAndServe
	// Later, to rotate: accept both, move the clients, drop the old one.
	tokens.Set(os.Getenv("API_TOKEN"), os.Getenv("API_TOKEN_NEXT"))
}
