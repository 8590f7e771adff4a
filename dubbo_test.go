package dabb_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/protocol"
)

// dubboFrame is a Dubbo consumer's request in serialization ser: the
// Dubbo version, the path, the service version, the method, the parameter
// types and the argument, as hessian2 strings.
func dubboFrame(id uint64, ser byte) []byte {
	var body []byte
	for _, s := range []string{"2.0.2", "org.example.Greeter", "0.0.0", "sayHello", "Ljava/lang/String;", "world"} {
		body = protocol.AppendHessianString(body, s)
	}
	var h protocol.Header
	h.Init(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, ser), 0, id)
	h.SetBodyLen(uint32(len(body)))
	return append(h[:], body...)
}

// TestDubboConsumerGets40 (#17): a Dubbo consumer's request reaches a
// dabb server. Its serialization is none of dabb's codecs, so it is
// answered 40 before its body is parsed (no "service 2.0.2 not found"),
// and the reason is written as Dubbo writes an error in the request's
// serialization: a hessian2 string for hessian2, a JSON string for
// fastjson. No handler runs; the server logs the peer once.
func TestDubboConsumerGets40(t *testing.T) {
	p := newProbe()
	logs := &logLines{}
	_, addr := startServer(t, p, dabb.WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	c, err := net.DialTimeout("tcp", addr, testTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(testTimeout))
	br := bufio.NewReader(c)
	for i, tt := range []struct {
		ser    byte
		decode func([]byte) (string, error)
	}{
		{protocol.Hessian2, func(b []byte) (string, error) {
			s, rest, err := protocol.DecodeHessianString(b)
			if err == nil && len(rest) != 0 {
				err = errors.New("bytes after the string")
			}
			return s, err
		}},
		{6, func(b []byte) (string, error) { // fastjson
			var s string
			return s, json.Unmarshal(b, &s)
		}},
	} {
		id := uint64(41 + i)
		if _, err := c.Write(dubboFrame(id, tt.ser)); err != nil {
			t.Fatal(err)
		}
		var h protocol.Header
		if _, err := io.ReadFull(br, h[:]); err != nil {
			t.Fatalf("serialization %d: reading the answer: %v", tt.ser, err)
		}
		body := make([]byte, h.BodyLen())
		if _, err := io.ReadFull(br, body); err != nil {
			t.Fatal(err)
		}
		if h.ID() != id || h.Status() != protocol.StatusBadRequest || h.Flags().Serialization() != tt.ser {
			t.Fatalf("serialization %d: answer id %d status %d serialization %d; want %d, 40, %d",
				tt.ser, h.ID(), h.Status(), h.Flags().Serialization(), id, tt.ser)
		}
		msg, err := tt.decode(body)
		if err != nil {
			t.Fatalf("serialization %d: the body %q does not decode: %v", tt.ser, body, err)
		}
		if !strings.Contains(msg, "dabb server") || strings.Contains(msg, "2.0.2") {
			t.Errorf("serialization %d: the answer says %q; want it to name dabb, not a service 2.0.2", tt.ser, msg)
		}
	}
	if n := logs.count("does not read"); n != 1 {
		t.Errorf("the server logged the Dubbo peer %d times, want once:\n%s", n, logs)
	}
	if n := p.ran.Load(); n != 0 {
		t.Errorf("a handler ran %d times for Dubbo requests", n)
	}
}

// TestClientOfADubboProvider (#17): a dabb client that reaches a Dubbo
// provider, which answers in hessian2, fails the call with a local 50
// saying the peer is not a dabb server and naming its serialization,
// instead of "connection lost".
func TestClientOfADubboProvider(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var h protocol.Header
		if _, err := io.ReadFull(c, h[:]); err != nil {
			return
		}
		if _, err := io.CopyN(io.Discard, c, int64(h.BodyLen())); err != nil {
			return
		}
		_, _ = c.Write(protocol.AppendForeignError(nil, h.ID(), protocol.Hessian2, protocol.StatusBadRequest,
			"Failed to decode request due to java.io.IOException"))
		_, _ = io.Copy(io.Discard, c) // until the client closes
	}()
	cl := newClient(t, l.Addr().String())
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	_, err = call(ctx, cl, "echo")
	pe := statusOf(t, err)
	if pe.Status != protocol.StatusBadResponse || !strings.Contains(pe.Error(), "not a dabb server") ||
		!strings.Contains(pe.Error(), "hessian2 (id 2)") {
		t.Fatalf("call to a Dubbo provider: %v; want 50 saying it is not a dabb server, naming hessian2 (id 2)", err)
	}
	cl.Close()
	<-done
}
