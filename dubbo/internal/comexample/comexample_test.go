package comexample

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dabbrpc/dabb/dubbo"
	"github.com/dabbrpc/dabb/dubbo/internal/dubbogotest"
	"github.com/dabbrpc/dabb/internal/zktest"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
)

// TestMain starts one ZooKeeper server for the package's tests, removes
// the peer program afterwards, and checks for leaked goroutines.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(dubbogotest.WithPeer(zktest.WithShared(m)))
}

// TestGeneratedClientDubbogo calls the dubbo-go provider, found in
// ZooKeeper, through the generated clients: methods of primitives, POJO
// methods, one that throws, and 1,000 calls from 8 goroutines with none
// failing.
func TestGeneratedClientDubbogo(t *testing.T) {
	srv := zktest.Shared(t)
	p := dubbogotest.StartProvider(t, dubbogotest.ProviderConfig{ZooKeeper: srv.Addr()})
	defer p.Stop()
	reg, err := registry.Open(context.Background(), "zookeeper://"+srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	var mu sync.Mutex
	calls := map[string]proxy.Call{} // copies: a Call is not kept after it returns
	record := func(next proxy.Invoker) proxy.Invoker {
		return func(ctx context.Context, call *proxy.Call) error {
			mu.Lock()
			calls[call.Method] = *call
			mu.Unlock()
			return next(ctx, call)
		}
	}
	c, err := proxy.NewClient(reg, proxy.WithTimeout(5*time.Second), proxy.WithMiddleware(record),
		proxy.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	greeter, err := NewGreeterDubboClient(c)
	if err != nil {
		t.Fatal(err)
	}
	inv, err := NewInventoryServiceDubboClient(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	if s, err := greeter.SayHello(ctx, "typed"); s != "hello typed" || err != nil {
		t.Fatalf("sayHello(typed) = %q, %v; want hello typed", s, err)
	}
	if r, err := greeter.Greet(ctx, &HelloRequest{Name: "pojo"}); err != nil || r == nil || *r != (HelloReply{Message: "hello pojo", Length: 10}) {
		t.Errorf("greet(pojo) = %+v, %v; want hello pojo, length 10", r, err)
	}
	_, err = greeter.Fail(ctx, "typed failure")
	var exc *dubbo.Exception
	if !errors.Is(err, proxy.ErrServiceError) || !errors.As(err, &exc) ||
		exc.Class != dubbo.RuntimeException || exc.Message != "typed failure" {
		t.Errorf("fail(typed failure) = %v; want ErrServiceError, java.lang.RuntimeException: typed failure", err)
	}

	stock, err := inv.Stock(ctx, 10086)
	if err != nil || stock <= 0 {
		t.Fatalf("stock(10086) = %d, %v; want units left", stock, err)
	}
	if ok, err := inv.Deduct(ctx, 10086, 3); !ok || err != nil {
		t.Errorf("deduct(10086, 3) = %v, %v; want true", ok, err)
	}
	r, err := inv.DeductOnce(ctx, &DeductRequest{Sku: "10086", Count: 2, RequestID: "generated-1"})
	if err != nil || r == nil || *r != (DeductReply{Remaining: stock - 5}) {
		t.Errorf("deductOnce = %+v, %v; want remaining %d", r, err, stock-5)
	}
	if again, err := inv.DeductOnce(ctx, &DeductRequest{Sku: "10086", Count: 2, RequestID: "generated-1"}); err != nil || again == nil || !again.Duplicate {
		t.Errorf("deductOnce again = %+v, %v; want a duplicate", again, err)
	}
	_, err = inv.Stock(ctx, 42)
	if !errors.As(err, &exc) || exc.Class != dubbo.IllegalArgumentException || !strings.Contains(exc.Message, "42") {
		t.Errorf("stock(42) = %v; want java.lang.IllegalArgumentException naming the sku", err)
	}

	mu.Lock()
	greet, deduct := calls["greet"], calls["deduct"]
	mu.Unlock()
	if !greet.Idempotent || greet.Timeout != 10*time.Second {
		t.Errorf("greet's call: idempotent %v, timeout %v; want true, 10s (its directives)", greet.Idempotent, greet.Timeout)
	}
	if deduct.Idempotent || deduct.Timeout != 5*time.Second {
		t.Errorf("deduct's call: idempotent %v, timeout %v; want false, the client's 5s", deduct.Idempotent, deduct.Timeout)
	}

	t.Run("1000 calls", func(t *testing.T) {
		const n, k = 1000, 8
		var failed, next atomic.Int64
		var once sync.Once
		var wg sync.WaitGroup
		for range k {
			wg.Go(func() {
				for next.Add(1) <= n {
					if s, err := greeter.SayHello(ctx, "load"); err != nil || s != "hello load" {
						failed.Add(1)
						once.Do(func() { t.Errorf("sayHello(load) = %q, %v", s, err) })
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

// TestGeneratedCodeIsFresh regenerates the generated files into a
// temporary directory and compares: the committed stubs must be what
// rpcgen makes of the declarations today.
func TestGeneratedCodeIsFresh(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the generator")
	}
	for typ, file := range map[string]string{"Greeter": "greeter_dabb.go", "InventoryService": "inventoryservice_dabb.go"} {
		out := filepath.Join(t.TempDir(), file)
		cmd := exec.Command("go", "run", "github.com/dabbrpc/dabb/cmd/rpcgen", "-type", typ, "-output", out)
		if msg, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("rpcgen: %v\n%s", err, msg)
		}
		got, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run go generate ./dubbo/internal/comexample/", file)
		}
	}
}
