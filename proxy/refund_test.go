package proxy

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"testing"
	"time"

	pb "github.com/dabbrpc/dabb/examples/inventory/inventorypb"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
)

// retriesCounted sums the retries the budget holds in its window.
func (b *retryBudget) retriesCounted() int64 {
	var n int64
	for i := range b.buckets {
		n += b.buckets[i].retries.Load()
	}
	return n
}

// TestRetryThatNeverGoesOutIsRefunded: a retry the budget allowed but that
// found no instance to go to (the only one's breaker opened on the first
// failure) does not stay counted against the budget, which is shared by
// every call of the client: during an outage such retries would use up
// what calls with somewhere to go are allowed.
func TestRetryThatNeverGoesOutIsRefunded(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	const svc = "test.Refund"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	for _, hedge := range []bool{false, true} {
		c, err := NewClient(static.New(registry.Instance{Service: svc, ID: dead, Addr: dead}),
			WithLogger(slog.New(slog.DiscardHandler)),
			WithRetry(RetryPolicy{MaxAttempts: 3}),
			WithBreaker(BreakerConfig{ConsecutiveFailures: 1, OpenTimeout: time.Hour}))
		if err != nil {
			t.Fatal(err)
		}
		var opts []CallOption
		if hedge {
			opts = []CallOption{Idempotent(), Hedge(time.Hour)} // the backup follows the first's failure
		}
		err = c.Invoke(ctx, svc, "M", &pb.StockRequest{Sku: "x"}, new(pb.StockReply), opts...)
		if !errors.Is(err, ErrUnavailable) {
			t.Errorf("hedge %v: a call to a dead instance = %v; want ErrUnavailable", hedge, err)
		}
		if n := c.budget.retriesCounted(); n != 0 {
			t.Errorf("hedge %v: the retry budget counts %d retries after a call whose retry found no instance; want 0", hedge, n)
		}
		c.Close()
	}
}
