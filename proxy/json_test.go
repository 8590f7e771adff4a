package proxy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/dabbrpc/dabb"
	_ "github.com/dabbrpc/dabb/codec/json"
	"github.com/dabbrpc/dabb/internal/inventory"
	pb "github.com/dabbrpc/dabb/internal/inventory/inventorypb"
	"github.com/dabbrpc/dabb/internal/proctest"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/reflection"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
	gproto "google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
)

// startDabb serves the services register adds on a loopback port with a
// dabb.Server made with opts, and returns its address.
func startDabb(t *testing.T, register func(*dabb.Server) error, opts ...dabb.Option) string {
	t.Helper()
	s := dabb.NewServer(append([]dabb.Option{dabb.WithLogger(quiet)}, opts...)...)
	if err := register(s); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(l) }()
	t.Cleanup(func() {
		s.Close()
		<-done
	})
	return l.Addr().String()
}

// serveInventory serves the inventory demo with stock, with opts.
func serveInventory(t *testing.T, stock map[string]int64, opts ...dabb.Option) string {
	t.Helper()
	return startDabb(t, func(s *dabb.Server) error {
		return inventory.RegisterInventoryServer(s, inventory.NewStore(stock))
	}, opts...)
}

// clientOf returns a client that finds each service at the addresses
// given for it.
func clientOf(t *testing.T, services map[string][]string, opts ...proxy.Option) *proxy.Client {
	t.Helper()
	var ins []registry.Instance
	for svc, addrs := range services {
		for _, a := range addrs {
			ins = append(ins, registry.Instance{Service: svc, ID: a, Addr: a})
		}
	}
	c := newClient(t, static.New(ins...), append([]proxy.Option{proxy.WithLogger(quiet)}, opts...)...)
	t.Cleanup(func() { c.Close() })
	return c
}

func TestDescribeInventory(t *testing.T) {
	addr := serveInventory(t, nil)
	c := clientOf(t, map[string][]string{inventory.InventoryServiceName: {addr}})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	svc, err := c.Describe(ctx, inventory.InventoryServiceName)
	if err != nil {
		t.Fatal(err)
	}
	if svc.Name != inventory.InventoryServiceName || len(svc.Methods) != 2 {
		t.Fatalf("Describe = %+v, want inventory.Inventory with 2 methods", svc)
	}
	deduct, stock := svc.Methods[0], svc.Methods[1]
	if deduct.Name != "Deduct" || deduct.Idempotent || deduct.Timeout != "" {
		t.Errorf("Deduct = %+v, want no directives", deduct)
	}
	if stock.Name != "Stock" || !stock.Idempotent || stock.Timeout != "200ms" {
		t.Errorf("Stock = %+v, want idempotent, timeout 200ms", stock)
	}
	if deduct.Request.GoType != "*inventorypb.DeductRequest" || deduct.Request.Proto != "dabb.examples.inventory.DeductRequest" ||
		deduct.Response.Proto != "dabb.examples.inventory.DeductReply" {
		t.Errorf("Deduct's types = %+v, %+v", deduct.Request, deduct.Response)
	}
	var skel map[string]any
	if err := json.Unmarshal([]byte(deduct.Request.Skeleton), &skel); err != nil {
		t.Fatalf("Deduct's request skeleton %q: %v", deduct.Request.Skeleton, err)
	}
	for _, f := range []string{"sku", "count", "requestId"} {
		if _, ok := skel[f]; !ok {
			t.Errorf("Deduct's request skeleton %s lacks %q", deduct.Request.Skeleton, f)
		}
	}
	var set descriptorpb.FileDescriptorSet
	if err := gproto.Unmarshal(svc.Files, &set); err != nil {
		t.Fatalf("Files: %v", err)
	}
	files, err := protodesc.NewFiles(&set)
	if err != nil {
		t.Fatalf("Files do not build: %v", err)
	}
	d, err := files.FindDescriptorByName("dabb.examples.inventory.DeductRequest")
	if err != nil {
		t.Fatalf("Files lack dabb.examples.inventory.DeductRequest: %v", err)
	}
	if f := d.(protoreflect.MessageDescriptor).Fields().ByName("request_id"); f == nil {
		t.Error("dabb.examples.inventory.DeductRequest has no field request_id in Files")
	}
}

func TestInvokeJSONInventory(t *testing.T) {
	addr := serveInventory(t, map[string]int64{"sku-42": 10})
	c := clientOf(t, map[string][]string{inventory.InventoryServiceName: {addr}})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	out, err := c.InvokeJSON(ctx, inventory.InventoryServiceName, "Deduct",
		[]byte(`{"sku":"sku-42","count":3,"request_id":"order-1"}`))
	if err != nil {
		t.Fatal(err)
	}
	var reply struct{ Remaining string }
	if err := json.Unmarshal(out, &reply); err != nil || reply.Remaining != "7" {
		t.Fatalf("Deduct = %s (%v), want remaining 7", out, err)
	}
	out, err = c.InvokeJSON(ctx, inventory.InventoryServiceName, "Stock", []byte(`{"sku":"sku-42"}`))
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != `{"sku":"sku-42","count":"7"}` {
		t.Fatalf("Stock = %s", out)
	}
}

// TestMain_ unused names keep the imports of the later tests.
var (
	_ = bufio.NewScanner
	_ = errors.Is
	_ = fmt.Sprint
	_ = os.Getenv
	_ = exec.Command
	_ = strings.Cut
	_ = time.Second
	_ = protocol.StatusOK
	_ = reflection.ServiceName
	_ = proctest.FreePorts
	_ = pb.StockRequest{}
)
