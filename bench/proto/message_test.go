package benchpb

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"
)

func TestNewMessageSize(t *testing.T) {
	for _, tc := range []struct {
		name      string
		size, out int
	}{
		{"standard", 0, StandardSize},
		{"16k", 16 << 10, 16 << 10},
		{"1m", 1 << 20, 1 << 20},
		{"just over", StandardSize + 4, StandardSize + 4},
		{"too close", StandardSize + 3, StandardSize},
		{"odd", 1000, 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Size(NewMessage(tc.size)); got != tc.out {
				t.Errorf("NewMessage(%d) marshals to %d bytes, want %d", tc.size, got, tc.out)
			}
		})
	}
}

func TestCopyToCopiesEveryField(t *testing.T) {
	src := NewMessage(2000)
	src.Field5 = []uint64{1, 2}
	dst := new(BenchmarkMessage)
	CopyTo(dst, src)
	if !proto.Equal(dst, src) {
		t.Fatalf("CopyTo missed a field:\n got %v\nwant %v", dst, src)
	}
}

func TestCheck(t *testing.T) {
	req := NewMessage(0)
	good := NewMessage(0)
	Answer(good)
	short := NewMessage(0)
	Answer(short)
	short.Padding = []byte{1}
	for _, tc := range []struct {
		name  string
		reply *BenchmarkMessage
		ok    bool
	}{
		{"answer", good, true},
		{"nil", nil, false},
		{"unanswered", NewMessage(0), false},
		{"padding", short, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(req, tc.reply)
			if tc.ok && err != nil {
				t.Fatalf("Check: %v", err)
			}
			if !tc.ok && !errors.Is(err, ErrBadReply) {
				t.Fatalf("Check = %v, want ErrBadReply", err)
			}
		})
	}
}
