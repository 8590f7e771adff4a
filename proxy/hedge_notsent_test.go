package proxy_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/proxy"
)

// breakingServer accepts connections, reads whatever the client sends
// (the request reached it) and closes the connection: the attempt fails
// after sending, and the server may have acted on it.
func breakingServer(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var got atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				buf := make([]byte, 4096)
				if n, _ := c.Read(buf); n > 0 {
					got.Add(1)
				}
			}()
		}
	}()
	t.Cleanup(func() { l.Close(); wg.Wait() })
	return l.Addr().String(), &got
}

// TestHedgedCallNotSentOnlyWhenNoAttemptWasSent: a hedged call whose first
// attempt was sent (the connection broke after the server read it) and
// whose backup failed unsent (a dead instance) returns the first attempt's
// error, not ErrNotSent.
func TestHedgedCallNotSentOnlyWhenNoAttemptWasSent(t *testing.T) {
	breaking, reached := breakingServer(t)
	dead := deadAddr(t)
	c := client(t, []string{breaking, dead}, proxy.WithBalancer("round_robin"),
		proxy.WithRetry(proxy.RetryPolicy{MaxAttempts: 2}),
		proxy.WithBreaker(proxy.BreakerConfig{Disabled: true}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	checked := 0
	for i := range 20 {
		before := reached.Load()
		_, err := invoke(ctx, c, proxy.Idempotent(), proxy.Hedge(time.Second), proxy.Timeout(2*time.Second))
		if err == nil {
			t.Fatalf("call %d succeeded against a breaking and a dead instance", i)
		}
		if reached.Load() == before {
			continue // the breaking instance never got this call's request
		}
		checked++
		if errors.Is(err, proxy.ErrNotSent) {
			t.Fatalf("hedged call %d reached %s (its request was read there before the connection broke), yet its error says ErrNotSent: %v",
				i, breaking, err)
		}
	}
	if checked == 0 {
		t.Fatal("no call reached the breaking instance: the test proves nothing")
	}
}
