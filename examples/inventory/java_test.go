package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/dubbo"
	"github.com/dabbrpc/dabb/internal/inventory"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
)

// TestJavaInventory checks the Java face's meanings on the store itself:
// deduct answers false when stock is short, an unknown sku and a count ≤ 0
// are bad requests naming the sku or the count, and deductOnce deducts once
// per requestId.
func TestJavaInventory(t *testing.T) {
	ctx := context.Background()
	j := javaInventory{inventory.NewStore(map[string]int64{"10086": 10})}

	if ok, err := j.Deduct(ctx, 10086, 4); !ok || err != nil {
		t.Fatalf("deduct(10086, 4) = %v, %v; want true", ok, err)
	}
	if ok, err := j.Deduct(ctx, 10086, 7); ok || err != nil {
		t.Errorf("deduct(10086, 7) with 6 left = %v, %v; want false", ok, err)
	}
	if n, err := j.Stock(ctx, 10086); n != 6 || err != nil {
		t.Errorf("stock(10086) = %d, %v; want 6", n, err)
	}
	badRequest := func(what string, err error, text string) {
		t.Helper()
		var pe *protocol.Error
		if !errors.As(err, &pe) || pe.Status != protocol.StatusBadRequest || !strings.Contains(err.Error(), text) {
			t.Errorf("%s: error %v, want a bad request naming %q", what, err, text)
		}
	}
	_, err := j.Deduct(ctx, 99999, 1)
	badRequest("deduct(99999, 1)", err, "99999")
	_, err = j.Stock(ctx, 99999)
	badRequest("stock(99999)", err, "99999")
	_, err = j.Deduct(ctx, 10086, 0)
	badRequest("deduct(10086, 0)", err, "count")
	_, err = j.Deduct(ctx, 10086, -1)
	badRequest("deduct(10086, -1)", err, "count")

	req := &DeductRequest{Sku: "10086", Count: 2, RequestID: "order-1"}
	first, err := j.DeductOnce(ctx, req)
	if err != nil || *first != (DeductReply{Remaining: 4}) {
		t.Fatalf("deductOnce = %+v, %v; want remaining 4", first, err)
	}
	again, err := j.DeductOnce(ctx, req)
	if err != nil || *again != (DeductReply{Remaining: 4, Duplicate: true}) {
		t.Errorf("deductOnce again = %+v, %v; want remaining 4, a duplicate", again, err)
	}
	_, err = j.DeductOnce(ctx, nil)
	badRequest("deductOnce(null)", err, "count")
}

// TestDemoModeRefusesDubboRegistry: the in-process demo's client cannot
// find dabb's instances in Dubbo's layout, so demo mode says so at once.
func TestDemoModeRefusesDubboRegistry(t *testing.T) {
	var out strings.Builder
	err := runDemo(context.Background(), &out, config{mode: "demo", registry: "zookeeper://127.0.0.1:1", instances: 1})
	if err == nil || !strings.Contains(err.Error(), "-mode server") {
		t.Fatalf("runDemo with zookeeper:// = %v, want an error pointing to -mode server", err)
	}
}

// TestJavaInventoryOverDubbo calls the Java face the way a Dubbo consumer
// does, with the generated client of the same declaration: over TCP in
// hessian2 to a dabb server that registered it with registerJava. It
// calls each kind of method: primitives (deduct, stock), a POJO
// (deductOnce), and one that throws.
func TestJavaInventoryOverDubbo(t *testing.T) {
	srv := dabb.NewServer()
	if err := registerJava(srv, inventory.NewStore(map[string]int64{"10086": 10})); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	defer func() { srv.Close(); <-done }()
	reg := static.New(registry.Instance{Service: InventoryServiceJavaInterface, Addr: l.Addr().String()})
	defer reg.Close()
	c, err := proxy.NewClient(reg, proxy.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	inv, err := NewInventoryServiceDubboClient(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	if ok, err := inv.Deduct(ctx, 10086, 4); !ok || err != nil {
		t.Fatalf("deduct(10086, 4) = %v, %v; want true", ok, err)
	}
	if ok, err := inv.Deduct(ctx, 10086, 7); ok || err != nil {
		t.Errorf("deduct(10086, 7) with 6 left = %v, %v; want false", ok, err)
	}
	if n, err := inv.Stock(ctx, 10086); n != 6 || err != nil {
		t.Errorf("stock(10086) = %d, %v; want 6", n, err)
	}
	req := &DeductRequest{Sku: "10086", Count: 2, RequestID: "order-1"}
	if r, err := inv.DeductOnce(ctx, req); err != nil || r == nil || *r != (DeductReply{Remaining: 4}) {
		t.Errorf("deductOnce = %+v, %v; want remaining 4", r, err)
	}
	if r, err := inv.DeductOnce(ctx, req); err != nil || r == nil || *r != (DeductReply{Remaining: 4, Duplicate: true}) {
		t.Errorf("deductOnce again = %+v, %v; want remaining 4, a duplicate", r, err)
	}
	_, err = inv.Stock(ctx, 99999)
	var exc *dubbo.Exception
	if !errors.Is(err, proxy.ErrServiceError) || !errors.As(err, &exc) ||
		exc.Class != dubbo.IllegalArgumentException || !strings.Contains(exc.Message, "99999") {
		t.Errorf("stock(99999) = %v; want ErrServiceError, an IllegalArgumentException naming the sku", err)
	}
}

// TestGeneratedDubboCodeIsFresh regenerates inventoryservice_dabb.go into
// a temporary file and compares: the committed stub must be what rpcgen
// makes of InventoryService today.
func TestGeneratedDubboCodeIsFresh(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the generator")
	}
	out := filepath.Join(t.TempDir(), "inventoryservice_dabb.go")
	cmd := exec.Command("go", "run", "github.com/dabbrpc/dabb/cmd/rpcgen", "-type", "InventoryService", "-output", out)
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("rpcgen: %v\n%s", err, msg)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile("inventoryservice_dabb.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("inventoryservice_dabb.go is stale: run go generate ./examples/inventory/")
	}
}
