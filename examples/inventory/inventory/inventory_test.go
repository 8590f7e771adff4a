package inventory_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/dabbrpc/dabb/examples/inventory/inventory"
	pb "github.com/dabbrpc/dabb/examples/inventory/inventorypb"
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
		t.Fatal("inventory_dabb.go is stale: run go generate ./examples/inventory/...")
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
