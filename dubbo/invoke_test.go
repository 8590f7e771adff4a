package dubbo_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	hessian "github.com/apache/dubbo-go-hessian2"

	"github.com/dabbrpc/dabb/dubbo"
	"github.com/dabbrpc/dabb/dubbo/internal/dubbogotest"
	"github.com/dabbrpc/dabb/internal/wait"
	"github.com/dabbrpc/dabb/internal/zktest"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
	"github.com/dabbrpc/dabb/transport"
)

const greeterInterface = "com.example.Greeter"

// newDubboClient returns a client over the zookeeper:// registry at addr,
// closed when the test ends.
func newDubboClient(t *testing.T, zkAddr string, opts ...proxy.Option) *proxy.Client {
	t.Helper()
	reg, err := registry.Open(context.Background(), "zookeeper://"+zkAddr)
	if err != nil {
		t.Fatal(err)
	}
	opts = append([]proxy.Option{proxy.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))}, opts...)
	c, err := proxy.NewClient(reg, opts...)
	if err != nil {
		reg.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		reg.Close()
	})
	return c
}

// stopProvider stops p and waits until ZooKeeper lists none of its
// nodes, so that the next test reads a layout without it: a provider that
// was killed leaves them until its session expires (dubbo-go's is 5 s).
func stopProvider(t *testing.T, zkAddr string, p *dubbogotest.Provider) {
	t.Helper()
	p.Stop()
	conn := zktest.Client(t, zkAddr)
	wait.Until(t, 30*time.Second, 100*time.Millisecond, "the nodes of the provider at "+p.Addr()+" to go", func() bool {
		for _, iface := range []string{inventoryInterface, greeterInterface} {
			for _, u := range providerURLs(t, conn, iface) {
				if strings.Contains(u, "//"+p.Addr()+"/") {
					return false
				}
			}
		}
		return true
	})
}

// TestInvokeDubbogo makes generic calls to a dubbo-go provider found in
// ZooKeeper: primitives, a POJO, a thrown exception, a missing method,
// and 1,000 calls from 8 goroutines with none failing.
func TestInvokeDubbogo(t *testing.T) {
	srv := zktest.Shared(t)
	p := dubbogotest.StartProvider(t, dubbogotest.ProviderConfig{ZooKeeper: srv.Addr()})
	defer stopProvider(t, srv.Addr(), p)
	var attempts atomic.Int64
	count := func(next proxy.Invoker) proxy.Invoker {
		return func(ctx context.Context, call *proxy.Call) error {
			call.OnAttempt = func(proxy.AttemptInfo) { attempts.Add(1) }
			return next(ctx, call)
		}
	}
	c := newDubboClient(t, srv.Addr(), proxy.WithMiddleware(count), proxy.WithTimeout(10*time.Second))
	ctx := context.Background()

	got, err := dubbo.Invoke(ctx, c, greeterInterface, "sayHello", nil, []any{"world"})
	if err != nil || got != "hello world" {
		t.Fatalf("sayHello(world) = %#v, %v; want \"hello world\"", got, err)
	}

	// stock(long) with the type inferred from a Go int.
	stock, err := dubbo.Invoke(ctx, c, inventoryInterface, "stock", nil, []any{10086})
	if n, ok := stock.(int64); err != nil || !ok || n <= 0 {
		t.Fatalf("stock(10086) = %#v, %v; want a positive long", stock, err)
	}
	// deduct(long, int) with the types given.
	ok, err := dubbo.Invoke(ctx, c, inventoryInterface, "deduct", []string{"long", "int"}, []any{10086, 2})
	if err != nil || ok != true {
		t.Fatalf("deduct(10086, 2) = %#v, %v; want true", ok, err)
	}
	after, err := dubbo.Invoke(ctx, c, inventoryInterface, "stock", []string{"long"}, []any{int64(10086)})
	if err != nil || after != stock.(int64)-2 {
		t.Errorf("stock after deducting 2 = %#v, %v; want %d", after, err, stock.(int64)-2)
	}

	reply, err := dubbo.Invoke(ctx, c, greeterInterface, "greet", nil,
		[]any{map[string]any{"class": "com.example.HelloRequest", "name": "pojo"}})
	if err != nil {
		t.Fatalf("greet: %v", err)
	}
	m, _ := reply.(map[string]any)
	if m["class"] != "com.example.HelloReply" || m["message"] != "hello pojo" || m["length"] != int32(10) {
		t.Errorf("greet = %#v; want a com.example.HelloReply map, message \"hello pojo\", length int32 10", reply)
	}

	// A registered struct travels as the map of its fields.
	reply, err = dubbo.Invoke(ctx, c, greeterInterface, "greet", nil, []any{&HelloRequest{Name: "struct"}})
	if m, _ := reply.(map[string]any); err != nil || m["message"] != "hello struct" {
		t.Errorf("greet(&HelloRequest{struct}) = %#v, %v; want message hello struct", reply, err)
	}

	// A thrown exception: a service error carrying the Java class, not
	// retried even when idempotent, not counted against the breaker.
	before := attempts.Load()
	const fails = 12
	for range fails {
		_, err = dubbo.Invoke(ctx, c, greeterInterface, "fail", nil, []any{"always fails"}, proxy.Idempotent())
		var exc *dubbo.Exception
		if !errors.Is(err, proxy.ErrServiceError) || !errors.As(err, &exc) {
			t.Fatalf("fail(why) = %v; want ErrServiceError with a *dubbo.Exception", err)
		}
		if exc.Class != "java.lang.RuntimeException" || !strings.Contains(exc.Message, "always fails") {
			t.Fatalf("fail(why) threw %s %q; want java.lang.RuntimeException saying \"always fails\"", exc.Class, exc.Message)
		}
	}
	if n := attempts.Load() - before; n != fails {
		t.Errorf("%d calls that threw made %d attempts; want one each", fails, n)
	}
	ins, err := c.Instances(ctx, greeterInterface)
	if err != nil || len(ins) != 1 {
		t.Fatalf("instances of %s = %v, %v; want one", greeterInterface, ins, err)
	}
	if st := c.BreakerState(ins[0].Addr); st != "closed" {
		t.Errorf("breaker of %s after %d exceptions = %s; want closed", ins[0].Addr, fails, st)
	}

	_, err = dubbo.Invoke(ctx, c, greeterInterface, "noSuchThing", nil, []any{"x"})
	if !errors.Is(err, dubbo.ErrNoSuchMethod) || !errors.Is(err, proxy.ErrNotFound) || !strings.Contains(err.Error(), "pass the method's Java parameter types") {
		t.Errorf("noSuchThing(x) = %v; want ErrNoSuchMethod and ErrNotFound, saying to pass the types", err)
	}

	t.Run("1000 calls", func(t *testing.T) {
		const n, k = 1000, 8
		var failed atomic.Int64
		var firstErr sync.Once
		var wg sync.WaitGroup
		next := atomic.Int64{}
		for range k {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= n {
					got, err := dubbo.Invoke(ctx, c, greeterInterface, "sayHello", nil, []any{"load"})
					if err != nil || got != "hello load" {
						failed.Add(1)
						firstErr.Do(func() { t.Errorf("sayHello(load) = %#v, %v", got, err) })
					}
				}
			}()
		}
		wg.Wait()
		if f := failed.Load(); f != 0 {
			t.Errorf("%d of %d generic calls failed", f, n)
		}
	})
}

// TestInvokeGroupVersion calls a provider exported under a group and a
// version by its service key; one without them is not picked for it.
func TestInvokeGroupVersion(t *testing.T) {
	srv := zktest.Shared(t)
	p := dubbogotest.StartProvider(t, dubbogotest.ProviderConfig{ZooKeeper: srv.Addr(), Group: "blue", Version: "2.0.0",
		Services: []string{"greeter"}})
	defer stopProvider(t, srv.Addr(), p)
	c := newDubboClient(t, srv.Addr(), proxy.WithTimeout(5*time.Second))
	ctx := context.Background()
	got, err := dubbo.Invoke(ctx, c, "blue/"+greeterInterface+":2.0.0", "sayHello", nil, []any{"blue"})
	if err != nil || got != "hello blue" {
		t.Fatalf("sayHello(blue) on blue/%s:2.0.0 = %#v, %v", greeterInterface, got, err)
	}
	_, err = dubbo.Invoke(ctx, c, "green/"+greeterInterface+":2.0.0", "sayHello", nil, []any{"x"}, proxy.Timeout(300*time.Millisecond))
	if !errors.Is(err, proxy.ErrUnavailable) {
		t.Errorf("a call of group green = %v; want ErrUnavailable (no provider)", err)
	}
}

func TestInvokeBadInput(t *testing.T) {
	c := newDubboClient(t, "127.0.0.1:1")
	ctx := context.Background()
	for _, tt := range []struct {
		name, service, method string
		types                 []string
		args                  []any
		want                  string
	}{
		{"no interface", "g/", "m", nil, nil, "no interface"},
		{"group pattern", "a,b/x.Y", "m", nil, nil, "not a pattern"},
		{"no method", "x.Y", "", nil, nil, "no method name"},
		{"null inferred", "x.Y", "m", nil, []any{nil}, "pass the parameter types"},
		{"unknown Go type", "x.Y", "m", nil, []any{struct{}{}}, "pass the parameter types"},
		{"types and args", "x.Y", "m", []string{"int"}, []any{1, 2}, "1 parameter types for 2 arguments"},
		{"int overflow", "x.Y", "m", []string{"int"}, []any{int64(1) << 40}, "is no int"},
		{"fraction for long", "x.Y", "m", []string{"long"}, []any{1.5}, "is no long"},
		{"empty type", "x.Y", "m", []string{" "}, []any{1}, "parameter type 1 is empty"},
	} {
		_, err := dubbo.Invoke(ctx, c, tt.service, tt.method, tt.types, tt.args)
		if !errors.Is(err, proxy.ErrNotSent) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v; want not sent, saying %q", tt.name, err, tt.want)
		}
		var pe *protocol.Error
		if !errors.As(err, &pe) {
			t.Errorf("%s: %T is no *protocol.Error", tt.name, err)
		}
	}
}

func TestInvokeNilClient(t *testing.T) {
	if _, err := dubbo.Invoke(context.Background(), nil, "x.Y", "m", nil, nil); !errors.Is(err, proxy.ErrNotSent) {
		t.Errorf("Invoke with a nil client = %v; want not sent", err)
	}
	if err := dubbo.Echo(context.Background(), nil, "x.Y"); !errors.Is(err, proxy.ErrNotSent) {
		t.Errorf("Echo with a nil client = %v; want not sent", err)
	}
}

func TestInferType(t *testing.T) {
	for _, tt := range []struct {
		v    any
		want string
	}{
		{"s", "java.lang.String"}, {7, "long"}, {int32(7), "long"}, {uint8(1), "long"}, {2.5, "double"},
		{true, "boolean"}, {[]any{1}, "java.util.List"}, {[]string{"a"}, "java.util.List"},
		{map[string]any{"a": 1}, "java.util.Map"}, {map[string]any{"class": "com.example.P"}, "com.example.P"},
		{&HelloRequest{}, "com.example.HelloRequest"}, {HelloReply{}, "com.example.HelloReply"},
	} {
		got, err := dubbo.InferType(tt.v)
		if err != nil || got != tt.want {
			t.Errorf("InferType(%#v) = %q, %v; want %q", tt.v, got, err, tt.want)
		}
	}
}

// frame is one frame read off a connection: its header and body.
type frame struct {
	h    protocol.Header
	body []byte
}

func readFrame(r io.Reader) (frame, error) {
	var f frame
	if _, err := io.ReadFull(r, f.h[:]); err != nil {
		return f, err
	}
	f.body = make([]byte, f.h.BodyLen())
	_, err := io.ReadFull(r, f.body)
	return f, err
}

func (f frame) bytes() []byte { return append(f.h[:len(f.h):len(f.h)], f.body...) }

// staticClient returns a client whose registry lists addr for service.
func staticClient(t *testing.T, service, addr string, opts ...proxy.Option) *proxy.Client {
	t.Helper()
	reg := static.New(registry.Instance{Service: service, Addr: addr})
	opts = append([]proxy.Option{proxy.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))),
		proxy.WithTimeout(10 * time.Second)}, opts...)
	c, err := proxy.NewClient(reg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		reg.Close()
	})
	return c
}

// TestInvokeAttachments reads the request Invoke writes: Dubbo's $invoke
// with the types, generic=true, and path, interface, version, group and
// timeout as Java's consumer sends them.
func TestInvokeAttachments(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan *dubbo.Request, 1)
	served := make(chan struct{})
	go func() {
		defer close(served)
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		for {
			f, err := readFrame(conn)
			if err != nil {
				return
			}
			if !f.h.Flags().IsRequest() || f.h.Flags().IsEvent() {
				continue
			}
			req, err := dubbo.DecodeRequest(f.body, dubbo.Limits{})
			if err != nil {
				t.Errorf("decode the request: %v", err)
				return
			}
			got <- req
			body, _ := dubbo.AppendResponse(nil, &dubbo.Response{Value: "ok"})
			var h protocol.Header
			h.Init(protocol.MakeFlags(0, dubbo.Hessian2ID), protocol.StatusOK, f.h.ID())
			h.SetMagic()
			h.SetBodyLen(uint32(len(body)))
			if _, err := conn.Write(append(h[:], body...)); err != nil {
				return
			}
		}
	}()
	c := staticClient(t, "com.example.Greeter:1.0.0:blue", ln.Addr().String())
	v, err := dubbo.Invoke(context.Background(), c, "blue/com.example.Greeter:1.0.0", "greet",
		[]string{"com.example.HelloRequest", "int"}, []any{map[string]any{"class": "com.example.HelloRequest", "name": "n"}, 3},
		proxy.Timeout(1500*time.Millisecond))
	if err != nil || v != "ok" {
		t.Fatalf("Invoke = %#v, %v; want \"ok\"", v, err)
	}
	req := <-got
	if req.Path != "com.example.Greeter" || req.Version != "1.0.0" || req.Method != "$invoke" ||
		req.ParamTypes != "Ljava/lang/String;[Ljava/lang/String;[Ljava/lang/Object;" {
		t.Errorf("request %s %s %s %s; want com.example.Greeter 1.0.0 $invoke with $invoke's descriptor",
			req.Path, req.Version, req.Method, req.ParamTypes)
	}
	if len(req.Args) != 3 || req.Args[0] != "greet" {
		t.Fatalf("arguments %#v; want greet, its types, its arguments", req.Args)
	}
	if types, _ := req.Args[1].([]string); strings.Join(types, ",") != "com.example.HelloRequest,int" {
		t.Errorf("types %#v; want [com.example.HelloRequest int]", req.Args[1])
	}
	args, _ := req.Args[2].([]hessian.Object)
	if len(args) != 2 || args[1] != int32(3) {
		t.Errorf("arguments %#v; want a POJO map and int32 3", req.Args[2])
	}
	for k, want := range map[string]string{"path": "com.example.Greeter", "interface": "com.example.Greeter",
		"version": "1.0.0", "group": "blue", "generic": "true"} {
		if req.Attachments[k] != want {
			t.Errorf("attachment %s = %#v; want %q", k, req.Attachments[k], want)
		}
	}
	ms, err := strconv.Atoi(fmt.Sprint(req.Attachments["timeout"]))
	if err != nil || ms <= 0 || ms > 1500 {
		t.Errorf("attachment timeout = %#v; want the budget left, 1..1500 ms", req.Attachments["timeout"])
	}
	c.Close()
	ln.Close()
	<-served
}

// TestInvokeCancelReply shows that dubbo-go answers dabb's one-way cancel
// event under the cancelled call's id, and that the client drops that
// answer (and the late response) and goes on using the connection.
func TestInvokeCancelReply(t *testing.T) {
	srv := zktest.Shared(t)
	p := dubbogotest.StartProvider(t, dubbogotest.ProviderConfig{ZooKeeper: srv.Addr(), Services: []string{"greeter"}})
	defer stopProvider(t, srv.Addr(), p)
	rl := startRelay(t, p.Addr())
	// One connection, so the call after the cancelled one shares it.
	c := staticClient(t, greeterInterface, rl.addr(), proxy.WithTransport(transport.Config{ConnsPerAddr: 1}))
	ctx := context.Background()
	if got, err := dubbo.Invoke(ctx, c, greeterInterface, "sayHello", nil, []any{"first"}); err != nil || got != "hello first" {
		t.Fatalf("sayHello(first) = %#v, %v", got, err)
	}

	rl.hold.Store(true)
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := dubbo.Invoke(cctx, c, greeterInterface, "sayHello", nil, []any{"cancelled"})
		done <- err
	}()
	var id uint64
	select {
	case id = <-rl.held:
	case <-time.After(10 * time.Second):
		t.Fatal("the relay saw no request to hold within 10s")
	}
	cancel()
	if err := <-done; !errors.Is(err, proxy.ErrCanceled) {
		t.Fatalf("the cancelled call = %v; want ErrCanceled", err)
	}
	// The provider gets the request and the cancel event; it answers both
	// under the call's id.
	var response, eventReply bool
	deadline := time.After(10 * time.Second)
	for !response || !eventReply {
		select {
		case f := <-rl.fromServer:
			if f.h.ID() != id {
				continue
			}
			if f.h.Flags().IsEvent() {
				eventReply = true
			} else {
				response = true
			}
		case <-deadline:
			t.Fatalf("within 10s the provider answered call %d: response %v, reply to the cancel event %v; want both", id, response, eventReply)
		}
	}
	if got, err := dubbo.Invoke(ctx, c, greeterInterface, "sayHello", nil, []any{"after"}); err != nil || got != "hello after" {
		t.Fatalf("sayHello(after) = %#v, %v; want \"hello after\"", got, err)
	}
	if n, closed := rl.accepted.Load(), rl.closed.Load(); n != 1 || closed != 0 {
		t.Errorf("the client opened %d connections and closed %d; want 1 kept through the dropped replies", n, closed)
	}
}

// relay forwards one client's frames to a provider and back. With hold
// set, it keeps the next two-way request until the client's cancel event
// for it arrives, then forwards both. Every frame from the provider is
// also sent on fromServer.
type relay struct {
	ln         net.Listener
	hold       atomic.Bool
	held       chan uint64
	fromServer chan frame
	accepted   atomic.Int64
	closed     atomic.Int64 // connections the client closed
	wg         sync.WaitGroup
}

func startRelay(t *testing.T, target string) *relay {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rl := &relay{ln: ln, held: make(chan uint64, 1), fromServer: make(chan frame, 1024)}
	var conns []net.Conn
	var mu sync.Mutex
	rl.wg.Add(1)
	go func() {
		defer rl.wg.Done()
		for {
			cc, err := ln.Accept()
			if err != nil {
				return
			}
			rl.accepted.Add(1)
			sc, err := net.Dial("tcp", target)
			if err != nil {
				cc.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, cc, sc)
			mu.Unlock()
			rl.wg.Add(2)
			go rl.toServer(cc, sc)
			go rl.toClient(sc, cc)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		rl.wg.Wait()
	})
	return rl
}

func (rl *relay) addr() string { return rl.ln.Addr().String() }

func (rl *relay) toServer(cc, sc net.Conn) {
	defer rl.wg.Done()
	defer sc.Close()
	var kept *frame
	for {
		f, err := readFrame(cc)
		if err != nil {
			if errors.Is(err, io.EOF) {
				rl.closed.Add(1)
			}
			return
		}
		fl := f.h.Flags()
		if kept == nil && fl.IsRequest() && fl.IsTwoWay() && !fl.IsEvent() && rl.hold.CompareAndSwap(true, false) {
			kept = &f
			rl.held <- f.h.ID()
			continue
		}
		if kept != nil && fl.IsEvent() && f.h.ID() == kept.h.ID() {
			if _, err := sc.Write(kept.bytes()); err != nil {
				return
			}
			kept = nil
		}
		if _, err := sc.Write(f.bytes()); err != nil {
			return
		}
	}
}

func (rl *relay) toClient(sc, cc net.Conn) {
	defer rl.wg.Done()
	defer cc.Close()
	for {
		f, err := readFrame(sc)
		if err != nil {
			return
		}
		select {
		case rl.fromServer <- f:
		default:
		}
		if _, err := cc.Write(f.bytes()); err != nil {
			return
		}
	}
}
