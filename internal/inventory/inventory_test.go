package inventory_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/inventory"
	pb "github.com/dabbrpc/dabb/internal/inventory/inventorypb"
	"github.com/dabbrpc/dabb/protocol"
)

// TestGeneratedCodeIsFresh regenerates inventory_dabb.go into a temporary
// file and compares: the committed stubs must be what rpcgen makes of the
// interface today.
func TestGeneratedCodeIsFresh(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the generator")
	}
	out := filepath.Join(t.TempDir(), "inventory_dabb.go")
	cmd := exec.Command("go", "run", "github.com/dabbrpc/dabb/cmd/rpcgen", "-type", "Inventory", "-output", out)
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("rpcgen: %v\n%s", err, msg)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile("inventory_dabb.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("inventory_dabb.go is stale: run go generate ./internal/inventory/...")
	}
}

func TestDeductOncePerRequestID(t *testing.T) {
	s := inventory.NewStore(map[string]int64{"a": 100})
	ctx := context.Background()
	var wg sync.WaitGroup
	var mu sync.Mutex
	fresh := 0
	for range 50 { // the same request id, concurrently: one deduction
		wg.Add(1)
		go func() {
			defer wg.Done()
			reply, err := s.Deduct(ctx, &pb.DeductRequest{Sku: "a", Count: 3, RequestId: "r-1"})
			if err != nil {
				t.Error(err)
				return
			}
			if !reply.GetDuplicate() {
				mu.Lock()
				fresh++
				mu.Unlock()
			}
			if reply.GetRemaining() != 97 {
				t.Errorf("remaining %d, want 97", reply.GetRemaining())
			}
		}()
	}
	wg.Wait()
	if fresh != 1 {
		t.Fatalf("%d calls deducted, want exactly 1", fresh)
	}
	stock, err := s.Stock(ctx, &pb.StockRequest{Sku: "a"})
	if err != nil || stock.GetCount() != 97 {
		t.Fatalf("stock %v, %v; want 97", stock, err)
	}
	if _, deducted, dups := s.Stats(); deducted != 3 || dups != 49 {
		t.Fatalf("deducted %d, duplicates %d; want 3 and 49", deducted, dups)
	}
}

func TestDeductErrors(t *testing.T) {
	s := inventory.NewStore(map[string]int64{"a": 1})
	ctx := context.Background()
	tests := []struct {
		name   string
		req    *pb.DeductRequest
		status protocol.Status
	}{
		{"zero count", &pb.DeductRequest{Sku: "a", Count: 0, RequestId: "x1"}, protocol.StatusBadRequest},
		{"unknown sku", &pb.DeductRequest{Sku: "zz", Count: 1, RequestId: "x2"}, protocol.StatusBadRequest},
		{"insufficient", &pb.DeductRequest{Sku: "a", Count: 2, RequestId: "x3"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.Deduct(ctx, tt.req)
			if err == nil {
				t.Fatal("no error")
			}
			var pe *protocol.Error
			if tt.status != 0 {
				if !errors.As(err, &pe) || pe.Status != tt.status {
					t.Fatalf("got %v, want status %v", err, tt.status)
				}
				return
			}
			if !errors.Is(err, inventory.ErrInsufficientStock) {
				t.Fatalf("got %v, want ErrInsufficientStock", err)
			}
		})
	}
	// A failed deduction is not recorded: the same id can succeed later.
	if _, err := s.Deduct(ctx, &pb.DeductRequest{Sku: "a", Count: 1, RequestId: "x3"}); err != nil {
		t.Fatalf("retry of a failed request id: %v", err)
	}
}

// A request id is remembered for the retention and then forgotten, so the
// record table stays bounded: a repeat within the retention is answered
// from the record, one after it deducts again.
func TestRetention(t *testing.T) {
	s := inventory.NewStore(map[string]int64{"a": 1000})
	s.Retention = time.Minute
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	inventory.SetClock(s, func() time.Time { return now })
	ctx := context.Background()
	deduct := func(id string) *pb.DeductReply {
		t.Helper()
		reply, err := s.Deduct(ctx, &pb.DeductRequest{Sku: "a", Count: 1, RequestId: id})
		if err != nil {
			t.Fatalf("Deduct(%s): %v", id, err)
		}
		return reply
	}
	if deduct("r-1").GetDuplicate() {
		t.Fatal("first r-1 answered as a duplicate")
	}
	now = now.Add(30 * time.Second)
	if !deduct("r-1").GetDuplicate() {
		t.Fatal("r-1 repeated within the retention deducted again")
	}
	for i := range 100 {
		deduct(fmt.Sprintf("burst-%d", i))
	}
	if got := s.Remembered(); got != 101 {
		t.Fatalf("remembered %d ids, want 101", got)
	}
	now = now.Add(31 * time.Second) // r-1 is now 61 s old, the burst 31 s
	if deduct("r-1").GetDuplicate() {
		t.Fatal("r-1 repeated after the retention was answered from a forgotten record")
	}
	if got := s.Remembered(); got != 101 { // the old r-1 went, the new one came
		t.Fatalf("remembered %d ids after the first expiry, want 101", got)
	}
	now = now.Add(2 * time.Minute)
	deduct("last")
	if got := s.Remembered(); got != 1 {
		t.Fatalf("remembered %d ids once all but the last expired, want 1", got)
	}
	if _, deducted, _ := s.Stats(); deducted != 103 {
		t.Fatalf("deducted %d units, want 103 (r-1 twice, 100 burst, last)", deducted)
	}
}

// TestRequestIDReusedForAnotherDeduction: a remembered request id that
// comes back asking for another sku or count is a client bug, not a retry:
// refused as a bad request, nothing deducted, and the record untouched.
func TestRequestIDReusedForAnotherDeduction(t *testing.T) {
	s := inventory.NewStore(map[string]int64{"a": 100, "b": 100})
	ctx := context.Background()
	if _, err := s.Deduct(ctx, &pb.DeductRequest{Sku: "a", Count: 3, RequestId: "r-1"}); err != nil {
		t.Fatal(err)
	}
	for _, req := range []*pb.DeductRequest{
		{Sku: "b", Count: 3, RequestId: "r-1"},
		{Sku: "a", Count: 4, RequestId: "r-1"},
	} {
		reply, err := s.Deduct(ctx, req)
		if !errors.Is(err, inventory.ErrRequestIDReused) || protocol.StatusOf(err) != protocol.StatusBadRequest {
			t.Errorf("Deduct(%v) = %v, %v; want ErrRequestIDReused as status 40", req, reply, err)
		}
	}
	reply, err := s.Deduct(ctx, &pb.DeductRequest{Sku: "a", Count: 3, RequestId: "r-1"})
	if err != nil || !reply.GetDuplicate() || reply.GetRemaining() != 97 {
		t.Errorf("the true retry = %v, %v; want a duplicate with 97 remaining", reply, err)
	}
	for sku, want := range map[string]int64{"a": 97, "b": 100} {
		got, err := s.Stock(ctx, &pb.StockRequest{Sku: sku})
		if err != nil || got.GetCount() != want {
			t.Errorf("stock of %s = %v, %v; want %d", sku, got, err, want)
		}
	}
}
