package frameworks

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dabbrpc/dabb/bench/internal/leaktest"

	benchpb "github.com/dabbrpc/dabb/bench/proto"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, leaktest.Ignore()...)
}

// TestEcho runs the workload on every framework in this process: small and
// large messages, from several goroutines on one client. A framework with
// a program of its own runs as processes: TestProgram covers it.
func TestEcho(t *testing.T) {
	for _, f := range append(append(All(), Extra()...), Dubbo()...) {
		if f.Program != "" {
			continue
		}
		t.Run(f.Name, func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv, err := f.Serve(l)
			if err != nil {
				t.Fatal(err)
			}
			c, err := f.Dial(l.Addr().String())
			if err != nil {
				srv.Close()
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			errs := make(chan error, 64)
			for g := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 20 {
						size := 0
						if i == 3 && g < 2 {
							size = 1 << 20
						}
						req := benchpb.NewMessage(size)
						reply, err := c.Echo(ctx, req)
						if err == nil {
							err = benchpb.Check(req, reply)
						}
						if err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Errorf("%s: echo: %v", f.Name, err)
			}
			if err := c.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
				t.Errorf("client close: %v", err)
			}
			if err := srv.Close(); err != nil {
				t.Errorf("server close: %v", err)
			}
		})
	}
}

func TestLookup(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{{"dabb", true}, {"raw", true}, {"raw-conn", true}, {"dabb-tls", true}, {"grpc-tls", true}, {"dabb-hessian2", true}, {"dubbo-go", true}, {"thrift", false}} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Lookup(tc.name)
			if tc.ok && (err != nil || f.Name != tc.name) {
				t.Fatalf("Lookup(%q) = %q, %v", tc.name, f.Name, err)
			}
			if !tc.ok && !errors.Is(err, ErrUnknown) {
				t.Fatalf("Lookup(%q) error = %v, want ErrUnknown", tc.name, err)
			}
		})
	}
}
