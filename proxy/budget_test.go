package proxy_test

import (
	"context"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/codec"
	cproto "github.com/dabbrpc/dabb/codec/proto"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/transport"
)

// slowCodec is the protobuf codec with a Marshal that takes marshalDelay
// and pads its output to 64 KiB (the test server does not decode
// requests): a large request whose encoding takes part of the budget.
type slowCodec struct{ cproto.Codec }

const marshalDelay = 300 * time.Millisecond

func (slowCodec) ID() byte     { return 29 }
func (slowCodec) Name() string { return "slow-test" }
func (c slowCodec) Marshal(dst []byte, v any) ([]byte, error) {
	time.Sleep(marshalDelay)
	b, err := c.Codec.Marshal(dst, v)
	return append(b, make([]byte, 64<<10)...), err
}

func init() { codec.Register(slowCodec{}) }

// TestBudgetLeftAfterMarshal: what travels with a large request is the
// budget left after encoding it, not the budget at the attempt's start.
func TestBudgetLeftAfterMarshal(t *testing.T) {
	s := &seen{}
	addr := serve(t, s, 0, transport.ServerConfig{})
	c := client(t, []string{addr}, proxy.WithCodec("slow-test"), proxy.WithTimeout(time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if _, err := invoke(ctx, c); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	got := s.budget
	s.mu.Unlock()
	if want := time.Second - marshalDelay; got > want {
		t.Errorf("the server saw a budget of %v after a %v marshal of a 1 s call, want at most %v", got, marshalDelay, want)
	}
}
