package transport

import (
	"context"
	"errors"
	"strconv"
	"testing"

	"github.com/dabbrpc/dabb/protocol"
)

func manyAttachments(n int) map[string]string {
	m := make(map[string]string, n)
	for i := range n {
		m["k"+strconv.Itoa(i)] = "v"
	}
	return m
}

// TestAttachmentLimit: neither side sends a frame with more attachments
// than a receiver accepts (protocol.MaxAttachments). A request over it
// fails locally, not sent; a handler's response over it is answered with
// 50 instead, and the connection, with the calls sharing it, lives on.
func TestAttachmentLimit(t *testing.T) {
	l := &acceptCounter{Listener: listen(t)}
	ts := startServerOn(t, l, HandlerFunc(func(_ context.Context, req, resp *protocol.Message) {
		if string(req.Payload) == "flood" {
			resp.Attachments = manyAttachments(protocol.MaxAttachments + 1)
		}
		resp.Payload = append(resp.Payload[:0], req.Payload...)
	}), ServerConfig{})
	p := newPool(t, Config{ConnsPerAddr: 1})

	req := newRequest("x")
	req.Attachments = manyAttachments(protocol.MaxAttachments + 1)
	_, err := p.RoundTrip(testCtx(t), ts.addr, req)
	var pe *protocol.Error
	if !errors.Is(err, ErrNotSent) || !errors.Is(err, protocol.ErrTooManyAttachments) ||
		!errors.As(err, &pe) || pe.Status != protocol.StatusClientError || pe.Remote {
		t.Errorf("a request with %d attachments = %v; want a local 90, not sent, wrapping ErrTooManyAttachments",
			protocol.MaxAttachments+1, err)
	}
	req.Attachments = manyAttachments(protocol.MaxAttachments)
	resp, err := p.RoundTrip(testCtx(t), ts.addr, req)
	if err != nil {
		t.Fatalf("a request with %d attachments: %v", protocol.MaxAttachments, err)
	}
	p.Release(resp)

	_, err = p.RoundTrip(testCtx(t), ts.addr, newRequest("flood"))
	if !errors.As(err, &pe) || pe.Status != protocol.StatusBadResponse || !pe.Remote {
		t.Fatalf("a call whose handler answered %d attachments = %v; want a remote 50", protocol.MaxAttachments+1, err)
	}
	resp, err = p.RoundTrip(testCtx(t), ts.addr, newRequest("after"))
	if err != nil {
		t.Fatalf("the call after it: %v", err)
	}
	p.Release(resp)
	if n := l.accepted.Load(); n != 1 {
		t.Errorf("the server accepted %d connections; want the one to live on", n)
	}
}
