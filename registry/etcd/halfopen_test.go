package etcd

import (
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/etcdtest"
	"github.com/dabbrpc/dabb/registry"
)

// freezingProxy forwards TCP to an address until freeze: from then on it
// forwards nothing and closes nothing, as a host that vanished without a
// FIN or a route that drops packets.
type freezingProxy struct {
	l      net.Listener
	target string
	frozen chan struct{}
	once   sync.Once
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  []net.Conn
}

func startFreezingProxy(t *testing.T, target string) *freezingProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &freezingProxy{l: l, target: target, frozen: make(chan struct{})}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		p.l.Close()
		p.freeze()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *freezingProxy) addr() string { return p.l.Addr().String() }

func (p *freezingProxy) freeze() { p.once.Do(func() { close(p.frozen) }) }

func (p *freezingProxy) accept() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.conns = append(p.conns, c)
		p.mu.Unlock()
		select {
		case <-p.frozen:
			continue // accepted and never answered
		default:
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, up)
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(up, c) })
		p.wg.Go(func() { p.pipe(c, up) })
	}
}

// pipe copies from src to dst until freeze or an error; once frozen it
// drops what it reads, so neither side sees the connection end.
func (p *freezingProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-p.frozen:
			n = 0
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// TestHalfOpenConnectionIsAnOutage: when the path to etcd silently stops
// carrying packets (no FIN, no RST), the keepalive pings notice: the
// watcher reports the outage instead of staying quiet for as long as TCP
// takes to give up (~15 minutes).
func TestHalfOpenConnectionIsAnOutage(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	p := startFreezingProxy(t, srv.Endpoint())
	r, err := New(Config{Endpoints: []string{p.addr()}, RequestTimeout: time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	provider := newRegistry(t, srv, Config{})
	svc := service(t)
	ctx := ctxFor(t, 60*time.Second)
	if err := provider.Register(ctx, registry.Instance{Service: svc, ID: "a", Addr: "127.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	w, err := r.Watch(ctx, svc)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	waitSet(t, w, 5*time.Second, "before the path goes silent", "a")

	p.freeze()
	frozen := time.Now()
	got, err := w.Next(ctxFor(t, 40*time.Second))
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Next after the path went silent = %v, %v; want an error wrapping ErrUnavailable within 40s", ids(got), err)
	}
	t.Logf("outage reported %v after the path went silent", time.Since(frozen).Round(100*time.Millisecond))
}
