package proxy

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

// staticCreds returns att and requires TLS when secure is set.
type staticCreds struct {
	att    map[string]string
	secure bool
}

func (c staticCreds) Attachments(context.Context, string, string) (map[string]string, error) {
	return c.att, nil
}

func (c staticCreds) RequireTransportSecurity() bool { return c.secure }

func TestAddCredentials(t *testing.T) {
	ctx := context.Background()
	newCall := func() *Call {
		return &Call{Service: "s", Method: "m", Deadline: time.Now().Add(time.Second)}
	}
	tok := staticCreds{map[string]string{protocol.AttachAuthorization: "Bearer x"}, true}

	t.Run("secure client sends what requires TLS", func(t *testing.T) {
		call := newCall()
		if err := addCredentials(ctx, tok, true, call); err != nil {
			t.Fatal(err)
		}
		if got := call.Attachments[protocol.AttachAuthorization]; got != "Bearer x" {
			t.Errorf("authorization %q, want %q", got, "Bearer x")
		}
	})
	t.Run("plaintext client refuses what requires TLS", func(t *testing.T) {
		call := newCall()
		err := addCredentials(ctx, tok, false, call)
		if !errors.Is(err, ErrInsecureCredentials) || !errors.Is(err, ErrNotSent) {
			t.Fatalf("got %v, want ErrInsecureCredentials, not sent", err)
		}
		if call.Attachments != nil {
			t.Errorf("refused credentials were added: %q", call.Attachments)
		}
	})
	t.Run("plaintext client sends what allows it", func(t *testing.T) {
		call := newCall()
		if err := addCredentials(ctx, staticCreds{map[string]string{"x-sig": "1"}, false}, false, call); err != nil {
			t.Fatal(err)
		}
		if call.Attachments["x-sig"] != "1" {
			t.Errorf("attachments %q", call.Attachments)
		}
	})
	t.Run("reserved keys are refused", func(t *testing.T) {
		for _, k := range []string{protocol.AttachTimeout, protocol.AttachIdempotencyKey} {
			err := addCredentials(ctx, staticCreds{map[string]string{k: "1"}, false}, true, newCall())
			if !errors.Is(err, ErrNotSent) || !errors.Is(err, ErrBadRequest) {
				t.Errorf("credentials setting %q: got %v, want a local 90, not sent", k, err)
			}
		}
	})
	t.Run("the source's context ends with the call", func(t *testing.T) {
		call := newCall()
		var got time.Time
		creds := credsFunc(func(ctx context.Context) {
			got, _ = ctx.Deadline()
		})
		if err := addCredentials(ctx, creds, true, call); err != nil {
			t.Fatal(err)
		}
		if !got.Equal(call.Deadline) {
			t.Errorf("source's deadline %v, want the call's %v", got, call.Deadline)
		}
	})
}

// credsFunc is credentials that only observe their context.
type credsFunc func(ctx context.Context)

func (f credsFunc) Attachments(ctx context.Context, _, _ string) (map[string]string, error) {
	f(ctx)
	return nil, nil
}

func (credsFunc) RequireTransportSecurity() bool { return false }
