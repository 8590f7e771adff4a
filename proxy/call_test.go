package proxy_test

import (
	"context"
	"strings"
	"testing"

	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/transport"
)

func TestMiddlewareOrderAndAttachments(t *testing.T) {
	s := &seen{}
	addr := serve(t, s, 0, transport.ServerConfig{})
	var order []string
	mw := func(name string) proxy.Middleware {
		return func(next proxy.Invoker) proxy.Invoker {
			return func(ctx context.Context, call *proxy.Call) error {
				order = append(order, name+">"+call.Service+"."+call.Method)
				call.SetAttachment("trace-id", "t-1")
				err := next(ctx, call)
				order = append(order, "<"+name)
				return err
			}
		}
	}
	c := client(t, []string{addr}, proxy.WithMiddleware(mw("a"), mw("b")))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if _, err := invoke(ctx, c, proxy.IdempotencyKey("k-9"), proxy.Attachment("user", "u")); err != nil {
		t.Fatal(err)
	}
	want := "a>test.Svc.M b>test.Svc.M <b <a"
	if got := strings.Join(order, " "); got != want {
		t.Fatalf("middleware order %q, want %q", got, want)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, v := range map[string]string{"trace-id": "t-1", protocol.AttachIdempotencyKey: "k-9", "user": "u"} {
		if s.attachments[k] != v {
			t.Errorf("server saw attachment %s=%q, want %q (all: %v)", k, s.attachments[k], v, s.attachments)
		}
	}
}

// TestMadeKeyBesideAttachments: the key the client makes for a call that
// is not idempotent reaches the server without joining Call.Attachments.
func TestMadeKeyBesideAttachments(t *testing.T) {
	s := &seen{}
	addr := serve(t, s, 0, transport.ServerConfig{})
	var after map[string]string
	mw := func(next proxy.Invoker) proxy.Invoker {
		return func(ctx context.Context, call *proxy.Call) error {
			err := next(ctx, call)
			after = call.Attachments
			return err
		}
	}
	c := client(t, []string{addr}, proxy.WithMiddleware(mw))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if _, err := invoke(ctx, c); err != nil {
		t.Fatal(err)
	}
	if after != nil {
		t.Errorf("Call.Attachments after the call = %v, want nil", after)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if k := s.attachments[protocol.AttachIdempotencyKey]; k == "" || len(s.attachments) != 1 {
		t.Errorf("server saw %v, want the made key alone", s.attachments)
	}
}
