package zk

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/zktest"
	"github.com/dabbrpc/dabb/registry"
)

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
