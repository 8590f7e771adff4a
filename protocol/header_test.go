package protocol_test

import (
	"testing"

	"github.com/dabbrpc/dabb/protocol"
)

func TestHeaderAccessors(t *testing.T) {
	tests := []struct {
		name   string
		flags  protocol.Flags
		status protocol.Status
		id     uint64
		length uint32
		want   [protocol.HeaderLen]byte
	}{
		{
			name: "request", flags: 0xd6, status: 0, id: 1, length: 0x38,
			want: [16]byte{0xda, 0xbb, 0xd6, 0x00, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0x38},
		},
		{
			name: "response", flags: 0x16, status: protocol.StatusOK, id: 0x0102030405060708, length: 5,
			want: [16]byte{0xda, 0xbb, 0x16, 0x14, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 5},
		},
		{
			name: "max", flags: 0xff, status: 0xff, id: ^uint64(0), length: ^uint32(0),
			want: [16]byte{0xda, 0xbb, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var h protocol.Header
			h.Init(tt.flags, tt.status, tt.id)
			h.SetBodyLen(tt.length)
			if h != tt.want {
				t.Fatalf("header bytes % x, want % x", h[:], tt.want[:])
			}
			if h.Magic() != protocol.Magic || h.Magic() != 0xdabb {
				t.Errorf("Magic() = %#x", h.Magic())
			}
			if h.Flags() != tt.flags {
				t.Errorf("Flags() = %#x, want %#x", h.Flags(), tt.flags)
			}
			if h.Status() != tt.status {
				t.Errorf("Status() = %d, want %d", h.Status(), tt.status)
			}
			if h.ID() != tt.id {
				t.Errorf("ID() = %#x, want %#x", h.ID(), tt.id)
			}
			if h.BodyLen() != tt.length {
				t.Errorf("BodyLen() = %d, want %d", h.BodyLen(), tt.length)
			}
		})
	}
}

func TestHeaderSetters(t *testing.T) {
	var h protocol.Header
	if h.Magic() != 0 {
		t.Fatalf("zero header has magic %#x", h.Magic())
	}
	h.SetMagic()
	h.SetFlags(protocol.FlagEvent)
	h.SetStatus(protocol.StatusServiceError)
	h.SetID(7)
	h.SetBodyLen(2)
	want := protocol.Header{0xda, 0xbb, 0x20, 70, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 2}
	if h != want {
		t.Errorf("header bytes % x, want % x", h[:], want[:])
	}
	if protocol.HeaderLen != 16 {
		t.Errorf("HeaderLen = %d", protocol.HeaderLen)
	}
	if protocol.DefaultMaxBody != 8<<20 {
		t.Errorf("DefaultMaxBody = %d, want 8 MiB", protocol.DefaultMaxBody)
	}
}

func TestFlags(t *testing.T) {
	tests := []struct {
		f                      protocol.Flags
		request, twoWay, event bool
		serialization          byte
	}{
		{0x00, false, false, false, 0},
		{0xd6, true, true, false, 22},   // two-way request, protobuf
		{0x16, false, false, false, 22}, // response, protobuf
		{0xe2, true, true, true, 2},     // heartbeat request
		{0x22, false, false, true, 2},   // heartbeat response
		{0xa2, true, false, true, 2},    // read-only event
		{0x90, true, false, false, 16},  // one-way request, json
		{0xff, true, true, true, 31},
	}
	for _, tt := range tests {
		if got := tt.f.IsRequest(); got != tt.request {
			t.Errorf("%#02x.IsRequest() = %v", byte(tt.f), got)
		}
		if got := tt.f.IsTwoWay(); got != tt.twoWay {
			t.Errorf("%#02x.IsTwoWay() = %v", byte(tt.f), got)
		}
		if got := tt.f.IsEvent(); got != tt.event {
			t.Errorf("%#02x.IsEvent() = %v", byte(tt.f), got)
		}
		if got := tt.f.Serialization(); got != tt.serialization {
			t.Errorf("%#02x.Serialization() = %d, want %d", byte(tt.f), got, tt.serialization)
		}
	}
}

func TestMakeFlags(t *testing.T) {
	tests := []struct {
		name string
		kind protocol.Flags
		ser  byte
		want protocol.Flags
	}{
		{"two-way request", protocol.FlagRequest | protocol.FlagTwoWay, 22, 0xd6},
		{"response", 0, 22, 0x16},
		{"heartbeat", protocol.FlagRequest | protocol.FlagTwoWay | protocol.FlagEvent, protocol.Hessian2, 0xe2},
		{"serialization masked to five bits", protocol.FlagRequest, 0xff, 0x9f},
		{"serialization bits in kind ignored", protocol.FlagRequest | 0x1f, 16, 0x90},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := protocol.MakeFlags(tt.kind, tt.ser); got != tt.want {
				t.Errorf("MakeFlags(%#x, %d) = %#x, want %#x", byte(tt.kind), tt.ser, byte(got), byte(tt.want))
			}
		})
	}
}
