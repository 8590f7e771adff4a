package protocol_test

import (
	"bufio"
	"bytes"
	"fmt"
	"maps"
	"runtime"
	"strings"
	"testing"

	"github.com/dabbrpc/dabb/protocol"
)

// request returns a two-way request header for serialization 22.
func request(id uint64) protocol.Header {
	var h protocol.Header
	h.Init(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, 22), 0, id)
	return h
}

// response returns a response header for serialization 22.
func response(id uint64, s protocol.Status) protocol.Header {
	var h protocol.Header
	h.Init(protocol.MakeFlags(0, 22), s, id)
	return h
}

func encode(m *protocol.Message) []byte { return protocol.AppendMessage(nil, m) }

func reader(b []byte) *bufio.Reader { return bufio.NewReader(bytes.NewReader(b)) }

// diffMessage describes how got differs from want in what travels on the
// wire (header bytes 0-11, the body fields), or returns "". A nil and an
// empty attachment map are equal, and the idempotency key counts the same
// in its field or in the map (a read puts it in the field); the body
// length is not compared.
func diffMessage(got, want *protocol.Message) string {
	var d []string
	if !bytes.Equal(got.Header[:12], want.Header[:12]) {
		d = append(d, fmt.Sprintf("header % x, want % x", got.Header[:12], want.Header[:12]))
	}
	if got.Service != want.Service {
		d = append(d, fmt.Sprintf("service %q, want %q", got.Service, want.Service))
	}
	if got.Method != want.Method {
		d = append(d, fmt.Sprintf("method %q, want %q", got.Method, want.Method))
	}
	if got.Timeout != want.Timeout {
		d = append(d, fmt.Sprintf("timeout %v, want %v", got.Timeout, want.Timeout))
	}
	gk, ga := splitKey(got)
	wk, wa := splitKey(want)
	if gk != wk {
		d = append(d, fmt.Sprintf("idempotency key %q, want %q", gk, wk))
	}
	if !maps.Equal(ga, wa) {
		d = append(d, fmt.Sprintf("attachments %q, want %q", ga, wa))
	}
	if !bytes.Equal(got.Payload, want.Payload) {
		d = append(d, fmt.Sprintf("payload of %d bytes %.32q, want %d bytes %.32q", len(got.Payload), got.Payload, len(want.Payload), want.Payload))
	}
	return strings.Join(d, "; ")
}

// splitKey returns the idempotency key m sends and its other attachments.
func splitKey(m *protocol.Message) (string, map[string]string) {
	key, a := m.IdempotencyKey, m.Attachments
	if v, ok := a[protocol.AttachIdempotencyKey]; ok {
		if key == "" {
			key = v
		}
		a = maps.Clone(a)
		delete(a, protocol.AttachIdempotencyKey)
	}
	return key, a
}

// allocatedBytes reports the bytes f allocates on average over runs.
func allocatedBytes(runs int, f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range runs {
		f()
	}
	runtime.ReadMemStats(&after)
	return (after.TotalAlloc - before.TotalAlloc) / uint64(runs)
}

// loopReader replays data forever: a steady stream of identical frames.
type loopReader struct {
	data []byte
	off  int
}

func (r *loopReader) Read(p []byte) (int, error) {
	n := copy(p, r.data[r.off:])
	r.off += n
	if r.off == len(r.data) {
		r.off = 0
	}
	return n, nil
}

// chunkReader returns at most n bytes per Read, to exercise partial reads.
type chunkReader struct {
	r *bytes.Reader
	n int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(p) > c.n {
		p = p[:c.n]
	}
	return c.r.Read(p)
}

func mustRead(t testing.TB, r *bufio.Reader, m *protocol.Message) {
	t.Helper()
	if err := protocol.ReadMessage(r, m, 0); err != nil {
		t.Fatalf("ReadMessage: %v", err)
	}
}
