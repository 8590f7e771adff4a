package dabb_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/registry"
)

// joined reports whether err is a multi-error (errors.Join's wrapper).
func joined(err error) bool {
	_, ok := err.(interface{ Unwrap() []error })
	return ok
}

// TestShutdownReturnsCtxErrItself: a Shutdown whose ctx ends before the
// drain returns ctx.Err() itself, as its doc says (and as net/http's
// Shutdown does), so err == context.DeadlineExceeded holds.
func TestShutdownReturnsCtxErrItself(t *testing.T) {
	p := newProbe()
	s, addr := startServer(t, p)
	c := newClient(t, addr)
	callDone := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		_, err := call(ctx, c, "block")
		callDone <- err
	}()
	select {
	case <-p.started:
	case err := <-callDone:
		t.Fatalf("call ended before its handler started: %v", err)
	case <-time.After(testTimeout):
		t.Fatal("the blocking call never reached its handler")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := s.Shutdown(ctx) // the handler runs until its context is cancelled
	select {
	case <-callDone:
	case <-time.After(testTimeout):
		t.Fatal("the call did not end after Shutdown closed the server")
	}
	if err != context.DeadlineExceeded { // the identity is the point
		t.Errorf("Shutdown = %v (%T), want context.DeadlineExceeded itself", err, err)
	}
}

// deregisterFails is a registry whose Deregister fails with errWithdraw.
type deregisterFails struct{ *gatedRegistry }

var errWithdraw = errors.New("registry refuses to withdraw")

func (deregisterFails) Deregister(context.Context, registry.Instance) error { return errWithdraw }

// TestShutdownAndCloseReturnWithdrawalErrorItself: when withdrawing fails
// and nothing else does, Shutdown and Close return the withdrawal's error,
// not a join wrapping it alone.
func TestShutdownAndCloseReturnWithdrawalErrorItself(t *testing.T) {
	for name, stop := range map[string]func(*dabb.Server) error{
		"Shutdown": func(s *dabb.Server) error { return s.Shutdown(context.Background()) },
		"Close":    (*dabb.Server).Close,
	} {
		t.Run(name, func(t *testing.T) {
			reg := deregisterFails{newGatedRegistry("")}
			s := dabb.NewServer(dabb.WithRegistry(reg), dabb.WithLogger(quiet))
			if err := s.RegisterService(&probeDesc, newProbe()); err != nil {
				t.Fatal(err)
			}
			addr, done := serveGated(t, s)
			awaitEntered(t, reg.gatedRegistry, "register "+probeDesc.Name)
			// Serve answers once it has published (a shutdown while it
			// publishes ends differently: publish_shutdown_test.go).
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			if _, err := call(ctx, newClient(t, addr), "echo"); err != nil {
				t.Fatalf("a call to the serving server: %v", err)
			}
			err := stop(s)
			if !errors.Is(err, errWithdraw) {
				t.Errorf("%s = %v, want the withdrawal's error", name, err)
			}
			if joined(err) {
				t.Errorf("%s returned %v wrapped in a join of one", name, err)
			}
			if err := <-done; err != dabb.ErrServerClosed { // the identity is the point
				t.Errorf("Serve = %v, want ErrServerClosed", err)
			}
		})
	}
}
