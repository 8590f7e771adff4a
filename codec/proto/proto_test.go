package proto_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/dabbrpc/dabb/codec"
	dabbproto "github.com/dabbrpc/dabb/codec/proto"
	"google.golang.org/protobuf/encoding/protowire"
	pb "google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestRegistered(t *testing.T) {
	byID, err := codec.ByID(22)
	if err != nil {
		t.Fatalf("ByID(22): %v", err)
	}
	if byID.Name() != "proto" || byID.ID() != dabbproto.ID {
		t.Errorf("ByID(22) = %q id %d, want \"proto\" id 22", byID.Name(), byID.ID())
	}
	byName, err := codec.ByName("proto")
	if err != nil {
		t.Fatalf(`ByName("proto"): %v`, err)
	}
	if byName.ID() != 22 {
		t.Errorf(`ByName("proto").ID() = %d, want 22`, byName.ID())
	}
}

func TestRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		in   pb.Message
		out  pb.Message
	}{
		{"empty", &wrapperspb.StringValue{}, &wrapperspb.StringValue{}},
		{"string", wrapperspb.String("sku-42"), &wrapperspb.StringValue{}},
		{"bytes", wrapperspb.Bytes([]byte{0, 1, 2, 0xff}), &wrapperspb.BytesValue{}},
		{"int64", wrapperspb.Int64(-98), &wrapperspb.Int64Value{}},
		{"large", wrapperspb.Bytes(bytes.Repeat([]byte("x"), 100<<10)), &wrapperspb.BytesValue{}},
	}
	var c dabbproto.Codec
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := []byte("prefix")
			b, err := c.Marshal(append([]byte(nil), prefix...), tt.in)
			if err != nil {
				t.Fatalf("Marshal: %v", err)
			}
			if !bytes.HasPrefix(b, prefix) {
				t.Fatalf("Marshal did not append: got %q...", b[:min(len(b), 16)])
			}
			want, _ := pb.Marshal(tt.in)
			if !bytes.Equal(b[len(prefix):], want) {
				t.Fatalf("Marshal appended % x, want % x", b[len(prefix):], want)
			}
			if err := c.Unmarshal(b[len(prefix):], tt.out); err != nil {
				t.Fatalf("Unmarshal: %v", err)
			}
			if !pb.Equal(tt.in, tt.out) {
				t.Errorf("round trip: got %v, want %v", tt.out, tt.in)
			}
		})
	}
}

func TestNotAMessage(t *testing.T) {
	var c dabbproto.Codec
	var nilMsg *wrapperspb.StringValue
	tests := []struct {
		name     string
		call     func() error
		wantType string
	}{
		{"marshal int", func() error { _, err := c.Marshal(nil, 42); return err }, "int"},
		{"marshal struct", func() error { _, err := c.Marshal(nil, struct{ A int }{1}); return err }, "struct { A int }"},
		{"marshal value not pointer", func() error { _, err := c.Marshal(nil, map[string]int{}); return err }, "map[string]int"},
		{"marshal nil interface", func() error { _, err := c.Marshal(nil, nil); return err }, "<nil>"},
		{"unmarshal into string pointer", func() error { s := ""; return c.Unmarshal(nil, &s) }, "*string"},
		{"unmarshal into nil message", func() error { return c.Unmarshal([]byte{0x0a, 0x01, 'x'}, nilMsg) }, "*wrapperspb.StringValue"},
		{"unmarshal into nil interface", func() error { return c.Unmarshal(nil, nil) }, "<nil>"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if !errors.Is(err, dabbproto.ErrNotMessage) {
				t.Fatalf("err = %v, want ErrNotMessage", err)
			}
			if !strings.Contains(err.Error(), tt.wantType) {
				t.Errorf("err %q does not name the type %q", err, tt.wantType)
			}
		})
	}
}

func TestMarshalKeepsDstOnError(t *testing.T) {
	var c dabbproto.Codec
	dst := []byte("keep")
	got, err := c.Marshal(dst, "not a message")
	if err == nil {
		t.Fatal("Marshal of a string succeeded")
	}
	if string(got) != "keep" {
		t.Errorf("Marshal returned %q on error, want dst unchanged", got)
	}
}

func TestUnmarshalBadData(t *testing.T) {
	var c dabbproto.Codec
	tests := []struct {
		name string
		data []byte
	}{
		{"truncated length", []byte{0x0a, 0x05, 'a'}},
		{"bad varint", []byte{0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}},
		{"field number zero", []byte{0x00, 0x01}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := c.Unmarshal(tt.data, &wrapperspb.StringValue{})
			if err == nil {
				t.Fatal("Unmarshal of bad data succeeded")
			}
			if errors.Is(err, dabbproto.ErrNotMessage) {
				t.Errorf("bad data reported as ErrNotMessage: %v", err)
			}
			if !strings.HasPrefix(err.Error(), "codec/proto: unmarshal *wrapperspb.StringValue") {
				t.Errorf("err %q lacks context", err)
			}
		})
	}
}

func TestUnmarshalResets(t *testing.T) {
	var c dabbproto.Codec
	v := wrapperspb.String("old")
	if err := c.Unmarshal(nil, v); err != nil {
		t.Fatalf("Unmarshal: %v", err)
	}
	if v.GetValue() != "" {
		t.Errorf("Unmarshal of an empty payload kept %q, want the message reset", v.GetValue())
	}
}

// The transport reuses a payload buffer once Unmarshal returns, so the
// decoded message must own its strings, bytes and unknown fields.
func TestUnmarshalDoesNotAlias(t *testing.T) {
	var c dabbproto.Codec
	t.Run("bytes", func(t *testing.T) {
		data, _ := pb.Marshal(wrapperspb.Bytes([]byte("payload-bytes")))
		var v wrapperspb.BytesValue
		if err := c.Unmarshal(data, &v); err != nil {
			t.Fatal(err)
		}
		clear(data)
		if string(v.GetValue()) != "payload-bytes" {
			t.Errorf("bytes field changed with the buffer: %q", v.GetValue())
		}
	})
	t.Run("string", func(t *testing.T) {
		data, _ := pb.Marshal(wrapperspb.String("payload-string"))
		var v wrapperspb.StringValue
		if err := c.Unmarshal(data, &v); err != nil {
			t.Fatal(err)
		}
		clear(data)
		if v.GetValue() != "payload-string" {
			t.Errorf("string field changed with the buffer: %q", v.GetValue())
		}
	})
	t.Run("unknown fields", func(t *testing.T) {
		data := protowire.AppendTag(nil, 7, protowire.BytesType)
		data = protowire.AppendBytes(data, []byte("unknown-field"))
		want := append([]byte(nil), data...)
		var v wrapperspb.StringValue
		if err := c.Unmarshal(data, &v); err != nil {
			t.Fatal(err)
		}
		clear(data)
		if got := v.ProtoReflect().GetUnknown(); !bytes.Equal(got, want) {
			t.Errorf("unknown fields changed with the buffer: % x, want % x", got, want)
		}
	})
}

func TestMarshalNoAllocs(t *testing.T) {
	var c dabbproto.Codec
	msg := wrapperspb.String("sku-42 with a few more bytes")
	buf := make([]byte, 0, 256)
	allocs := testing.AllocsPerRun(100, func() {
		var err error
		buf, err = c.Marshal(buf[:0], msg)
		if err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("Marshal into a buffer with room: %v allocs/op, want 0", allocs)
	}
}

func BenchmarkMarshal(b *testing.B) {
	var c dabbproto.Codec
	msg := wrapperspb.String("sku-42 with a few more bytes")
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		buf, _ = c.Marshal(buf[:0], msg)
	}
}

func BenchmarkUnmarshal(b *testing.B) {
	var c dabbproto.Codec
	data, _ := pb.Marshal(wrapperspb.String("sku-42 with a few more bytes"))
	var v wrapperspb.StringValue
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Unmarshal(data, &v); err != nil {
			b.Fatal(err)
		}
	}
}

// A nil message pointer encodes as the empty message, as protobuf defines.
func TestMarshalNilMessage(t *testing.T) {
	var c dabbproto.Codec
	var m *wrapperspb.StringValue
	got, err := c.Marshal([]byte("dst"), m)
	if err != nil {
		t.Fatalf("Marshal(nil message): %v", err)
	}
	if string(got) != "dst" {
		t.Errorf("Marshal(nil message) appended %q, want nothing", got[3:])
	}
}

// A large message marshaled after a prefix that lacks room lands in a new
// (pooled) buffer with the prefix kept; sizes on both sides of the pool's
// 64 KiB floor encode exactly as proto.Marshal does.
func TestMarshalLarge(t *testing.T) {
	var c dabbproto.Codec
	for _, n := range []int{100, 64<<10 - 10, 64 << 10, 1 << 20} {
		msg := wrapperspb.Bytes(bytes.Repeat([]byte{7}, n))
		want, err := pb.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		for _, dst := range [][]byte{nil, []byte("pre"), make([]byte, 0, 2<<20)} {
			got, err := c.Marshal(dst, msg)
			if err != nil {
				t.Fatalf("Marshal of %d bytes: %v", n, err)
			}
			if !bytes.Equal(got[:len(dst)], dst) || !bytes.Equal(got[len(dst):], want) {
				t.Errorf("Marshal of %d bytes after a %d-byte prefix: wrong encoding", n, len(dst))
			}
		}
	}
}
