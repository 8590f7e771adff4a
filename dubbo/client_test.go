package dubbo_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/dubbo"
	"github.com/dabbrpc/dabb/dubbo/internal/dubbogotest"
	"github.com/dabbrpc/dabb/internal/wait"
	"github.com/dabbrpc/dabb/internal/zktest"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
)

// HelloRequest is com.example.HelloRequest {String name}.
type HelloRequest struct{ Name string }

// HelloReply is com.example.HelloReply {String message; int length}.
type HelloReply struct {
	Message string
	Length  int32
}

func init() {
	for class, proto := range map[string]any{"com.example.HelloRequest": &HelloRequest{}, "com.example.HelloReply": &HelloReply{}} {
		if err := dubbo.RegisterPOJO(class, proto); err != nil {
			panic(err)
		}
	}
}

// Greeter is the Go declaration of com.example.Greeter.
type Greeter interface {
	SayHello(ctx context.Context, name string) (string, error)
	Greet(ctx context.Context, req *HelloRequest) (*HelloReply, error)
	Fail(ctx context.Context, why string) (string, error)
}

// InventoryService is the Go declaration of
// com.example.inventory.InventoryService's primitive methods.
type InventoryService interface {
	Stock(ctx context.Context, sku int64) (int64, error)
	Deduct(ctx context.Context, sku int64, count int32) (bool, error)
}

// TestClientDubbogo calls a dubbo-go provider typed: primitives, a POJO,
// an exception, and 1,000 calls from 8 goroutines with none failing.
func TestClientDubbogo(t *testing.T) {
	srv := zktest.Shared(t)
	p := dubbogotest.StartProvider(t, dubbogotest.ProviderConfig{ZooKeeper: srv.Addr()})
	defer stopProvider(t, srv.Addr(), p)
	c := newDubboClient(t, srv.Addr(), proxy.WithTimeout(10*time.Second))
	ctx := context.Background()
	greeter, err := dubbo.NewClient(c, "com.example.Greeter", (*Greeter)(nil), dubbo.WithIdempotent("SayHello"))
	if err != nil {
		t.Fatal(err)
	}
	inv, err := dubbo.NewClient(c, inventoryInterface, (*InventoryService)(nil))
	if err != nil {
		t.Fatal(err)
	}

	var hello string
	if err := greeter.Call(ctx, "SayHello", []any{"typed"}, &hello); err != nil || hello != "hello typed" {
		t.Fatalf("SayHello(typed) = %q, %v", hello, err)
	}
	var stock, after int64
	if err := inv.Call(ctx, "Stock", []any{10086}, &stock); err != nil || stock <= 0 {
		t.Fatalf("Stock(10086) = %d, %v; want units left", stock, err)
	}
	var ok bool
	if err := inv.Call(ctx, "Deduct", []any{int64(10086), 3}, &ok); err != nil || !ok {
		t.Fatalf("Deduct(10086, 3) = %v, %v; want true", ok, err)
	}
	if err := inv.Call(ctx, "Stock", []any{10086}, &after); err != nil || after != stock-3 {
		t.Errorf("Stock after deducting 3 = %d, %v; want %d", after, err, stock-3)
	}
	var reply *HelloReply
	if err := greeter.Call(ctx, "Greet", []any{&HelloRequest{Name: "pojo"}}, &reply); err != nil {
		t.Fatalf("Greet: %v", err)
	}
	if reply == nil || *reply != (HelloReply{Message: "hello pojo", Length: 10}) {
		t.Errorf("Greet = %+v; want message hello pojo, length 10", reply)
	}
	err = greeter.Call(ctx, "Fail", []any{"typed failure"}, nil)
	var exc *dubbo.Exception
	if !errors.Is(err, proxy.ErrServiceError) || !errors.As(err, &exc) ||
		exc.Class != "java.lang.RuntimeException" || exc.Message != "typed failure" {
		t.Errorf("Fail = %v; want ErrServiceError with java.lang.RuntimeException: typed failure", err)
	}
	for _, bad := range []struct {
		method string
		args   []any
		want   string
	}{
		{"Nope", nil, "no method Nope"},
		{"SayHello", []any{"a", "b"}, "2 arguments for sayHello(java.lang.String)"},
		{"Deduct", []any{int64(1), int64(1) << 40}, "overflows"},
		{"SayHello", []any{7}, "argument 1"},
	} {
		err := greeter.Call(ctx, bad.method, bad.args, nil)
		if bad.method == "Deduct" {
			err = inv.Call(ctx, bad.method, bad.args, nil)
		}
		if !errors.Is(err, proxy.ErrNotSent) || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s(%v) = %v; want not sent, saying %q", bad.method, bad.args, err, bad.want)
		}
	}

	t.Run("1000 calls", func(t *testing.T) {
		const n, k = 1000, 8
		var failed, next atomic.Int64
		var once sync.Once
		var wg sync.WaitGroup
		for range k {
			wg.Go(func() {
				for next.Add(1) <= n {
					var got string
					if err := greeter.Call(ctx, "SayHello", []any{"load"}, &got); err != nil || got != "hello load" {
						failed.Add(1)
						once.Do(func() { t.Errorf("SayHello(load) = %q, %v", got, err) })
					}
				}
			})
		}
		wg.Wait()
		if f := failed.Load(); f != 0 {
			t.Errorf("%d of %d typed calls failed", f, n)
		}
	})
}

func TestNewClientBadDeclaration(t *testing.T) {
	c := newDubboClient(t, "127.0.0.1:1")
	for _, tt := range []struct {
		iface string
		decl  any
		opts  []dubbo.ServiceOption
		want  string
	}{
		{"Greeter", (*Greeter)(nil), nil, "not a package-qualified"},
		{"com.example.Greeter", nil, nil, "nil declaration"},
		{"com.example.Greeter", (*interface{ Close() error })(nil), nil, "has no method"},
		{"com.example.Greeter", (*Greeter)(nil), []dubbo.ServiceOption{dubbo.WithMethod("Missing", "missing")}, `WithMethod("Missing")`},
		{"com.example.Greeter", (*Greeter)(nil), []dubbo.ServiceOption{dubbo.WithMethod("Greet", "greet", "a", "b")}, "2 Java types for 1 parameters"},
		{"com.example.Greeter", (*Greeter)(nil), []dubbo.ServiceOption{dubbo.WithIdempotent("SayHelo")}, `WithIdempotent("SayHelo")`},
	} {
		if _, err := dubbo.NewClient(c, tt.iface, tt.decl, tt.opts...); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("NewClient(%q, %T) = %v; want an error saying %q", tt.iface, tt.decl, err, tt.want)
		}
	}
}

// TestClientKillProvider kills one of two dubbo-go providers with kill -9
// under load: calls of the idempotent Stock lose none; calls of the
// non-idempotent Deduct are retried only when their attempt provably
// was not sent, and a failed one says the connection failed.
func TestClientKillProvider(t *testing.T) {
	srv := zktest.Shared(t)
	p1 := dubbogotest.StartProvider(t, dubbogotest.ProviderConfig{ZooKeeper: srv.Addr(), Services: []string{"inventory"}})
	p2 := dubbogotest.StartProvider(t, dubbogotest.ProviderConfig{ZooKeeper: srv.Addr(), Services: []string{"inventory"}})
	defer stopProvider(t, srv.Addr(), p2)
	var mu sync.Mutex
	byAddr := map[string]int{}
	var resentAfterSent atomic.Int64
	var firstResent sync.Once
	watch := func(next proxy.Invoker) proxy.Invoker {
		return func(ctx context.Context, call *proxy.Call) error {
			idempotent := call.Idempotent
			call.OnAttempt = func(a proxy.AttemptInfo) {
				mu.Lock()
				byAddr[a.Addr]++
				mu.Unlock()
				if !idempotent && a.After != nil && !errors.Is(a.After, proxy.ErrNotSent) {
					resentAfterSent.Add(1)
					firstResent.Do(func() { t.Errorf("%s attempt %d went after %v", call.Method, a.Attempt, a.After) })
				}
			}
			return next(ctx, call)
		}
	}
	c := newDubboClient(t, srv.Addr(), proxy.WithTimeout(5*time.Second), proxy.WithMiddleware(watch))
	inv, err := dubbo.NewClient(c, inventoryInterface, (*InventoryService)(nil), dubbo.WithIdempotent("Stock"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	stop := make(chan struct{})
	var stocks, stockFailures, deducts, deductFailures atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				var n int64
				if err := inv.Call(ctx, "Stock", []any{10086}, &n); err != nil {
					stockFailures.Add(1)
					once.Do(func() { t.Errorf("Stock failed: %v", err) })
					continue
				}
				stocks.Add(1)
			}
		})
	}
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				var ok bool
				err := inv.Call(ctx, "Deduct", []any{10086, 1}, &ok)
				if err == nil {
					deducts.Add(1)
					continue
				}
				deductFailures.Add(1)
				if errors.Is(err, proxy.ErrServiceError) || !(errors.Is(err, proxy.ErrUnavailable) || errors.Is(err, proxy.ErrTimeout)) {
					t.Errorf("Deduct failed with %v; want a lost connection (unavailable) or a timeout", err)
				}
			}
		})
	}
	wait.Until(t, 10*time.Second, 10*time.Millisecond, "calls to reach both providers", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return byAddr[p1.Addr()] > 50 && byAddr[p2.Addr()] > 50
	})
	p1.Kill()
	before := stocks.Load()
	wait.Until(t, 10*time.Second, 10*time.Millisecond, "500 more Stock calls after the kill", func() bool {
		return stocks.Load() > before+500
	})
	close(stop)
	wg.Wait()
	t.Logf("Stock: %d ok, %d failed; Deduct: %d ok, %d failed", stocks.Load(), stockFailures.Load(), deducts.Load(), deductFailures.Load())
	if f := stockFailures.Load(); f != 0 {
		t.Errorf("%d Stock calls failed across the kill; want none (it is idempotent)", f)
	}
	if n := resentAfterSent.Load(); n != 0 {
		t.Errorf("%d Deduct attempts went after an attempt that may have run; want none", n)
	}
	// The killed provider's node goes with its session.
	stopProvider(t, srv.Addr(), p1)
}

// TestClientOverride disables one of two providers with an override URL
// under configurators, as Dubbo Admin writes it: within a second the
// client stops picking it, and picks it again once the override goes.
func TestClientOverride(t *testing.T) {
	srv := zktest.Shared(t)
	pa := dubbogotest.StartProvider(t, dubbogotest.ProviderConfig{ZooKeeper: srv.Addr(), Services: []string{"greeter"}})
	defer stopProvider(t, srv.Addr(), pa)
	pb := dubbogotest.StartProvider(t, dubbogotest.ProviderConfig{ZooKeeper: srv.Addr(), Services: []string{"greeter"}})
	defer stopProvider(t, srv.Addr(), pb)
	var mu sync.Mutex
	byAddr := map[string]int{}
	count := func(next proxy.Invoker) proxy.Invoker {
		return func(ctx context.Context, call *proxy.Call) error {
			call.OnAttempt = func(a proxy.AttemptInfo) {
				mu.Lock()
				byAddr[a.Addr]++
				mu.Unlock()
			}
			return next(ctx, call)
		}
	}
	calls := func(addr string) int {
		mu.Lock()
		defer mu.Unlock()
		return byAddr[addr]
	}
	c := newDubboClient(t, srv.Addr(), proxy.WithTimeout(5*time.Second), proxy.WithMiddleware(count))
	greeter, err := dubbo.NewClient(c, greeterInterface, (*Greeter)(nil))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	call := func() {
		t.Helper()
		var got string
		if err := greeter.Call(ctx, "SayHello", []any{"o"}, &got); err != nil || got != "hello o" {
			t.Fatalf("SayHello(o) = %q, %v", got, err)
		}
	}
	picked := func(want ...string) func() bool {
		return func() bool {
			ins, err := c.Instances(ctx, greeterInterface)
			if err != nil || len(ins) != len(want) {
				return false
			}
			for _, in := range ins {
				if !slices.Contains(want, in.Addr) {
					return false
				}
			}
			return true
		}
	}
	both := []string{pa.Addr(), pb.Addr()}
	wait.Until(t, 10*time.Second, 5*time.Millisecond, "calls to reach both providers", func() bool {
		call()
		return calls(pa.Addr()) > 0 && calls(pb.Addr()) > 0
	})

	conn := zktest.Client(t, srv.Addr())
	node := "/dubbo/" + greeterInterface + "/configurators"
	if _, err := conn.Create(node, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
		t.Fatal(err)
	}
	override := node + "/" + url.QueryEscape("override://"+pa.Addr()+"/"+greeterInterface+
		"?category=configurators&disabled=true&dynamic=false&enabled=true")
	if _, err := conn.Create(override, nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, time.Second, 5*time.Millisecond, "the disabled provider to leave the client's instances", picked(pb.Addr()))
	before := calls(pa.Addr())
	for range 100 {
		call()
	}
	if n := calls(pa.Addr()) - before; n != 0 {
		t.Errorf("%d of 100 calls went to the disabled provider %s", n, pa.Addr())
	}

	if err := conn.Delete(override, -1); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, time.Second, 5*time.Millisecond, "the provider to come back once the override went", picked(both...))
	before = calls(pa.Addr())
	wait.Until(t, 10*time.Second, 5*time.Millisecond, "calls to reach the provider again", func() bool {
		call()
		return calls(pa.Addr()) > before
	})
}

// Locator is the Go declaration of com.example.hedge.Locator: where is
// idempotent, take is not.
type Locator interface {
	Where(ctx context.Context) (string, error)
	Take(ctx context.Context) (string, error)
}

// locator serves Locator, answering its name; a slow one answers only
// when the call is cancelled, or after a minute.
type locator struct {
	name      string
	slow      bool
	wheres    atomic.Int64
	takes     atomic.Int64
	cancelled chan struct{} // gets a value for each slow call cancelled
}

func (l *locator) answer(ctx context.Context) (string, error) {
	if !l.slow {
		return l.name, nil
	}
	select {
	case <-ctx.Done():
		l.cancelled <- struct{}{}
		return "", ctx.Err()
	case <-time.After(time.Minute):
		return l.name, nil
	}
}

func (l *locator) Where(ctx context.Context) (string, error) {
	l.wheres.Add(1)
	return l.answer(ctx)
}

func (l *locator) Take(ctx context.Context) (string, error) {
	l.takes.Add(1)
	return l.answer(ctx)
}

// serveLocator serves l as com.example.hedge.Locator on a dabb server, in
// hessian2, and returns its address.
func serveLocator(t *testing.T, l *locator) string {
	t.Helper()
	desc, err := dubbo.Service("com.example.hedge.Locator", l)
	if err != nil {
		t.Fatal(err)
	}
	s := dabb.NewServer()
	if err := s.RegisterService(desc, l); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		s.Close()
		<-done
	})
	return ln.Addr().String()
}

// TestClientHedge: a typed call of an idempotent method with proxy.Hedge,
// over two dabb providers in hessian2, one that never answers, gets its
// answer from the fast one within the hedge delay of the call's start
// (plus scheduling slack), and the slow attempt is cancelled on its
// provider. A method not marked idempotent is never hedged: each call
// makes one attempt, and one that picked the slow provider fails when its
// budget ends.
func TestClientHedge(t *testing.T) {
	slow := &locator{name: "slow", slow: true, cancelled: make(chan struct{}, 64)}
	fast := &locator{name: "fast"}
	const iface = "com.example.hedge.Locator"
	reg := static.New(
		registry.Instance{Service: iface, ID: "slow", Addr: serveLocator(t, slow)},
		registry.Instance{Service: iface, ID: "fast", Addr: serveLocator(t, fast)})
	defer reg.Close()
	c, err := proxy.NewClient(reg, proxy.WithBalancer("round_robin"),
		proxy.WithBreaker(proxy.BreakerConfig{Disabled: true}), proxy.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	loc, err := dubbo.NewClient(c, iface, (*Locator)(nil), dubbo.WithIdempotent("Where"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const delay = 50 * time.Millisecond
	// The slack covers a loaded machine; the slow provider takes a minute.
	const slack = 500 * time.Millisecond
	for i := range 8 {
		start := time.Now()
		var got string
		if err := loc.Call(ctx, "Where", nil, &got, proxy.Hedge(delay), proxy.Timeout(10*time.Second)); err != nil {
			t.Fatalf("hedged call %d: %v", i, err)
		}
		if got != "fast" {
			t.Fatalf("hedged call %d answered by %q", i, got)
		}
		if took := time.Since(start); took > delay+slack {
			t.Fatalf("hedged call %d took %v; want the fast answer within the hedge delay %v (+%v)", i, took, delay, slack)
		}
	}
	hedged := slow.wheres.Load()
	if hedged == 0 {
		t.Fatal("no attempt went to the slow provider: the test proves nothing")
	}
	if fast.wheres.Load() != 8 {
		t.Errorf("the fast provider ran %d calls of where, want all 8", fast.wheres.Load())
	}
	for range hedged {
		select {
		case <-slow.cancelled:
		case <-ctx.Done():
			t.Fatalf("not every one of the %d slow attempts was cancelled on its provider", hedged)
		}
	}

	// take is not idempotent: Hedge is ignored, one attempt per call.
	var failed int
	for range 4 {
		var got string
		err := loc.Call(ctx, "Take", nil, &got, proxy.Hedge(10*time.Millisecond), proxy.Timeout(300*time.Millisecond))
		switch {
		case err == nil && got == "fast":
		case protocol.StatusOf(err) == protocol.StatusClientTimeout || protocol.StatusOf(err) == protocol.StatusServerTimeout:
			failed++
		default:
			t.Fatalf("take = %q, %v; want fast's answer or a timeout", got, err)
		}
	}
	if ran := slow.takes.Load() + fast.takes.Load(); ran != 4 {
		t.Fatalf("4 calls of take, not idempotent, with Hedge ran %d attempts; want 4", ran)
	}
	if failed == 0 || int64(failed) != slow.takes.Load() {
		t.Fatalf("%d calls of take failed and the slow provider ran %d: want each call it got to fail, none hedged", failed, slow.takes.Load())
	}
}
