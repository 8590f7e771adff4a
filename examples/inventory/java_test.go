package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/dabbrpc/dabb/internal/inventory"
	"github.com/dabbrpc/dabb/protocol"
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
