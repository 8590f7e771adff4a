// Tests of a Server serving calls in a registered body format: the toy
// format and codec of internal/formattest, serialization id 30.

package dabb_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/codec"
	"github.com/dabbrpc/dabb/internal/formattest"
	pb "github.com/dabbrpc/dabb/internal/inventory/inventorypb"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
)

func init() { formattest.Register() }

// TestServeBodyFormat: a client calling with the toy codec has its request
// decoded by the toy format and its answers encoded by it: the reply, a
// handler's error (an exception under status 20 on the wire) and the
// server's own 60 for an unknown method.
func TestServeBodyFormat(t *testing.T) {
	if !codec.Known(formattest.ID) {
		t.Fatal("codec.Known(30) is false with the toy's format and codec registered")
	}
	p := newProbe()
	_, addr := startServer(t, p)
	c := newClientWith(t, []proxy.Option{proxy.WithCodec("toy")}, addr)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	r, err := call(ctx, c, "echo", proxy.Timeout(5*time.Second))
	if err != nil || r.GetSku() != "echo" || r.GetCount() <= 0 || r.GetCount() > 5000 {
		t.Fatalf("echo: %v, reply %v; want the sku back and a budget of at most 5000 ms", err, r)
	}
	_, err = call(ctx, c, "fail")
	if pe := statusOf(t, err); pe.Status != protocol.StatusServiceError || !pe.Remote || !strings.Contains(pe.Msg, "asked to fail") {
		t.Errorf("fail: %v, want the handler's remote 70", err)
	}

	conn, err := net.DialTimeout("tcp", addr, testTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(testTimeout))
	for i, tc := range []struct {
		method, sku string
		status      protocol.Status
		kind        byte
		text        string
	}{
		{"Do", "echo", protocol.StatusOK, formattest.KindValue, `"echo"`},
		{"Do", "fail", protocol.StatusOK, formattest.KindException, "asked to fail"},
		{"Nope", "echo", protocol.StatusServiceNotFound, formattest.KindStatus, protocol.CodeUnimplemented},
	} {
		payload, _ := formattest.Codec{}.Marshal(nil, &pb.StockRequest{Sku: tc.sku})
		req := &protocol.Message{Service: probeDesc.Name, Method: tc.method, Payload: payload}
		req.Header.Init(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, formattest.ID), 0, uint64(i+1))
		if _, err := conn.Write(protocol.AppendMessage(nil, req)); err != nil {
			t.Fatal(err)
		}
		var h protocol.Header
		if _, err := io.ReadFull(conn, h[:]); err != nil {
			t.Fatal(err)
		}
		body := make([]byte, h.BodyLen())
		if _, err := io.ReadFull(conn, body); err != nil {
			t.Fatal(err)
		}
		if h.ID() != uint64(i+1) || h.Status() != tc.status || h.Flags().Serialization() != formattest.ID ||
			len(body) == 0 || body[0] != tc.kind || !bytes.Contains(body, []byte(tc.text)) {
			t.Errorf("%s(%s): answer id %d status %d serialization %d body %q; want status %d, kind %q, %q in it",
				tc.method, tc.sku, h.ID(), h.Status(), h.Flags().Serialization(), body, tc.status, tc.kind, tc.text)
		}
	}
}
