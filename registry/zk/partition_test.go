package zk

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/zktest"
	"github.com/dabbrpc/dabb/registry"
	"github.com/go-zookeeper/zk"
)

// proxy forwards TCP connections to a server until cut, simulating a
// network partition between one client and ZooKeeper, or frozen: then it
// holds what it reads, and closes nothing, as a server that hangs.
type proxy struct {
	l      net.Listener
	target string
	wg     sync.WaitGroup

	mu     sync.Mutex // guards following
	cut    bool
	conns  map[net.Conn]struct{}
	thawed chan struct{} // closed unless frozen
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l, target: target, conns: make(map[net.Conn]struct{}), thawed: make(chan struct{})}
	close(p.thawed)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		l.Close()
		p.Cut()
		p.wg.Wait()
	})
	return p
}

func (p *proxy) Addr() string { return p.l.Addr().String() }

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		cut := p.cut
		p.mu.Unlock()
		if cut {
			c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[s] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, s)
		go p.pipe(s, c)
	}
}

func (p *proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.waitThawed() {
				break
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// waitThawed waits while the proxy is frozen; false once it is cut.
func (p *proxy) waitThawed() bool {
	for {
		p.mu.Lock()
		cut, thawed := p.cut, p.thawed
		p.mu.Unlock()
		if cut {
			return false
		}
		select {
		case <-thawed:
			return true
		default:
		}
		<-thawed // Cut thaws too
	}
}

// Cut closes every forwarded connection and refuses new ones.
func (p *proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		c.Close()
	}
	p.thawLocked()
}

// Freeze makes the proxy hold what it reads until Thaw, closing nothing.
func (p *proxy) Freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.thawed:
		p.thawed = make(chan struct{})
	default:
	}
}

// Thaw forwards again, what was held first.
func (p *proxy) Thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.thawLocked()
}

func (p *proxy) thawLocked() {
	select {
	case <-p.thawed:
	default:
		close(p.thawed)
	}
}

// Restore forwards new connections again.
func (p *proxy) Restore() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

// TestPartitionLongerThanSession: a client cut off from ZooKeeper longer
// than its session timeout keeps its watcher's last set while cut off, and
// the watcher reports the outage once it has lasted the session timeout;
// when the network heals the client gets a new session, registers its
// instance again without being asked, and its watcher catches up with what
// changed meanwhile.
func TestPartitionLongerThanSession(t *testing.T) {
	srv := zktest.Shared(t)
	px := startProxy(t, srv.Addr())
	const sessionTimeout = time.Second
	cutOff := newRegistry(t, Config{Servers: []string{px.Addr()}, SessionTimeout: sessionTimeout, RequestTimeout: 2 * time.Second})
	other := shared(t)
	svc := serviceFor(t)
	a, b, c := inst(svc, "20001"), inst(svc, "20002"), inst(svc, "20003")
	if err := other.Register(ctxFor(t, 5*time.Second), a); err != nil {
		t.Fatal(err)
	}
	if err := cutOff.Register(ctxFor(t, 5*time.Second), c); err != nil {
		t.Fatal(err)
	}
	w, err := cutOff.Watch(ctxFor(t, 5*time.Second), svc)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	waitSet(t, w, time.Second, "before the partition", a, c)
	ow, err := other.Watch(ctxFor(t, 5*time.Second), svc)
	if err != nil {
		t.Fatal(err)
	}
	defer ow.Stop()
	waitSet(t, ow, time.Second, "the other client, before the partition", a, c)
	oldSession := cutOff.sess.conn.SessionID()

	cut := time.Now() // before: the client may see the cut first
	px.Cut()
	if err := other.Register(ctxFor(t, 5*time.Second), b); err != nil {
		t.Fatal(err)
	}
	// The cut-off client's node vanishes once the server expires its session.
	took := waitSet(t, ow, sessionTimeout+3*time.Second, "the cut-off client's session expires", a, b)
	t.Logf("cut-off client's session expired after %v", took)
	// The cut-off watcher reports the outage instead of the new set.
	ctx, cancel := context.WithDeadline(context.Background(), cut.Add(sessionTimeout+2*time.Second))
	got, err := w.Next(ctx)
	cancel()
	if !errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("cut-off watcher returned %v, %v within %v of the cut; want an error wrapping registry.ErrUnavailable", got, err, sessionTimeout+2*time.Second)
	}
	if since := time.Since(cut); since < sessionTimeout {
		t.Fatalf("cut-off watcher reported the outage %v after the cut, before the session timeout (%v)", since, sessionTimeout)
	}

	px.Restore()
	healed := time.Now()
	waitSet(t, ow, 5*time.Second, "the cut-off client registers again", a, b, c)
	waitSet(t, w, 5*time.Second-time.Since(healed), "the cut-off watcher catches up", a, b, c)
	newSession := cutOff.sess.conn.SessionID()
	if newSession == oldSession || cutOff.sess.conn.State() != zk.StateHasSession {
		t.Fatalf("session %#x (state %v) after the partition, want a new one (old %#x)", newSession, cutOff.sess.conn.State(), oldSession)
	}
	_, stat, err := rawConn(t, srv.Addr()).Get(cutOff.NodePath(svc, c.ID))
	if err != nil || stat.EphemeralOwner != newSession {
		t.Fatalf("re-registered node: err %v, owner %#x; want owner %#x", err, stat.EphemeralOwner, newSession)
	}
	t.Logf("healed: re-registered and caught up within %v", time.Since(healed))
}

// TestMultiReportsFailingOp: a failed transaction reports the error of the
// operation that failed, which ensure relies on to retry.
func TestMultiReportsFailingOp(t *testing.T) {
	conn := rawConn(t, zktest.Shared(t).Addr())
	p := "/multi-test-" + time.Now().Format("150405.000000")
	if _, err := conn.Create(p, []byte("x"), zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		ops  []any
		want error
	}{
		{"BadVersion", []any{
			&zk.DeleteRequest{Path: p, Version: 7},
			&zk.CreateRequest{Path: p, Data: []byte("y"), Acl: zk.WorldACL(zk.PermAll), Flags: zk.FlagEphemeral},
		}, zk.ErrBadVersion},
		{"NodeExists", []any{
			&zk.CreateRequest{Path: p + "-other", Acl: zk.WorldACL(zk.PermAll), Flags: zk.FlagEphemeral},
			&zk.CreateRequest{Path: p, Acl: zk.WorldACL(zk.PermAll), Flags: zk.FlagEphemeral},
		}, zk.ErrNodeExists},
		{"Replace", []any{
			&zk.DeleteRequest{Path: p, Version: 0},
			&zk.CreateRequest{Path: p, Data: []byte("y"), Acl: zk.WorldACL(zk.PermAll), Flags: zk.FlagEphemeral},
		}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := multi(conn, tt.ops...); !errors.Is(err, tt.want) {
				t.Fatalf("multi = %v, want %v", err, tt.want)
			}
		})
	}
	if data, _, err := conn.Get(p); err != nil || string(data) != "y" {
		t.Fatalf("after the transactions %s = %q, %v; want %q", p, data, err, "y")
	}
	if ok, _, _ := conn.Exists(p + "-other"); ok {
		t.Fatal("a failed transaction left its first operation applied")
	}
}
