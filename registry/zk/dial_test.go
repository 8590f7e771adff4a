// Tests of the dialer: silent servers neither stall a session nor Close.

package zk

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/zktest"
)

// blackhole accepts TCP connections and never answers, like a server that
// is starting or hung.
func blackhole(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return l.Addr().String()
}

// TestSilentServerDoesNotStallSession: with a silent server and a live one
// in the list, a session is established promptly whichever the client
// tries first. Several clients, since each shuffles the list.
func TestSilentServerDoesNotStallSession(t *testing.T) {
	servers := []string{blackhole(t), zktest.Shared(t).Addr()}
	const sessionTimeout = 2 * time.Second // handshake cap: 1 s per server
	svc := serviceFor(t)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := range 4 {
		r := newRegistry(t, Config{Servers: servers, SessionTimeout: sessionTimeout, RequestTimeout: 5 * time.Second})
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			err := r.Register(ctxFor(t, 5*time.Second), inst(svc, string(rune('1'+i))))
			if err == nil && time.Since(start) > 4*time.Second {
				t.Errorf("client %d: session took %v", i, time.Since(start))
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("Register with a silent server in the list: %v", err)
		}
	}
}

// TestCloseCutsStuckHandshake: Close does not wait for a handshake with a
// silent server to time out.
func TestCloseCutsStuckHandshake(t *testing.T) {
	r := newRegistry(t, Config{Servers: []string{blackhole(t)}, SessionTimeout: 20 * time.Second, RequestTimeout: 300 * time.Millisecond})
	if err := r.Register(ctxFor(t, 5*time.Second), inst(serviceFor(t), "1")); err == nil {
		t.Fatal("Register succeeded against a silent server")
	}
	start := time.Now()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("Close took %v while a handshake was stuck (cap %v)", took, r.dialer.handshakeBound())
	}
}
