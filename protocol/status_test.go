package protocol_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/dabbrpc/dabb/protocol"
)

func TestStatusString(t *testing.T) {
	tests := []struct {
		s    protocol.Status
		code byte
		want string
	}{
		{0, 0, "none"},
		{protocol.StatusOK, 20, "ok"},
		{protocol.StatusSerializationError, 25, "serialization error"},
		{protocol.StatusClientTimeout, 30, "client timeout"},
		{protocol.StatusServerTimeout, 31, "server timeout"},
		{protocol.StatusChannelInactive, 35, "channel inactive"},
		{protocol.StatusBadRequest, 40, "bad request"},
		{protocol.StatusBadResponse, 50, "bad response"},
		{protocol.StatusServiceNotFound, 60, "service not found"},
		{protocol.StatusServiceError, 70, "service error"},
		{protocol.StatusServerError, 80, "server error"},
		{protocol.StatusClientError, 90, "client error"},
		{protocol.StatusServerThreadpoolExhausted, 100, "server threadpool exhausted"},
		{21, 21, "status(21)"},
		{255, 255, "status(255)"},
	}
	for _, tt := range tests {
		if byte(tt.s) != tt.code {
			t.Errorf("%s = %d, want Dubbo's code %d", tt.want, byte(tt.s), tt.code)
		}
		if got := tt.s.String(); got != tt.want {
			t.Errorf("Status(%d).String() = %q, want %q", tt.code, got, tt.want)
		}
	}
}

func TestErrorError(t *testing.T) {
	cause := errors.New("connection reset")
	tests := []struct {
		name string
		err  *protocol.Error
		want string
	}{
		{"status only", &protocol.Error{Status: protocol.StatusServiceNotFound}, "status 60 (service not found)"},
		{"message", &protocol.Error{Status: protocol.StatusServiceNotFound, Msg: "no inventory.Inventory"}, "status 60 (service not found): no inventory.Inventory"},
		{"remote", &protocol.Error{Status: protocol.StatusServiceError, Msg: "out of stock", Remote: true}, "remote status 70 (service error): out of stock"},
		{"cause", &protocol.Error{Status: protocol.StatusChannelInactive, Msg: "write", Err: cause}, "status 35 (channel inactive): write: connection reset"},
		{"cause without message", &protocol.Error{Status: protocol.StatusChannelInactive, Err: cause}, "status 35 (channel inactive): connection reset"},
		{"cause equal to message", &protocol.Error{Status: protocol.StatusChannelInactive, Msg: "connection reset", Err: cause}, "status 35 (channel inactive): connection reset"},
		{"unknown status", &protocol.Error{Status: 7}, "status 7 (status(7))"},
		{"code", &protocol.Error{Status: protocol.StatusServiceNotFound, Code: "payment_not_found", Msg: "no payment 7",
			Details: []string{"payment_id=7"}, Remote: true}, "remote status 60 (service not found), code payment_not_found: no payment 7"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.err.Error(); got != tt.want {
				t.Errorf("Error() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestErrorIs(t *testing.T) {
	sentinels := []error{
		protocol.ErrTimeout, protocol.ErrUnavailable, protocol.ErrNotFound,
		protocol.ErrOverloaded, protocol.ErrBadRequest, protocol.ErrServiceError,
		protocol.ErrCanceled, protocol.ErrUnauthenticated, protocol.ErrPermissionDenied,
	}
	tests := []struct {
		s    protocol.Status
		want error // the one sentinel it matches, nil for none
	}{
		{protocol.StatusOK, nil},
		{protocol.StatusSerializationError, protocol.ErrBadRequest},
		{protocol.StatusClientTimeout, protocol.ErrTimeout},
		{protocol.StatusServerTimeout, protocol.ErrTimeout},
		{protocol.StatusChannelInactive, protocol.ErrUnavailable},
		{protocol.StatusBadRequest, protocol.ErrBadRequest},
		{protocol.StatusBadResponse, protocol.ErrBadRequest},
		{protocol.StatusServiceNotFound, protocol.ErrNotFound},
		{protocol.StatusServiceError, protocol.ErrServiceError},
		{protocol.StatusServerError, protocol.ErrUnavailable},
		{protocol.StatusClientError, protocol.ErrBadRequest},
		{protocol.StatusServerThreadpoolExhausted, protocol.ErrOverloaded},
		{99, nil},
	}
	for _, tt := range tests {
		t.Run(tt.s.String(), func(t *testing.T) {
			// Wrapped, as callers see it.
			err := fmt.Errorf("proxy: call: %w", &protocol.Error{Status: tt.s, Remote: true})
			for _, s := range sentinels {
				if got := errors.Is(err, s); got != (s == tt.want) {
					t.Errorf("errors.Is(status %d, %v) = %v", tt.s, s, got)
				}
			}
		})
	}
}

// TestCanceledIsNotABadRequest: a 90 that says the caller gave up (its
// context was cancelled, or its client closed) matches ErrCanceled, not
// ErrBadRequest; one made of a request that could not be encoded is the
// other way round.
func TestCanceledIsNotABadRequest(t *testing.T) {
	closed := errors.New("client closed")
	tests := []struct {
		name     string
		cause    error
		canceled bool
	}{
		{"context cancelled", context.Canceled, true},
		{"client closed", fmt.Errorf("%w: %w", closed, protocol.ErrCanceled), true},
		{"encode failed", errors.New("not a proto.Message"), false},
		{"no cause", nil, false},
	}
	for _, tt := range tests {
		err := fmt.Errorf("call: %w", &protocol.Error{Status: protocol.StatusClientError, Err: tt.cause})
		if got := errors.Is(err, protocol.ErrCanceled); got != tt.canceled {
			t.Errorf("%s: errors.Is(err, ErrCanceled) = %v", tt.name, got)
		}
		if got := errors.Is(err, protocol.ErrBadRequest); got == tt.canceled {
			t.Errorf("%s: errors.Is(err, ErrBadRequest) = %v", tt.name, got)
		}
	}
}

func TestErrorUnwrapAndAs(t *testing.T) {
	err := fmt.Errorf("transport: %w", &protocol.Error{
		Status: protocol.StatusClientTimeout,
		Msg:    "budget spent",
		Err:    context.DeadlineExceeded,
	})
	var pe *protocol.Error
	if !errors.As(err, &pe) {
		t.Fatalf("errors.As found no *Error in %v", err)
	}
	if pe.Status != protocol.StatusClientTimeout || pe.Msg != "budget spent" || pe.Remote {
		t.Errorf("errors.As gave %+v", pe)
	}
	if pe.Unwrap() != context.DeadlineExceeded {
		t.Errorf("Unwrap() = %v, want context.DeadlineExceeded", pe.Unwrap())
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Error("errors.Is does not see the cause through *Error")
	}
	if !errors.Is(err, protocol.ErrTimeout) {
		t.Error("errors.Is(err, ErrTimeout) = false")
	}
	if errors.Is(err, io.EOF) {
		t.Error("errors.Is matched an unrelated error")
	}
	if (&protocol.Error{}).Unwrap() != nil {
		t.Error("Unwrap without a cause is not nil")
	}
}

func TestStatusOf(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want protocol.Status
	}{
		{"nil", nil, protocol.StatusOK},
		{"error", &protocol.Error{Status: protocol.StatusServiceNotFound}, protocol.StatusServiceNotFound},
		{"wrapped error", fmt.Errorf("x: %w", &protocol.Error{Status: protocol.StatusServerThreadpoolExhausted}), protocol.StatusServerThreadpoolExhausted},
		{"error beats its cause", &protocol.Error{Status: protocol.StatusServerTimeout, Err: context.Canceled}, protocol.StatusServerTimeout},
		{"deadline", context.DeadlineExceeded, protocol.StatusClientTimeout},
		{"wrapped deadline", fmt.Errorf("x: %w", context.DeadlineExceeded), protocol.StatusClientTimeout},
		{"canceled", context.Canceled, protocol.StatusClientError},
		{"handler error", errors.New("out of stock"), protocol.StatusServiceError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := protocol.StatusOf(tt.err); got != tt.want {
				t.Errorf("StatusOf(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}

func TestErrorf(t *testing.T) {
	e := protocol.Errorf(protocol.StatusBadRequest, "count must be positive, got %d", -2)
	if e.Status != protocol.StatusBadRequest || e.Remote || e.Err != nil {
		t.Fatalf("Errorf = %#v, want a local 40 with no cause", e)
	}
	if got, want := e.Error(), "status 40 (bad request): count must be positive, got -2"; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
	if !errors.Is(e, protocol.ErrBadRequest) {
		t.Fatal("Errorf(40) does not match ErrBadRequest")
	}

	// A cause wrapped with %w (one or several) stays reachable, and its
	// text is not repeated.
	cause := io.ErrUnexpectedEOF
	for _, e := range []*protocol.Error{
		protocol.Errorf(protocol.StatusServiceError, "read ledger: %w", cause),
		protocol.Errorf(protocol.StatusServiceError, "read ledger: %w, %w", cause, context.Canceled),
	} {
		if !errors.Is(e, cause) || !errors.Is(e, protocol.ErrServiceError) {
			t.Fatalf("%v: cause or status not matched", e)
		}
		if got := e.Error(); got != "status 70 (service error): "+e.Msg {
			t.Fatalf("Error() = %q repeats or drops the message %q", got, e.Msg)
		}
	}
}

func TestNotSent(t *testing.T) {
	cause := errors.New("dial tcp: refused")
	err := protocol.NotSent(protocol.StatusChannelInactive, "cannot connect", cause)
	if !errors.Is(err, protocol.ErrNotSent) {
		t.Errorf("errors.Is(%v, protocol.ErrNotSent) = false", err)
	}
	if !errors.Is(err, cause) || !errors.Is(err, protocol.ErrUnavailable) {
		t.Errorf("%v: lost its cause or its status class", err)
	}
	if want := "status 35 (channel inactive): cannot connect: dial tcp: refused"; err.Error() != want {
		t.Errorf("Error() = %q, want %q", err.Error(), want)
	}
	sent := &protocol.Error{Status: protocol.StatusChannelInactive, Msg: "connection lost while sending"}
	if errors.Is(sent, protocol.ErrNotSent) {
		t.Errorf("errors.Is(%v, protocol.ErrNotSent) = true for an error without NotSent", sent)
	}
	wrapped := fmt.Errorf("call: %w", err)
	if !errors.Is(wrapped, protocol.ErrNotSent) {
		t.Errorf("errors.Is(%v, protocol.ErrNotSent) = false through a wrap", wrapped)
	}
}

func TestContextError(t *testing.T) {
	for _, tc := range []struct {
		err     error
		sent    bool
		status  protocol.Status
		notSent bool
	}{
		{context.DeadlineExceeded, false, protocol.StatusClientTimeout, true},
		{context.DeadlineExceeded, true, protocol.StatusServerTimeout, false},
		{context.Canceled, false, protocol.StatusClientError, true},
		{context.Canceled, true, protocol.StatusClientError, false},
	} {
		e := protocol.ContextError(tc.err, tc.sent)
		if e.Status != tc.status || e.NotSent != tc.notSent || errors.Is(e, protocol.ErrNotSent) != tc.notSent {
			t.Errorf("protocol.ContextError(%v, sent %v) = %v (not sent %v), want status %d, not sent %v",
				tc.err, tc.sent, e, e.NotSent, tc.status, tc.notSent)
		}
		if !errors.Is(e, tc.err) {
			t.Errorf("protocol.ContextError(%v, %v) = %v: lost the context error", tc.err, tc.sent, e)
		}
	}
	if !errors.Is(protocol.ContextError(context.Canceled, true), protocol.ErrCanceled) {
		t.Error("a cancelled call does not match protocol.ErrCanceled")
	}
}
