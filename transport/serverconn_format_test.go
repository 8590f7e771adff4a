// Tests of body formats through a real Server and Pool: requests decoded
// and every answer encoded by the format of the request's serialization id.

package transport

import (
	"bytes"
	"context"
	"encoding/binary"
	"maps"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/formattest"
	"github.com/dabbrpc/dabb/protocol"
)

func init() { formattest.Register() }

// toyRequest returns a two-way request in the toy format (id 30).
func toyRequest(payload []byte) *protocol.Message {
	req := &protocol.Message{Service: "com.example.Toy", Method: "play", Payload: payload}
	req.Header.SetFlags(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, formattest.ID))
	return req
}

// readRawFrame reads one frame from c without decoding its body.
func readRawFrame(t *testing.T, c net.Conn) (protocol.Header, []byte) {
	t.Helper()
	var h protocol.Header
	copy(h[:], readFull(t, c, protocol.HeaderLen))
	return h, readFull(t, c, int(h.BodyLen()))
}

// toyAnswer reads the answer to request id from c, skipping events, and
// checks that the toy laid it out: serialization 30, the kind byte.
func toyAnswer(t *testing.T, c net.Conn, id uint64, status protocol.Status, kind byte) []byte {
	t.Helper()
	for {
		h, body := readRawFrame(t, c)
		if h.Flags().IsEvent() {
			continue
		}
		if h.ID() != id || h.Flags().Serialization() != formattest.ID || h.Status() != status || len(body) == 0 || body[0] != kind {
			t.Fatalf("answer to %d: id %d, serialization %d, status %d, body %.40q; want serialization %d, status %d, kind %q",
				id, h.ID(), h.Flags().Serialization(), h.Status(), body, formattest.ID, status, kind)
		}
		return body
	}
}

// writeToy writes req, in the toy format, under id.
func writeToy(t *testing.T, c net.Conn, id uint64, req *protocol.Message) {
	t.Helper()
	req.Header.SetID(id)
	if _, err := c.Write(protocol.AppendMessage(nil, req)); err != nil {
		t.Fatalf("write request %d: %v", id, err)
	}
}

// A toy request through a Pool and a Server: the handler sees what the
// toy decoded (the timeout as the call's budget, the idempotency key in
// its field) and its answer comes back through the toy, large payloads
// included, whose frames are copied rather than written in place.
func TestBodyFormatThroughPool(t *testing.T) {
	type seen struct {
		service, method, key string
		timeout              time.Duration
		deadline             bool
		attachments          map[string]string
		payload              []byte
	}
	got := make(chan seen, 1)
	ts := startServer(t, HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
		_, ok := ctx.Deadline()
		got <- seen{req.Service, req.Method, req.IdempotencyKey, req.Timeout, ok, maps.Clone(req.Attachments), bytes.Clone(req.Payload)}
		resp.Payload = append(append(resp.Payload[:0], "re:"...), req.Payload...)
		resp.Attachments = map[string]string{"served-by": "toy"}
	}), ServerConfig{})
	p := newPool(t, Config{})
	for _, size := range []int{5, largePayload + 1000} {
		payload := bytes.Repeat([]byte{'p'}, size)
		req := toyRequest(payload)
		req.Timeout = 5 * time.Second
		req.IdempotencyKey = "k-7"
		req.Attachments = map[string]string{"version": "1.0.0", "trace": "t-1"}
		resp, err := p.RoundTrip(testCtx(t), ts.addr, req)
		if err != nil {
			t.Fatalf("payload of %d bytes: %v", size, err)
		}
		s := waitFor(t, got, "the handler")
		if s.service != req.Service || s.method != req.Method || s.key != "k-7" || !bytes.Equal(s.payload, payload) ||
			!maps.Equal(s.attachments, req.Attachments) {
			t.Errorf("handler saw %q.%q key %q attachments %q payload of %d bytes", s.service, s.method, s.key, s.attachments, len(s.payload))
		}
		if s.timeout <= 0 || s.timeout > 5*time.Second || !s.deadline {
			t.Errorf("handler saw timeout %v (deadline %v), want a budget of at most 5s", s.timeout, s.deadline)
		}
		if !bytes.Equal(resp.Payload, append([]byte("re:"), payload...)) || resp.Attachments["served-by"] != "toy" ||
			resp.Header.Flags().Serialization() != formattest.ID {
			t.Errorf("response: serialization %d, attachments %q, payload of %d bytes",
				resp.Header.Flags().Serialization(), resp.Attachments, len(resp.Payload))
		}
		p.Release(resp)
	}
}

// The handler's answers on the wire: a value as the toy's value, a
// handler's error (70) as the toy's exception under status 20, which the
// Pool reads back as a remote 70 with its text and code.
func TestBodyFormatHandlerAnswers(t *testing.T) {
	ts := startServer(t, HandlerFunc(func(_ context.Context, req, resp *protocol.Message) {
		if string(req.Payload) == "fail" {
			resp.SetError(protocol.NewError(protocol.StatusServiceError, "stock_short", "only 3 left"))
			return
		}
		resp.Payload = append(resp.Payload[:0], "ok"...)
	}), ServerConfig{})
	c := dialRaw(t, ts.addr)
	writeToy(t, c, 1, toyRequest([]byte("x")))
	toyAnswer(t, c, 1, protocol.StatusOK, formattest.KindValue)
	writeToy(t, c, 2, toyRequest([]byte("fail")))
	if body := toyAnswer(t, c, 2, protocol.StatusOK, formattest.KindException); !bytes.Contains(body, []byte("only 3 left")) {
		t.Errorf("exception body %q does not carry the handler's text", body)
	}

	p := newPool(t, Config{})
	_, err := p.RoundTrip(testCtx(t), ts.addr, toyRequest([]byte("fail")))
	if pe := wantStatus(t, err, protocol.StatusServiceError, true, false); pe.Msg != "only 3 left" || pe.Code != "stock_short" {
		t.Errorf("error %#v, want the handler's text and code", pe)
	}
}

// The statuses the server makes itself go out in the toy's layout too:
// 40 for a body the toy cannot decode or one over MaxBody (the connection
// kept), 31 for a spent budget, 100 for overload, 60 for no handler, 50
// for a response over MaxBody.
func TestBodyFormatServerStatuses(t *testing.T) {
	t.Run("40 undecodable, connection kept", func(t *testing.T) {
		ts := startServer(t, echo, ServerConfig{})
		c := dialRaw(t, ts.addr)
		bad := protocol.AppendMessage(nil, toyRequest(nil))
		bad[protocol.HeaderLen] = formattest.KindValue // a value is no request
		binary.BigEndian.PutUint64(bad[4:12], 1)
		if _, err := c.Write(bad); err != nil {
			t.Fatal(err)
		}
		if body := toyAnswer(t, c, 1, protocol.StatusBadRequest, formattest.KindStatus); !bytes.Contains(body, []byte("toy")) {
			t.Errorf("40's text %q does not name the format", body)
		}
		writeToy(t, c, 2, toyRequest([]byte("after")))
		if body := toyAnswer(t, c, 2, protocol.StatusOK, formattest.KindValue); !bytes.Contains(body, []byte("after")) {
			t.Errorf("the next request was answered %q", body)
		}
	})
	t.Run("40 over MaxBody", func(t *testing.T) {
		ts := startServer(t, echo, ServerConfig{MaxBody: 1 << 10})
		c := dialRaw(t, ts.addr)
		writeToy(t, c, 1, toyRequest(make([]byte, 2<<10)))
		toyAnswer(t, c, 1, protocol.StatusBadRequest, formattest.KindStatus)
		writeToy(t, c, 2, toyRequest([]byte("small")))
		toyAnswer(t, c, 2, protocol.StatusOK, formattest.KindValue)
	})
	t.Run("31 budget spent", func(t *testing.T) {
		ts := startServer(t, echo, ServerConfig{})
		c := dialRaw(t, ts.addr)
		req := toyRequest(nil)
		req.Timeout = -1 // "0" on the wire: spent
		writeToy(t, c, 1, req)
		toyAnswer(t, c, 1, protocol.StatusServerTimeout, formattest.KindStatus)
	})
	t.Run("100 overload", func(t *testing.T) {
		bs := startBlockingServer(t, ServerConfig{MaxConcurrent: 1})
		defer close(bs.release)
		c := dialRaw(t, bs.addr)
		writeToy(t, c, 1, toyRequest([]byte("first")))
		waitFor(t, bs.entered, "the first handler")
		writeToy(t, c, 2, toyRequest([]byte("second")))
		toyAnswer(t, c, 2, protocol.StatusServerThreadpoolExhausted, formattest.KindStatus)
	})
	t.Run("60 no handler", func(t *testing.T) {
		ts := startServer(t, nil, ServerConfig{})
		_, err := newPool(t, Config{}).RoundTrip(testCtx(t), ts.addr, toyRequest(nil))
		if pe := wantStatus(t, err, protocol.StatusServiceNotFound, true, false); pe.Code != protocol.CodeUnimplemented {
			t.Errorf("code %q, want %q", pe.Code, protocol.CodeUnimplemented)
		}
		c := dialRaw(t, ts.addr)
		writeToy(t, c, 1, toyRequest(nil))
		toyAnswer(t, c, 1, protocol.StatusServiceNotFound, formattest.KindStatus)
	})
	t.Run("50 response over MaxBody", func(t *testing.T) {
		ts := startServer(t, HandlerFunc(func(_ context.Context, _, resp *protocol.Message) {
			resp.Payload = append(resp.Payload[:0], make([]byte, 2<<10)...)
		}), ServerConfig{MaxBody: 1 << 10})
		c := dialRaw(t, ts.addr)
		writeToy(t, c, 1, toyRequest(nil))
		toyAnswer(t, c, 1, protocol.StatusBadResponse, formattest.KindStatus)
	})
}

// No body crashes the server or costs the connection: every truncation
// and every one-byte corruption of a toy request is answered under its
// id, 40 when the toy cannot decode it, and the connection serves on.
func TestBodyFormatMalformedBodies(t *testing.T) {
	ts := startServer(t, echo, ServerConfig{})
	c := dialRaw(t, ts.addr)
	good := toyRequest([]byte("payload"))
	good.Attachments = map[string]string{"k": "v"}
	body := protocol.AppendMessage(nil, good)[protocol.HeaderLen:]
	var bodies [][]byte
	for n := range len(body) {
		bodies = append(bodies, body[:n])
	}
	for i := range body {
		for _, v := range []byte{0x00, 0xff, 'V'} {
			b := bytes.Clone(body)
			b[i] = v
			bodies = append(bodies, b)
		}
	}
	bad := 0
	for i, b := range bodies {
		id := uint64(i + 1)
		if _, err := c.Write(rawFrame(id, protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, formattest.ID), b)); err != nil {
			t.Fatalf("body %d: %v", i, err)
		}
		h, answer := readRawFrame(t, c)
		if h.ID() != id || (h.Status() != protocol.StatusOK && h.Status() != protocol.StatusBadRequest) {
			t.Fatalf("body %d (% x): answered id %d status %d %q", i, b, h.ID(), h.Status(), answer)
		}
		if h.Status() == protocol.StatusBadRequest {
			bad++
			if !strings.Contains(string(answer), "malformed") {
				t.Errorf("body %d: 40 says %q", i, answer)
			}
		}
	}
	if bad < len(body) { // every truncation at least
		t.Errorf("only %d of %d bodies were refused", bad, len(bodies))
	}
	writeToy(t, c, uint64(len(bodies)+1), toyRequest([]byte("after")))
	toyAnswer(t, c, uint64(len(bodies)+1), protocol.StatusOK, formattest.KindValue)
}
