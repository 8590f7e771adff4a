// Tests of the session: outages, partitions and the session timeout granted.

package zk

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/wait"
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

// startWithTick starts a ZooKeeper server whose tickTime is tick and whose
// session timeouts are bounded as ZooKeeper does by default, by 2 and 20
// ticks (zktest's servers accept 400 ms to 60 s): it rewrites the zoo.cfg
// zktest wrote and starts the server again.
func startWithTick(t *testing.T, tick time.Duration) *zktest.Server {
	t.Helper()
	srv := zktest.Start(t)
	srv.Stop()
	path := filepath.Join(srv.Dir(), "zoo.cfg")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	found := false
	for line := range strings.SplitSeq(string(b), "\n") {
		switch key, _, _ := strings.Cut(line, "="); key {
		case "tickTime":
			line, found = "tickTime="+strconv.Itoa(int(tick/time.Millisecond)), true
		case "minSessionTimeout", "maxSessionTimeout":
			continue
		}
		lines = append(lines, line)
	}
	if !found {
		t.Fatalf("no tickTime in %s:\n%s", path, b)
	}
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	srv.Start(t)
	return srv
}

// firstLookup makes a new cache's first lookup of a new service through r
// and returns its error, which the lookup must have.
func firstLookup(t *testing.T, r *Registry, cfg registry.CacheConfig) error {
	t.Helper()
	cfg.Logger = slog.New(slog.DiscardHandler)
	c := registry.NewCache(r, cfg)
	defer c.Close()
	ins, err := c.Instances(ctxFor(t, 10*time.Second), serviceFor(t))
	if err == nil {
		t.Fatalf("Instances = %v, want an error", ins)
	}
	if !errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("Instances = %v, want an error wrapping registry.ErrUnavailable", err)
	}
	return err
}

// TestZooKeeperDownFailsFast: with no server, every call returns an error
// that says so within RequestTimeout (or the context's deadline, when it
// is earlier), and Close does not hang.
func TestZooKeeperDownFailsFast(t *testing.T) {
	const requestTimeout = 400 * time.Millisecond
	const slack = 1500 * time.Millisecond // scheduling on a loaded machine
	r := newRegistry(t, Config{Servers: []string{deadAddr(t)}, RequestTimeout: requestTimeout})
	svc := serviceFor(t)
	calls := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"Register", func(ctx context.Context) error { return r.Register(ctx, inst(svc, "1")) }},
		{"Deregister", func(ctx context.Context) error { return r.Deregister(ctx, inst(svc, "1")) }},
		{"Watch", func(ctx context.Context) error {
			w, err := r.Watch(ctx, svc)
			if err == nil {
				w.Stop()
			}
			return err
		}},
	}
	ctxs := []struct {
		name  string
		ctx   func() (context.Context, context.CancelFunc)
		bound time.Duration
	}{
		{"Background", func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }, requestTimeout},
		{"ShortDeadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 100*time.Millisecond)
		}, 100 * time.Millisecond},
	}
	for _, c := range calls {
		for _, cc := range ctxs {
			t.Run(c.name+"/"+cc.name, func(t *testing.T) {
				ctx, cancel := cc.ctx()
				defer cancel()
				start := time.Now()
				err := c.call(ctx)
				took := time.Since(start)
				if err == nil {
					t.Fatal("succeeded with ZooKeeper down")
				}
				if !errors.Is(err, ErrNoSession) || !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("err = %v, want ErrNoSession and context.DeadlineExceeded", err)
				}
				if took > cc.bound+slack {
					t.Fatalf("returned after %v, want within %v", took, cc.bound+slack)
				}
			})
		}
	}
	start := time.Now()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Close took %v with ZooKeeper down", took)
	}
}

// TestNoSessionIsUnavailable: ErrNoSession is also
// registry.ErrUnavailable, as the registry package documents for every
// backend.
func TestNoSessionIsUnavailable(t *testing.T) {
	r := newRegistry(t, Config{Servers: []string{deadAddr(t)}, RequestTimeout: 200 * time.Millisecond})
	err := r.Register(context.Background(), inst(serviceFor(t), "1"))
	if !errors.Is(err, ErrNoSession) {
		t.Fatalf("Register with ZooKeeper down = %v, want ErrNoSession", err)
	}
	if !errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("Register with ZooKeeper down = %v: errors.Is(err, registry.ErrUnavailable) is false", err)
	}
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

// TestOutageFollowsGrantedSessionTimeout: ZooKeeper grants a session
// timeout between 2 and 20 ticks whatever the client asks for; a watcher
// cut off from it reports the outage once the session has been down for
// the timeout granted (by then ZooKeeper has expired it), neither earlier
// nor later, and the handshake bound follows it too.
func TestOutageFollowsGrantedSessionTimeout(t *testing.T) {
	tests := []struct {
		name     string
		tick     time.Duration
		ask      time.Duration
		granted  time.Duration
		tooEarly bool // asking for less than granted would report the outage early
	}{
		{"granted longer than asked", time.Second, 500 * time.Millisecond, 2 * time.Second, true},
		{"granted shorter than asked", 100 * time.Millisecond, 8 * time.Second, 2 * time.Second, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := startWithTick(t, tt.tick)
			px := startProxy(t, srv.Addr())
			r := newRegistry(t, Config{Servers: []string{px.Addr()}, SessionTimeout: tt.ask, RequestTimeout: 5 * time.Second})
			if got := r.SessionTimeout(); got != tt.ask {
				t.Fatalf("SessionTimeout before any session = %v, want the one asked for, %v", got, tt.ask)
			}
			w, err := r.Watch(ctxFor(t, 10*time.Second), serviceFor(t))
			if err != nil {
				t.Fatal(err)
			}
			defer w.Stop()
			waitSet(t, w, time.Second, "before the cut")
			if got := r.SessionTimeout(); got != tt.granted {
				t.Fatalf("SessionTimeout = %v after asking for %v with tickTime %v; want the %v ZooKeeper granted", got, tt.ask, tt.tick, tt.granted)
			}
			if got := r.dialer.handshakeBound(); got != tt.granted {
				t.Fatalf("handshake bound = %v, want the granted session timeout (one server), %v", got, tt.granted)
			}

			cut := time.Now() // before: the client may see the cut first
			px.Cut()
			ctx, cancel := context.WithTimeout(context.Background(), tt.granted+3*time.Second)
			defer cancel()
			got, err := w.Next(ctx)
			took := time.Since(cut)
			if !errors.Is(err, ErrNoSession) || !errors.Is(err, registry.ErrUnavailable) {
				t.Fatalf("Next %v after the cut = %v, %v; want the outage reported (ErrNoSession) after the granted session timeout, %v (asked for %v)",
					took, got, err, tt.granted, tt.ask)
			}
			if took < tt.granted {
				t.Fatalf("the outage was reported %v after the cut, before the session timeout ZooKeeper granted (%v; asked for %v)", took, tt.granted, tt.ask)
			}
			if want := "for " + tt.granted.String() + " (session timeout)"; !strings.Contains(err.Error(), want) {
				t.Errorf("outage error %q does not say %q", err, want)
			}
			t.Logf("outage reported %v after the cut (asked %v, granted %v)", took.Round(10*time.Millisecond), tt.ask, tt.granted)
		})
	}
}

// TestCacheStaleDuringOutage: a Cache over zk says its instances are
// stale once ZooKeeper has been down for the session timeout, keeps
// serving them meanwhile, and is not stale once ZooKeeper is back.
func TestCacheStaleDuringOutage(t *testing.T) {
	srv := zktest.Start(t)
	const sessionTimeout = 2 * time.Second
	cfg := Config{Servers: []string{srv.Addr()}, SessionTimeout: sessionTimeout, RequestTimeout: 500 * time.Millisecond}
	provider, consumer := newRegistry(t, cfg), newRegistry(t, cfg)
	svc := serviceFor(t)
	a := inst(svc, "20001")
	if err := provider.Register(ctxFor(t, 5*time.Second), a); err != nil {
		t.Fatal(err)
	}
	c := registry.NewCache(consumer, registry.CacheConfig{
		Logger:        slog.New(slog.DiscardHandler),
		MinRetryDelay: 50 * time.Millisecond,
		MaxRetryDelay: 200 * time.Millisecond,
	})
	defer c.Close()
	if ins, err := c.Instances(ctxFor(t, 5*time.Second), svc); err != nil || !registry.EqualSets(ins, []registry.Instance{a}) {
		t.Fatalf("Instances before the outage = %v, %v; want [%v]", ins, err, a)
	}

	stopped := time.Now() // before: the client may see the end first
	srv.Stop()
	wait.Until(t, sessionTimeout+3*time.Second, 10*time.Millisecond, "Cache.Stale with ZooKeeper down", func() bool { return c.Stale(svc) })
	if down := time.Since(stopped); down < sessionTimeout {
		t.Fatalf("Stale after %v, before the session timeout (%v)", down, sessionTimeout)
	}
	if ins, err := c.Instances(ctxFor(t, time.Second), svc); err != nil || !registry.EqualSets(ins, []registry.Instance{a}) {
		t.Fatalf("Instances during the outage = %v, %v; want the last known [%v]", ins, err, a)
	}

	srv.Start(t)
	wait.Until(t, 15*time.Second, 10*time.Millisecond, "Cache.Stale to clear after ZooKeeper restarted", func() bool { return !c.Stale(svc) })
	if ins, err := c.Instances(ctxFor(t, time.Second), svc); err != nil || !registry.EqualSets(ins, []registry.Instance{a}) {
		t.Fatalf("Instances after the outage = %v, %v; want [%v]", ins, err, a)
	}
}

// TestCacheSaysZooKeeperUnreachable: the first lookup of a service while
// ZooKeeper refuses connections (stopped after the client had a session,
// or never there) says that it could not be reached, naming its address:
// the client retries on its own, so the watch has not failed by then, and
// "no answer" would not tell an unreachable ZooKeeper from a slow one.
func TestCacheSaysZooKeeperUnreachable(t *testing.T) {
	check := func(t *testing.T, r *Registry, addr string) {
		t.Helper()
		// Defaults: RequestTimeout 3 s, InitialTimeout 500 ms.
		err := firstLookup(t, r, registry.CacheConfig{})
		msg := err.Error()
		if !errors.Is(err, ErrNoSession) || !strings.Contains(msg, "could not be reached") || !strings.Contains(msg, addr) || strings.Contains(msg, "no answer") {
			t.Fatalf("Instances with ZooKeeper at %s refusing connections = %q; want it to say that %s could not be reached (wrapping ErrNoSession)", addr, msg, addr)
		}
		t.Logf("%v", err)
	}
	t.Run("stopped", func(t *testing.T) {
		srv := zktest.Start(t)
		r := newRegistry(t, Config{Servers: []string{srv.Addr()}})
		w, err := r.Watch(ctxFor(t, 5*time.Second), serviceFor(t))
		if err != nil {
			t.Fatal(err)
		}
		w.Stop()
		srv.Stop()
		check(t, r, srv.Addr())
	})
	t.Run("nothing listening", func(t *testing.T) {
		addr := deadAddr(t)
		check(t, newRegistry(t, Config{Servers: []string{addr}}), addr)
	})
}

// TestCacheSaysSilentZooKeeperDidNotAnswer: with the client connected,
// and its session live, but ZooKeeper not answering (hung), the first
// lookup says that it did not answer, not that it could not be reached.
func TestCacheSaysSilentZooKeeperDidNotAnswer(t *testing.T) {
	px := startProxy(t, zktest.Shared(t).Addr())
	// The client gives up on a silent server after two thirds of the
	// session timeout: well after the lookup.
	r := newRegistry(t, Config{Servers: []string{px.Addr()}, SessionTimeout: 10 * time.Second})
	w, err := r.Watch(ctxFor(t, 5*time.Second), serviceFor(t))
	if err != nil {
		t.Fatal(err)
	}
	w.Stop()
	px.Freeze()
	defer px.Thaw()
	err = firstLookup(t, r, registry.CacheConfig{InitialTimeout: 300 * time.Millisecond})
	if msg := err.Error(); !strings.Contains(msg, "no answer within 300ms") || strings.Contains(msg, "could not be reached") {
		t.Fatalf("Instances with ZooKeeper connected but silent = %q; want it to say there was no answer within 300ms", msg)
	}
}
