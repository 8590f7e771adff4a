package proxy_test

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	jsoncodec "github.com/dabbrpc/dabb/codec/json"
	protocodec "github.com/dabbrpc/dabb/codec/proto"
	pb "github.com/dabbrpc/dabb/internal/inventory/inventorypb"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/transport"
	gproto "google.golang.org/protobuf/proto"
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

// TestUseCodec makes one call in another codec than the client's: the
// request goes out in that codec's serialization id and the reply is
// decoded with it; a nil codec leaves the client's.
func TestUseCodec(t *testing.T) {
	var got atomic.Int32
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := transport.NewServer(transport.HandlerFunc(func(_ context.Context, req, resp *protocol.Message) {
		id := req.Header.Flags().Serialization()
		got.Store(int32(id))
		if id == jsoncodec.ID {
			resp.Payload = append(resp.Payload[:0], `{"sku":"json"}`...)
			return
		}
		b, _ := gproto.Marshal(&pb.StockReply{Sku: "proto"})
		resp.Payload = append(resp.Payload[:0], b...)
	}), transport.ServerConfig{Logger: quiet})
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	defer func() { srv.Close(); <-done }()
	c := client(t, []string{l.Addr().String()})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	for _, tt := range []struct {
		opt  proxy.CallOption
		id   byte
		want string
	}{
		{proxy.UseCodec(jsoncodec.Codec{}), jsoncodec.ID, "json"},
		{proxy.UseCodec(nil), protocodec.ID, "proto"},
	} {
		var reply pb.StockReply
		if err := c.Invoke(ctx, service, "Stock", &pb.StockRequest{Sku: "s"}, &reply, tt.opt); err != nil {
			t.Fatal(err)
		}
		if byte(got.Load()) != tt.id || reply.Sku != tt.want {
			t.Errorf("sent in serialization %d, reply %q; want %d and %q", got.Load(), reply.Sku, tt.id, tt.want)
		}
	}
}
