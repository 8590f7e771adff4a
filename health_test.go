package dabb_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/health"
	"github.com/dabbrpc/dabb/internal/wait"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
	"github.com/dabbrpc/dabb/transport"
)

// newHealthClient returns a JSON client whose registry lists addr as the
// health service's only instance, and a channel closed when addr sends
// the read-only event.
func newHealthClient(t *testing.T, addr string) (*proxy.Client, <-chan struct{}) {
	t.Helper()
	readOnly := make(chan struct{})
	var once sync.Once
	reg := static.New(registry.Instance{Service: health.ServiceName, ID: addr, Addr: addr})
	c, err := proxy.NewClient(reg, proxy.WithCodec("json"), proxy.WithLogger(quiet),
		proxy.WithTransport(transport.Config{OnReadOnly: func(string) { once.Do(func() { close(readOnly) }) }}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, readOnly
}

// check calls dabb.Health/Check for service.
func check(t *testing.T, c *proxy.Client, service string) (health.Status, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	var reply health.CheckReply
	err := c.Invoke(ctx, health.ServiceName, health.MethodCheck, &health.CheckRequest{Service: service}, &reply)
	return reply.Status, err
}

// wantStatus fails the test unless Check(service) answers want.
func wantStatus(t *testing.T, c *proxy.Client, service string, want health.Status) {
	t.Helper()
	got, err := check(t, c, service)
	if err != nil {
		t.Fatalf("Check(%q): %v", service, err)
	}
	if got != want {
		t.Fatalf("Check(%q) = %q, want %q", service, got, want)
	}
}

// TestHealthCheck: a server answers serving for itself, for its services
// and for the health service, and unknown for a service it does not have.
func TestHealthCheck(t *testing.T) {
	_, addr := startServer(t, newProbe())
	c, _ := newHealthClient(t, addr)
	wantStatus(t, c, "", health.Serving)
	wantStatus(t, c, probeDesc.Name, health.Serving)
	wantStatus(t, c, health.ServiceName, health.Serving)
	wantStatus(t, c, "no.Such", health.Unknown)
}

// TestHealthSetServing: SetServing flips one service, and the server as a
// whole apart from its services; it only reports, as gRPC's does: the
// service still runs calls.
func TestHealthSetServing(t *testing.T) {
	s, addr := startServer(t, newProbe())
	c, _ := newHealthClient(t, addr)
	calls := newClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	s.SetServing(probeDesc.Name, false)
	wantStatus(t, c, probeDesc.Name, health.NotServing)
	wantStatus(t, c, "", health.Serving)
	if err := s.Ready(); err != nil {
		t.Errorf("Ready with one service set not serving = %v, want nil: it reads the server as a whole", err)
	}
	if _, err := call(ctx, calls, "echo"); err != nil {
		t.Errorf("a call to a service set not serving failed: %v; SetServing only reports", err)
	}
	s.SetServing(probeDesc.Name, true)
	wantStatus(t, c, probeDesc.Name, health.Serving)

	s.SetServing("", false)
	wantStatus(t, c, "", health.NotServing)
	wantStatus(t, c, probeDesc.Name, health.Serving)
	if err := s.Ready(); err == nil || !strings.Contains(err.Error(), "SetServing") {
		t.Errorf("Ready with the server set not serving = %v, want an error naming SetServing", err)
	}
	s.SetServing("", true)
	wantStatus(t, c, "", health.Serving)
	if err := s.Ready(); err != nil {
		t.Errorf("Ready once set serving again = %v", err)
	}

	// A name set before it is registered: unknown until it is, then not
	// serving.
	s.SetServing("test.Later", false)
	wantStatus(t, c, "test.Later", health.Unknown)
	later := probeDesc
	later.Name = "test.Later"
	if err := s.RegisterService(&later, newProbe()); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, c, "test.Later", health.NotServing)
}

// TestHealthNameTaken: the health service's name cannot be registered,
// and a failed attempt leaves the built-in one answering.
func TestHealthNameTaken(t *testing.T) {
	s, addr := startServer(t, newProbe())
	impostor := probeDesc
	impostor.Name = health.ServiceName
	err := s.RegisterService(&impostor, newProbe())
	if err == nil || !strings.Contains(err.Error(), "built in") || !strings.Contains(err.Error(), health.ServiceName) {
		t.Fatalf("RegisterService(%s) = %v, want an error saying the name is built in", health.ServiceName, err)
	}
	c, _ := newHealthClient(t, addr)
	wantStatus(t, c, health.ServiceName, health.Serving)
}

// TestHealthNotPublished: a server publishes its services but not the
// health service; it is ready once published.
func TestHealthNotPublished(t *testing.T) {
	reg := static.New()
	s := dabb.NewServer(dabb.WithRegistry(reg), dabb.WithLogger(quiet))
	if err := s.RegisterService(&probeDesc, newProbe()); err != nil {
		t.Fatal(err)
	}
	if err := s.Ready(); err == nil {
		t.Error("Ready before Serve = nil")
	}
	if err := s.Live(); err == nil {
		t.Error("Live before Serve = nil")
	}
	addr, done := serveGated(t, s)
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := <-done; !errors.Is(err, dabb.ErrServerClosed) {
			t.Errorf("Serve = %v, want ErrServerClosed", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	w, err := reg.Watch(ctx, probeDesc.Name)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for {
		set, err := w.Next(ctx)
		if err != nil {
			t.Fatalf("waiting for %s to be published: %v", probeDesc.Name, err)
		}
		if len(set) == 1 && set[0].Addr == addr {
			break
		}
	}
	hw, err := reg.Watch(ctx, health.ServiceName)
	if err != nil {
		t.Fatal(err)
	}
	defer hw.Stop()
	if set, err := hw.Next(ctx); err != nil || len(set) != 0 {
		t.Errorf("the registry lists %v (err %v) for %s, want nothing", set, err, health.ServiceName)
	}
	// The registry lists the instance before publishing has ended; Serve
	// answers a call only after it has.
	c, _ := newHealthClient(t, addr)
	wantStatus(t, c, "", health.Serving)
	if err := s.Ready(); err != nil {
		t.Errorf("Ready once published = %v", err)
	}
	if err := s.Live(); err != nil {
		t.Errorf("Live while serving = %v", err)
	}
}

// TestHealthThroughInterceptors: Check runs through the interceptor chain
// like every call: an interceptor sees it, and one that refuses the
// caller, not declared a credential check, refuses it too.
func TestHealthThroughInterceptors(t *testing.T) {
	seen := make(chan dabb.CallInfo, 1)
	record := func(ctx context.Context, info *dabb.CallInfo, next dabb.CallHandler) (any, error) {
		select {
		case seen <- *info:
		default:
		}
		return next(ctx)
	}
	_, addr := startServer(t, newProbe(), dabb.WithInterceptor(record))
	c, _ := newHealthClient(t, addr)
	wantStatus(t, c, "", health.Serving)
	info := <-seen
	if info.Service != health.ServiceName || info.Method != health.MethodCheck || !info.Idempotent {
		t.Errorf("the interceptor saw %+v, want service %s, method %s, idempotent", info, health.ServiceName, health.MethodCheck)
	}

	refuse := func(context.Context, *dabb.CallInfo, dabb.CallHandler) (any, error) {
		return nil, &protocol.Error{Status: protocol.StatusBadRequest, Code: protocol.CodePermissionDenied, Msg: "closed for the night"}
	}
	_, locked := startServer(t, newProbe(), dabb.WithInterceptor(refuse))
	lc, _ := newHealthClient(t, locked)
	if _, err := check(t, lc, ""); !errors.Is(err, proxy.ErrPermissionDenied) {
		t.Errorf("Check through an interceptor that refuses every call = %v, want ErrPermissionDenied", err)
	}
}

// TestHealthSkipsCredentialChecks: by default Check passes RequireToken,
// a TokenSet and an interceptor declared with CredentialCheck, while the
// interceptors around them still see it; the probe's service and
// dabb.Reflection still need the token. WithHealthCredentials(true) puts
// Check behind the same checks.
func TestHealthSkipsCredentialChecks(t *testing.T) {
	var seen sync.Map // service names the outer interceptor saw
	record := func(ctx context.Context, info *dabb.CallInfo, next dabb.CallHandler) (any, error) {
		seen.Store(info.Service, true)
		return next(ctx)
	}
	var signed atomic.Int64 // the calls the declared check looked at
	signature := dabb.CredentialCheck(func(ctx context.Context, info *dabb.CallInfo, next dabb.CallHandler) (any, error) {
		signed.Add(1)
		if info.Attachments["signature"] != "ok" {
			return nil, &protocol.Error{Status: protocol.StatusBadRequest, Code: protocol.CodeUnauthenticated, Msg: "no signature"}
		}
		return next(ctx)
	})
	checks := []dabb.Option{dabb.WithInterceptor(record, dabb.RequireToken("s3cret"), dabb.NewTokenSet("other").Intercept, signature)}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	t.Run("default", func(t *testing.T) {
		_, addr := startServer(t, newProbe(), checks...)
		hc, _ := newHealthClient(t, addr)
		wantStatus(t, hc, "", health.Serving)
		wantStatus(t, hc, probeDesc.Name, health.Serving)
		if _, ok := seen.Load(health.ServiceName); !ok {
			t.Error("the interceptor outside the credential checks did not see Check")
		}
		if n := signed.Load(); n != 0 {
			t.Errorf("the declared credential check ran %d times for Check, want 0", n)
		}
		c := newClient(t, addr)
		if _, err := call(ctx, c, "echo"); !errors.Is(err, proxy.ErrUnauthenticated) {
			t.Errorf("a call of %s without the token = %v, want ErrUnauthenticated", probeDesc.Name, err)
		}
		jc := newClientWith(t, []proxy.Option{proxy.WithCodec("json")}, addr)
		if _, err := list(ctx, jc); !errors.Is(err, proxy.ErrUnauthenticated) {
			t.Errorf("dabb.Reflection/List without the token = %v, want ErrUnauthenticated", err)
		}
	})
	t.Run("WithHealthCredentials", func(t *testing.T) {
		_, addr := startServer(t, newProbe(), dabb.WithHealthCredentials(true),
			dabb.WithInterceptor(dabb.RequireToken("s3cret"), signature))
		hc, _ := newHealthClient(t, addr)
		if _, err := check(t, hc, ""); !errors.Is(err, proxy.ErrUnauthenticated) ||
			!strings.Contains(err.Error(), "missing credentials") {
			t.Errorf("Check without the token = %v, want ErrUnauthenticated for missing credentials", err)
		}
		signed.Store(0)
		token := proxy.Attachment(dabb.AttachAuthorization, "Bearer s3cret")
		var reply health.CheckReply
		err := hc.Invoke(ctx, health.ServiceName, health.MethodCheck, &health.CheckRequest{}, &reply, token)
		if !errors.Is(err, proxy.ErrUnauthenticated) || !strings.Contains(err.Error(), "no signature") || signed.Load() != 1 {
			t.Errorf("Check with the token, without the signature = %v (the check ran %d times), want the declared check's refusal",
				err, signed.Load())
		}
		err = hc.Invoke(ctx, health.ServiceName, health.MethodCheck, &health.CheckRequest{}, &reply, token, proxy.Attachment("signature", "ok"))
		if err != nil || reply.Status != health.Serving {
			t.Errorf("Check with the token and the signature = %q, %v; want serving", reply.Status, err)
		}
	})
}

// TestHealthNotServingOnceShutdownBegins: from the moment Shutdown
// begins, while the withdrawal from the registry runs and a call is still
// in flight, Check answers not serving for the server and every service,
// and Ready fails; Live holds until Shutdown returns. Once the server
// sends the read-only event, a client sends it nothing more, Check
// included: the refusal says "shutting down".
func TestHealthNotServingOnceShutdownBegins(t *testing.T) {
	reg := newGatedRegistry("deregister")
	s := dabb.NewServer(dabb.WithRegistry(reg), dabb.WithLogger(quiet))
	p := newProbe()
	if err := s.RegisterService(&probeDesc, p); err != nil {
		t.Fatal(err)
	}
	addr, done := serveGated(t, s)
	awaitEntered(t, reg, "register "+probeDesc.Name)
	c, readOnly := newHealthClient(t, addr)
	calls := newClient(t, addr)
	wantStatus(t, c, probeDesc.Name, health.Serving)

	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	inFlight := make(chan error, 1)
	go func() { _, err := call(ctx, calls, "block"); inFlight <- err }()
	<-p.started
	if err := s.Ready(); err != nil {
		t.Fatalf("Ready before Shutdown = %v", err)
	}

	shut := make(chan error, 1)
	go func() { shut <- s.Shutdown(ctx) }()
	awaitEntered(t, reg, "deregister "+probeDesc.Name) // held: Shutdown has begun
	wantStatus(t, c, "", health.NotServing)
	wantStatus(t, c, probeDesc.Name, health.NotServing)
	wantStatus(t, c, health.ServiceName, health.NotServing)
	wantStatus(t, c, "no.Such", health.Unknown)
	s.SetServing(probeDesc.Name, true)
	wantStatus(t, c, probeDesc.Name, health.NotServing) // Shutdown outranks SetServing
	if err := s.Ready(); err == nil || !strings.Contains(err.Error(), "shutting down") {
		t.Errorf("Ready during Shutdown = %v, want an error saying shutting down", err)
	}
	if err := s.Live(); err != nil {
		t.Errorf("Live during Shutdown = %v, want nil", err)
	}

	close(reg.hold) // the withdrawal ends; the drain begins
	select {
	case <-readOnly:
	case <-ctx.Done():
		t.Fatal("no read-only event after the withdrawal")
	}
	_, err := check(t, c, "")
	if !errors.Is(err, proxy.ErrNotSent) || !strings.Contains(err.Error(), "shutting down") {
		t.Errorf("Check once the server sent the read-only event = %v, want not sent, shutting down", err)
	}
	// Serve returns once the listener is drained; the server still
	// serves the call in flight.
	if err := <-done; !errors.Is(err, dabb.ErrServerClosed) {
		t.Errorf("Serve = %v, want ErrServerClosed", err)
	}
	if err := s.Live(); err != nil {
		t.Errorf("Live while the call drains = %v, want nil", err)
	}
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned (%v) with a call in flight", err)
	default:
	}

	close(p.release)
	if err := <-inFlight; err != nil {
		t.Errorf("the call in flight: %v", err)
	}
	if err := <-shut; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if err := s.Live(); err == nil || !strings.Contains(err.Error(), "stopped") {
		t.Errorf("Live after Shutdown = %v, want an error saying stopped", err)
	}
}

// TestHealthClose: Close makes the server not live and not ready at once.
func TestHealthClose(t *testing.T) {
	s, addr := startServer(t, newProbe())
	c, _ := newHealthClient(t, addr)
	wantStatus(t, c, "", health.Serving)
	if err := s.Live(); err != nil {
		t.Fatalf("Live while serving = %v", err)
	}
	s.Close()
	if err := s.Live(); err == nil {
		t.Error("Live after Close = nil")
	}
	if err := s.Ready(); err == nil {
		t.Error("Ready after Close = nil")
	}
	if _, err := check(t, c, ""); err == nil {
		t.Error("Check after Close succeeded")
	}
}

// TestDrainDelay: with WithDrainDelay, a server that began its Shutdown
// keeps accepting and serving for the delay after its withdrawal. A new
// client connecting then reads not serving from the health service and
// its calls still succeed. Shutdown returns after the delay and the drain.
func TestDrainDelay(t *testing.T) {
	const delay = 2 * time.Second
	s, addr := startServer(t, newProbe(), dabb.WithDrainDelay(delay))
	done := make(chan error, 1)
	began := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		done <- s.Shutdown(ctx)
	}()
	// A client that connects after Shutdown began, as an operator's does.
	first, _ := newHealthClient(t, addr)
	wait.Until(t, testTimeout, time.Millisecond, "Check to answer not serving", func() bool {
		st, err := check(t, first, "")
		return err == nil && st == health.NotServing
	})
	if time.Since(began) < delay {
		late, _ := newHealthClient(t, addr)
		wantStatus(t, late, probeDesc.Name, health.NotServing)
		c := newClient(t, addr)
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		if _, err := call(ctx, c, "echo"); err != nil && time.Since(began) < delay {
			t.Fatalf("a call during the drain delay: %v", err)
		}
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		if took := time.Since(began); took < delay {
			t.Fatalf("Shutdown returned after %v, before its %v drain delay", took, delay)
		}
	case <-time.After(testTimeout):
		t.Fatal("Shutdown did not return")
	}
}
