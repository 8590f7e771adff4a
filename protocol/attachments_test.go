package protocol_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

// attachmentFrame returns a request frame with id whose body is empty
// service and method names and then count attachment pairs, pair(i)
// encoding the i-th (key and value, each with its length).
func attachmentFrame(id uint64, count int, pair func(dst []byte, i int) []byte) []byte {
	body := []byte{0, 0}
	body = binary.AppendUvarint(body, uint64(count))
	for i := range count {
		body = pair(body, i)
	}
	h := request(id)
	h.SetBodyLen(uint32(len(body)))
	return append(h[:], body...)
}

// distinctKeys encodes pair i as a distinct 3-byte key with an empty
// value: 5 bytes a pair, the cheapest distinct pairs on the wire.
func distinctKeys(dst []byte, i int) []byte {
	return append(dst, 3, byte(i>>16), byte(i>>8), byte(i), 0)
}

// emptyPair encodes every pair as an empty key with an empty value.
func emptyPair(dst []byte, _ int) []byte { return append(dst, 0, 0) }

// TestAttachmentFloodRefused: a body within the default limit (8 MiB) made
// only of attachment pairs claims some millions of them, which the body
// can hold. Decoding them all (distinct 3-byte keys with empty values
// made 1.7 million map entries, 176 MiB allocated per frame) is refused:
// the frame is malformed, after it was read whole, so a server answers
// the request named in its header with 40 and the next frame reads.
func TestAttachmentFloodRefused(t *testing.T) {
	const body = int(protocol.DefaultMaxBody)
	tests := []struct {
		name  string
		frame []byte
	}{
		{"distinct keys", attachmentFrame(42, (body-6)/5, distinctKeys)},
		{"one pair repeated", attachmentFrame(42, (body-6)/2, emptyPair)},
	}
	next := encode(&protocol.Message{Header: request(99), Service: "ok", Method: "next"})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stream := append(tt.frame[:len(tt.frame):len(tt.frame)], next...)
			r := protocol.NewReader(reader(stream), 0) // as a server reads
			var m protocol.Message
			err := r.Read(&m)
			if !errors.Is(err, protocol.ErrMalformed) || !errors.Is(err, protocol.ErrTooManyAttachments) {
				t.Fatalf("err = %v, want ErrMalformed and ErrTooManyAttachments", err)
			}
			if want := fmt.Sprintf("limit %d", protocol.MaxAttachments); !strings.Contains(err.Error(), want) {
				t.Errorf("err %q does not say %q", err, want)
			}
			if m.Header.ID() != 42 || !m.Header.Flags().IsTwoWay() {
				t.Errorf("header not filled, a server cannot answer: % x", m.Header[:])
			}
			if m.Attachments != nil {
				t.Errorf("%d attachments decoded from a refused frame", len(m.Attachments))
			}
			if err := r.Read(&m); err != nil {
				t.Fatalf("the frame after the refused one: %v", err)
			}
			if m.Header.ID() != 99 || m.Method != "next" {
				t.Errorf("the frame after the refused one read as id %d method %q", m.Header.ID(), m.Method)
			}

			// What the read costs is the body (read in growing chunks)
			// and the reader's buffer: no more than twice the frame.
			n := allocatedBytes(3, func() {
				var m protocol.Message
				_ = protocol.NewReader(reader(tt.frame), 0).Read(&m)
				m.Recycle()
			})
			if limit := 2 * uint64(len(tt.frame)); n > limit {
				t.Errorf("reading the refused %d-byte frame allocated %d MiB, want at most %d MiB",
					len(tt.frame), n>>20, limit>>20)
			}
		})
	}
}

// TestAttachmentLimitCounts: MaxAttachments counts what goes on the wire,
// the timeout and idempotency key included and a map entry they replace
// excluded. A message at the limit passes CheckAttachments and reads back;
// one more is refused by CheckAttachments, and by a receiver as
// malformed if it is written anyway.
func TestAttachmentLimitCounts(t *testing.T) {
	withMap := func(n int, extra map[string]string) map[string]string {
		a := make(map[string]string, n+len(extra))
		for i := range n {
			a[fmt.Sprintf("k%d", i)] = "v"
		}
		maps.Copy(a, extra)
		return a
	}
	const limit = protocol.MaxAttachments
	tests := []struct {
		name string
		m    protocol.Message
		wire int // the attachment count on the wire
	}{
		{"map alone", protocol.Message{Attachments: withMap(limit, nil)}, limit},
		{"timeout and key fields", protocol.Message{Timeout: time.Second, IdempotencyKey: "k",
			Attachments: withMap(limit-2, nil)}, limit},
		{"timeout in the map is not sent", protocol.Message{Attachments: withMap(limit,
			map[string]string{protocol.AttachTimeout: "5"})}, limit},
		{"key in the map replaced by the field", protocol.Message{IdempotencyKey: "k",
			Attachments: withMap(limit-1, map[string]string{protocol.AttachIdempotencyKey: "old"})}, limit},
		{"key in the map sent", protocol.Message{Attachments: withMap(limit-1,
			map[string]string{protocol.AttachIdempotencyKey: "k"})}, limit},
		{"map one over", protocol.Message{Attachments: withMap(limit+1, nil)}, limit + 1},
		{"timeout one over", protocol.Message{Timeout: time.Second, Attachments: withMap(limit, nil)}, limit + 1},
		{"key one over", protocol.Message{IdempotencyKey: "k", Attachments: withMap(limit, nil)}, limit + 1},
	}
	next := encode(&protocol.Message{Header: request(99), Service: "ok", Method: "next"})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := tt.m
			m.Header = request(7)
			m.Service, m.Method, m.Payload = "s", "m", []byte("payload")
			err := protocol.CheckAttachments(&m)
			frame := encode(&m)
			if got := protocol.BodyLen(&m); got != len(frame)-protocol.HeaderLen {
				t.Errorf("BodyLen = %d, AppendMessage wrote %d", got, len(frame)-protocol.HeaderLen)
			}
			r := reader(append(frame, next...))
			var got protocol.Message
			rerr := protocol.ReadMessage(r, &got, 0)
			if tt.wire <= limit {
				if err != nil {
					t.Fatalf("CheckAttachments: %v", err)
				}
				if rerr != nil {
					t.Fatalf("ReadMessage: %v", rerr)
				}
				want := m
				want.Attachments = maps.Clone(m.Attachments)
				delete(want.Attachments, protocol.AttachTimeout) // never sent from the map
				if d := diffMessage(&got, &want); d != "" {
					t.Fatal(d)
				}
			} else {
				if !errors.Is(err, protocol.ErrTooManyAttachments) {
					t.Fatalf("CheckAttachments = %v, want ErrTooManyAttachments", err)
				}
				if want := fmt.Sprintf("%d, limit %d", tt.wire, limit); !strings.Contains(err.Error(), want) {
					t.Errorf("CheckAttachments = %q, want it to say %q", err, want)
				}
				if !errors.Is(rerr, protocol.ErrMalformed) || !errors.Is(rerr, protocol.ErrTooManyAttachments) {
					t.Fatalf("ReadMessage = %v, want ErrMalformed and ErrTooManyAttachments", rerr)
				}
			}
			if err := protocol.ReadMessage(r, &got, 0); err != nil || got.Header.ID() != 99 {
				t.Fatalf("the frame after: id %d, %v", got.Header.ID(), err)
			}
		})
	}

	// Events carry Dubbo's bodies, never attachments.
	ev := protocol.Message{Attachments: withMap(limit+1, nil)}
	ev.Header.Init(protocol.MakeFlags(protocol.FlagEvent, 2), 0, 1)
	if err := protocol.CheckAttachments(&ev); err != nil {
		t.Errorf("CheckAttachments of an event: %v", err)
	}
}

// TestAttachmentsAtTheLimitCost: the most expensive frame a peer may send
// now, MaxAttachments distinct short keys with empty values (about 5 KiB
// on the wire), costs a bounded amount to decode and keep: about 100 KiB
// (measured), checked here against 256 KiB.
func TestAttachmentsAtTheLimitCost(t *testing.T) {
	frame := attachmentFrame(1, protocol.MaxAttachments, func(dst []byte, i int) []byte {
		return append(dst, 2, byte(i>>8), byte(i), 0)
	})
	const runs = 10
	ms := make([]protocol.Message, runs)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.GC() // and what sync.Pools (the body buffers' pool) held over the first
	runtime.ReadMemStats(&before)
	for i := range ms {
		if err := protocol.ReadMessage(reader(frame), &ms[i], 0); err != nil {
			t.Fatalf("ReadMessage: %v", err)
		}
	}
	runtime.ReadMemStats(&after)
	allocated := (after.TotalAlloc - before.TotalAlloc) / runs
	runtime.GC()
	runtime.ReadMemStats(&after)
	kept := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / runs
	for i := range ms {
		if len(ms[i].Attachments) != protocol.MaxAttachments {
			t.Fatalf("decoded %d attachments, want %d", len(ms[i].Attachments), protocol.MaxAttachments)
		}
	}
	runtime.KeepAlive(ms)
	t.Logf("%d-byte frame: %d KiB allocated, %d KiB kept per message", len(frame), allocated>>10, kept>>10)
	const limit = 256 << 10
	if allocated > limit || kept > limit {
		t.Errorf("a %d-byte frame of %d attachments allocated %d KiB and kept %d KiB, want at most %d KiB each",
			len(frame), protocol.MaxAttachments, allocated>>10, kept>>10, limit>>10)
	}
}
