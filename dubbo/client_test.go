package dubbo_test

import (
	"context"
	"errors"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dabbrpc/dabb/dubbo"
	"github.com/dabbrpc/dabb/dubbo/internal/dubbogotest"
	"github.com/dabbrpc/dabb/internal/wait"
	"github.com/dabbrpc/dabb/internal/zktest"
	"github.com/dabbrpc/dabb/proxy"
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
