package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
)

// TestMiddlewareErrorIsAStatus: an error a middleware makes of its own
// reaches the caller as a *protocol.Error, as every error from Invoke is,
// with the middleware's error still matchable.
func TestMiddlewareErrorIsAStatus(t *testing.T) {
	denied := errors.New("denied by policy")
	tests := []struct {
		name   string
		err    error
		status protocol.Status
		is     error
	}{
		{"own error", denied, protocol.StatusClientError, proxy.ErrBadRequest},
		{"wrapped", fmt.Errorf("auth: %w", denied), protocol.StatusClientError, proxy.ErrBadRequest},
		{"deadline", context.DeadlineExceeded, protocol.StatusServerTimeout, proxy.ErrTimeout},
		{"cancelled", context.Canceled, protocol.StatusClientError, proxy.ErrCanceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mw := func(proxy.Invoker) proxy.Invoker {
				return func(context.Context, *proxy.Call) error { return tt.err }
			}
			c := client(t, nil, proxy.WithMiddleware(mw))
			_, err := invoke(context.Background(), c)
			var pe *protocol.Error
			if !errors.As(err, &pe) || pe.Status != tt.status || pe.Remote {
				t.Fatalf("Invoke = %v (%T); want a local %d", err, err, tt.status)
			}
			if !errors.Is(err, tt.err) || !errors.Is(err, tt.is) {
				t.Errorf("Invoke = %v; want it to match %v and %v", err, tt.err, tt.is)
			}
		})
	}
	// A middleware passing on a status error keeps it as it is.
	notFound := &protocol.Error{Status: protocol.StatusServiceNotFound, Remote: true}
	c := client(t, nil, proxy.WithMiddleware(func(proxy.Invoker) proxy.Invoker {
		return func(context.Context, *proxy.Call) error { return fmt.Errorf("mw: %w", notFound) }
	}))
	if _, err := invoke(context.Background(), c); !errors.Is(err, proxy.ErrNotFound) {
		t.Errorf("a wrapped status error = %v; want it kept (ErrNotFound)", err)
	}
}
