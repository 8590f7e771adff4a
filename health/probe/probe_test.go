package probe_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/health/probe"
	"github.com/dabbrpc/dabb/internal/wait"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
	_ "github.com/dabbrpc/dabb/registry/etcd"
	"github.com/dabbrpc/dabb/registry/static"
	"github.com/dabbrpc/dabb/transport"
)

const testTimeout = 10 * time.Second

var quiet = slog.New(slog.DiscardHandler)

// waiter is a JSON test service whose method Hold answers at once, or
// once released when the request asks it to block.
type waiter struct {
	started chan struct{}
	release chan struct{}
}

type holdRequest struct {
	Block bool `json:"block"`
}

type holdReply struct {
	OK bool `json:"ok"`
}

var waiterDesc = dabb.ServiceDesc{
	Name: "test.Waiter",
	Methods: []dabb.MethodDesc{{
		Name: "Hold",
		Handler: func(srv any, ctx context.Context, dec func(any) error) (any, error) {
			req := new(holdRequest)
			if err := dec(req); err != nil {
				return nil, err
			}
			w := srv.(*waiter)
			if req.Block {
				w.started <- struct{}{}
				select {
				case <-w.release:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			return &holdReply{OK: true}, nil
		},
	}},
}

// newServer returns a server with opts serving a waiter, which it
// returns too.
func newServer(t *testing.T, opts ...dabb.Option) (*dabb.Server, *waiter) {
	t.Helper()
	s := dabb.NewServer(append([]dabb.Option{dabb.WithLogger(quiet)}, opts...)...)
	w := &waiter{started: make(chan struct{}, 1), release: make(chan struct{})}
	if err := s.RegisterService(&waiterDesc, w); err != nil {
		t.Fatal(err)
	}
	return s, w
}

// serving is a Serve running on a loopback port.
type serving struct {
	addr string
	done chan error
	once sync.Once
	err  error
}

// wait waits for Serve to return, and returns what it returned.
func (sv *serving) wait() error {
	sv.once.Do(func() { sv.err = <-sv.done })
	return sv.err
}

// serve runs s on a loopback port until the test ends, and waits until it
// is live.
func serve(t *testing.T, s *dabb.Server) *serving {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sv := &serving{addr: l.Addr().String(), done: make(chan error, 1)}
	go func() { sv.done <- s.Serve(l) }()
	t.Cleanup(func() {
		s.Close()
		if err := sv.wait(); !errors.Is(err, dabb.ErrServerClosed) {
			t.Errorf("Serve = %v, want ErrServerClosed", err)
		}
	})
	// Serve's start is announced by nothing but Live itself.
	wait.Until(t, testTimeout, time.Millisecond, "the server to be live", func() bool { return s.Live() == nil })
	return sv
}

// get requests url with method and returns the status and body.
func get(t *testing.T, method, url string) (int, string, http.Header) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", method, url, err)
	}
	return resp.StatusCode, string(body), resp.Header
}

// want fails the test unless GET url answers status and body.
func want(t *testing.T, url string, status int, body string) {
	t.Helper()
	got, b, _ := get(t, http.MethodGet, url)
	if got != status || b != body {
		t.Fatalf("GET %s = %d %q, want %d %q", url, got, b, status, body)
	}
}

// probes serves p's probes under /healthz/ and returns that URL.
func probes(t *testing.T, p probe.Prober) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/healthz/", probe.Handler(p))
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	return hs.URL + "/healthz"
}

// TestHandlerWithoutRegistry: a server with no registry is live and ready
// once it serves; set not serving as a whole, it stays live and is not
// ready.
func TestHandlerWithoutRegistry(t *testing.T) {
	s, _ := newServer(t)
	url := probes(t, s)
	want(t, url+"/live", http.StatusServiceUnavailable, "not live: dabb: no Serve running\n")
	want(t, url+"/ready", http.StatusServiceUnavailable, "not ready: dabb: no Serve running\n")

	serve(t, s)
	want(t, url+"/live", http.StatusOK, "live\n")
	want(t, url+"/ready", http.StatusOK, "ready\n")

	s.SetServing("", false)
	want(t, url+"/ready", http.StatusServiceUnavailable, "not ready: dabb: set not serving (SetServing)\n")
	want(t, url+"/live", http.StatusOK, "live\n")
	s.SetServing(waiterDesc.Name, true) // another service: the probe reads the server's own status
	want(t, url+"/ready", http.StatusServiceUnavailable, "not ready: dabb: set not serving (SetServing)\n")
	s.SetServing("", true)
	want(t, url+"/ready", http.StatusOK, "ready\n")
}

// TestHandlerWithRegistry: a server is ready once every service is
// published; one serving but not published (its registry unreachable,
// publishing in the background) is live and not ready.
func TestHandlerWithRegistry(t *testing.T) {
	t.Run("published", func(t *testing.T) {
		reg := static.New()
		s, _ := newServer(t, dabb.WithRegistry(reg))
		url := probes(t, s)
		addr := serve(t, s).addr
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		w, err := reg.Watch(ctx, waiterDesc.Name)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		// Serve publishes in its own goroutine: the first set may be the
		// empty one from before.
		for {
			set, err := w.Next(ctx)
			if err != nil {
				t.Fatalf("waiting for the registry to list the server at %s: %v", addr, err)
			}
			if len(set) == 1 && set[0].Addr == addr {
				break
			}
			if len(set) > 1 {
				t.Fatalf("the registry lists %v, want the server at %s alone", set, addr)
			}
		}
		// The watch may see the instance a moment before Register
		// returns to the server, which then counts it published.
		wait.Until(t, testTimeout, time.Millisecond, "the ready probe to answer 200", func() bool {
			got, _, _ := get(t, http.MethodGet, url+"/ready")
			return got == http.StatusOK
		})
		want(t, url+"/ready", http.StatusOK, "ready\n")
		want(t, url+"/live", http.StatusOK, "live\n")
	})
	t.Run("registry unreachable", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		dead := l.Addr().String()
		l.Close()
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		reg, err := registry.Open(ctx, "etcd://"+dead+"/services?timeout=500ms&dial_timeout=200ms")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { reg.Close() })
		s, _ := newServer(t, dabb.WithRegistry(reg), dabb.WithRegistryCheck(false))
		url := probes(t, s)
		serve(t, s)
		want(t, url+"/live", http.StatusOK, "live\n")
		want(t, url+"/ready", http.StatusServiceUnavailable, "not ready: dabb: not published to the registry\n")
	})
}

// TestHandlerDuringShutdown: once Shutdown began, the server is not ready,
// and it stays live while a call drains, after Serve returned; once
// Shutdown returned it is not live.
func TestHandlerDuringShutdown(t *testing.T) {
	reg := static.New()
	s, w := newServer(t, dabb.WithRegistry(reg))
	url := probes(t, s)
	sv := serve(t, s)
	addr := sv.addr
	readOnly := make(chan struct{})
	var once sync.Once
	c, err := proxy.NewClient(static.New(registry.Instance{Service: waiterDesc.Name, ID: addr, Addr: addr}),
		proxy.WithCodec("json"), proxy.WithLogger(quiet),
		proxy.WithTransport(transport.Config{OnReadOnly: func(string) { once.Do(func() { close(readOnly) }) }}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	held := make(chan error, 1)
	go func() {
		var reply holdReply
		held <- c.Invoke(ctx, waiterDesc.Name, "Hold", &holdRequest{Block: true}, &reply)
	}()
	<-w.started
	want(t, url+"/ready", http.StatusOK, "ready\n")

	shut := make(chan error, 1)
	go func() { shut <- s.Shutdown(ctx) }()
	select {
	case <-readOnly: // the withdrawal is over, and the drain has begun
	case <-ctx.Done():
		t.Fatal("no read-only event after Shutdown began")
	}
	want(t, url+"/ready", http.StatusServiceUnavailable, "not ready: dabb: shutting down\n")
	// Serve returns once the listener is drained, and the call still runs.
	if err := sv.wait(); !errors.Is(err, dabb.ErrServerClosed) {
		t.Errorf("Serve = %v, want ErrServerClosed", err)
	}
	want(t, url+"/live", http.StatusOK, "live\n")

	close(w.release)
	if err := <-held; err != nil {
		t.Errorf("the call in flight: %v", err)
	}
	if err := <-shut; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	want(t, url+"/live", http.StatusServiceUnavailable, "not live: dabb: server stopped\n")
	want(t, url+"/ready", http.StatusServiceUnavailable, "not ready: dabb: shutting down\n")
}

// TestHandlerPaths: the handler answers …/live and …/ready wherever it is
// mounted, GET and HEAD only, in plain text that is not cached.
func TestHandlerPaths(t *testing.T) {
	s, _ := newServer(t)
	serve(t, s)
	url := probes(t, s)
	status, body, h := get(t, http.MethodGet, url+"/ready")
	if status != http.StatusOK || body != "ready\n" {
		t.Errorf("GET /healthz/ready = %d %q", status, body)
	}
	if ct := h.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("Content-Type %q, want text/plain", ct)
	}
	if cc := h.Get("Cache-Control"); cc != "no-store" {
		t.Errorf("Cache-Control %q, want no-store", cc)
	}
	if status, body, _ := get(t, http.MethodHead, url+"/live"); status != http.StatusOK || body != "" {
		t.Errorf("HEAD /healthz/live = %d %q, want 200 and no body", status, body)
	}
	status, body, h = get(t, http.MethodPost, url+"/live")
	if status != http.StatusMethodNotAllowed || h.Get("Allow") != "GET, HEAD" || !strings.Contains(body, "GET and HEAD") {
		t.Errorf("POST /healthz/live = %d %q (Allow %q), want 405 allowing GET, HEAD", status, body, h.Get("Allow"))
	}
	status, body, _ = get(t, http.MethodGet, url+"/startup")
	if status != http.StatusNotFound || !strings.Contains(body, "/live and …/ready") {
		t.Errorf("GET /healthz/startup = %d %q, want 404 naming the probes", status, body)
	}

	// Mounted at paths of its own.
	mux := http.NewServeMux()
	mux.Handle("/live", probe.Handler(s))
	mux.Handle("/ready", probe.Handler(s))
	hs := httptest.NewServer(mux)
	defer hs.Close()
	want(t, hs.URL+"/live", http.StatusOK, "live\n")
	want(t, hs.URL+"/ready", http.StatusOK, "ready\n")
}

// TestHandlerNilProber: a nil Prober is answered 500 with a clear text,
// not a panic.
func TestHandlerNilProber(t *testing.T) {
	hs := httptest.NewServer(probe.Handler(nil))
	defer hs.Close()
	want(t, hs.URL+"/ready", http.StatusInternalServerError, "probe: Handler was given a nil Prober\n")
}
