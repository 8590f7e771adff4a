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
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dabbrpc/dabb"
	_ "github.com/dabbrpc/dabb/codec/json"
	"github.com/dabbrpc/dabb/health"
	"github.com/dabbrpc/dabb/internal/dabbtest"
	"github.com/dabbrpc/dabb/internal/etcdtest"
	"github.com/dabbrpc/dabb/internal/inventory"
	pb "github.com/dabbrpc/dabb/internal/inventory/inventorypb"
	"github.com/dabbrpc/dabb/internal/proctest"
	"github.com/dabbrpc/dabb/internal/wait"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/reflection"
	"github.com/dabbrpc/dabb/registry"
	_ "github.com/dabbrpc/dabb/registry/etcd"
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
	return dabbtest.Serve(t, s)
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

// order is the request of a JSON-codec test service: nested structs, a
// pointer, a slice of structs, a map, an interface and a cycle.
type order struct {
	ID       string            `json:"id"`
	Customer customer          `json:"customer"`
	Ship     *address          `json:"ship"`
	Lines    []line            `json:"lines"`
	Tags     map[string]string `json:"tags"`
	Extra    any               `json:"extra"`
	Parent   *order            `json:"parent"`
}

type customer struct {
	Name string `json:"name"`
}

type address struct {
	City string `json:"city"`
}

type line struct {
	SKU   string `json:"sku"`
	Count int    `json:"count"`
}

type receipt struct {
	ID    string `json:"id"`
	Lines int    `json:"lines"`
	City  string `json:"city"`
}

// ordersDesc is a JSON-codec service written by hand, as rpcgen would.
var ordersDesc = dabb.ServiceDesc{
	Name: "test.Orders",
	Methods: []dabb.MethodDesc{
		{Name: "Place", Request: (*order)(nil), Response: (*receipt)(nil),
			Handler: func(_ any, _ context.Context, dec func(any) error) (any, error) {
				o := new(order)
				if err := dec(o); err != nil {
					return nil, err
				}
				r := &receipt{ID: o.ID, Lines: len(o.Lines)}
				if o.Ship != nil {
					r.City = o.Ship.City
				}
				return r, nil
			}},
		{Name: "Untyped", Handler: func(_ any, _ context.Context, dec func(any) error) (any, error) {
			var v map[string]any
			if err := dec(&v); err != nil {
				return nil, err
			}
			return v, nil
		}},
	},
}

func serveOrders(t *testing.T, opts ...dabb.Option) string {
	t.Helper()
	return startDabb(t, func(s *dabb.Server) error { return s.RegisterService(&ordersDesc, struct{}{}) }, opts...)
}

func TestDescribeJSONCodecService(t *testing.T) {
	addr := serveOrders(t)
	c := clientOf(t, map[string][]string{"test.Orders": {addr}})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	svc, err := c.Describe(ctx, "test.Orders")
	if err != nil {
		t.Fatal(err)
	}
	if len(svc.Files) != 0 {
		t.Errorf("Files of a service without protobuf: %d bytes, want none", len(svc.Files))
	}
	place := svc.Methods[0]
	if place.Request.GoType != "*proxy_test.order" || place.Request.Proto != "" || place.Response.GoType != "*proxy_test.receipt" {
		t.Errorf("Place's types = %+v, %+v", place.Request, place.Response)
	}
	want := `{"id":"","customer":{"name":""},"ship":{"city":""},"lines":[{"sku":"","count":0}],"tags":{},"extra":null,"parent":null}`
	if place.Request.Skeleton != want {
		t.Errorf("Place's request skeleton\n got %s\nwant %s", place.Request.Skeleton, want)
	}
	if got := place.Response.Skeleton; got != `{"id":"","lines":0,"city":""}` {
		t.Errorf("Place's response skeleton = %s", got)
	}
	untyped := svc.Methods[1]
	if untyped.Request != (reflection.Type{}) || untyped.Response != (reflection.Type{}) {
		t.Errorf("Untyped's types = %+v, %+v, want unknown (empty)", untyped.Request, untyped.Response)
	}
}

func TestInvokeJSONCodecService(t *testing.T) {
	addr := serveOrders(t)
	c := clientOf(t, map[string][]string{"test.Orders": {addr}})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	out, err := c.InvokeJSON(ctx, "test.Orders", "Place",
		[]byte(` { "id": "o-1", "ship": {"city": "Lyon"}, "lines": [{"sku": "a"}, {"sku": "b"}] } `))
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != `{"id":"o-1","lines":2,"city":"Lyon"}` {
		t.Errorf("Place = %s", out)
	}
	// A method whose types the server does not record goes as JSON.
	out, err = c.InvokeJSON(ctx, "test.Orders", "Untyped", []byte(`{"a":[1,2]}`))
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != `{"a":[1,2]}` {
		t.Errorf("Untyped = %s", out)
	}
}

func TestDescribeWithoutReflection(t *testing.T) {
	addr := serveInventory(t, map[string]int64{"x": 1}, dabb.WithoutReflection())
	c := clientOf(t, map[string][]string{inventory.InventoryServiceName: {addr}})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	_, err := c.Describe(ctx, inventory.InventoryServiceName)
	if !errors.Is(err, proxy.ErrNoReflection) || !errors.Is(err, proxy.ErrNotFound) {
		t.Fatalf("Describe = %v, want ErrNoReflection and ErrNotFound", err)
	}
	if !strings.Contains(err.Error(), "reflection disabled on that server") {
		t.Errorf("error %q does not say reflection is disabled", err)
	}
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Status != protocol.StatusServiceNotFound || !pe.Remote {
		t.Errorf("error %v: want the server's 60", err)
	}
	if _, err := c.InvokeJSON(ctx, inventory.InventoryServiceName, "Stock", []byte(`{}`)); !errors.Is(err, proxy.ErrNoReflection) {
		t.Errorf("InvokeJSON = %v, want ErrNoReflection", err)
	}
	// The service itself is served.
	if _, err := inventory.NewInventoryClient(c).Stock(ctx, &pb.StockRequest{Sku: "x"}); err != nil {
		t.Errorf("Stock by stub: %v", err)
	}
}

func TestDescribeUnknownService(t *testing.T) {
	addr := serveInventory(t, nil)
	// The registry lists the inventory's address for test.Gone too: the
	// server there does not have it.
	c := clientOf(t, map[string][]string{"test.Gone": {addr}})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	_, err := c.Describe(ctx, "test.Gone")
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Status != protocol.StatusServiceNotFound || pe.Code != protocol.CodeNotFound {
		t.Fatalf("Describe = %v, want 60 with code not_found", err)
	}
	if errors.Is(err, proxy.ErrNoReflection) {
		t.Errorf("Describe = %v matches ErrNoReflection; the server has reflection", err)
	}
	if !strings.Contains(err.Error(), "service test.Gone not found") {
		t.Errorf("error %q does not name the service", err)
	}
	// A service no registry lists: no instance, not sent.
	if _, err := c.Describe(ctx, "test.Unlisted"); !errors.Is(err, proxy.ErrUnavailable) || !errors.Is(err, proxy.ErrNotSent) {
		t.Errorf("Describe of an unlisted service = %v, want ErrUnavailable, not sent", err)
	}
}

// countingServer serves inventory behind an interceptor that counts the
// calls by service and method.
func countingServer(t *testing.T, counts *sync.Map) string {
	t.Helper()
	count := func(ctx context.Context, info *dabb.CallInfo, next dabb.CallHandler) (any, error) {
		n, _ := counts.LoadOrStore(info.Service+"/"+info.Method, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		return next(ctx)
	}
	return serveInventory(t, map[string]int64{"sku-1": 5}, dabb.WithInterceptor(count))
}

func calls(counts *sync.Map, key string) int64 {
	if n, ok := counts.Load(key); ok {
		return n.(*atomic.Int64).Load()
	}
	return 0
}

func TestInvokeJSONErrors(t *testing.T) {
	var counts sync.Map
	addr := countingServer(t, &counts)
	c := clientOf(t, map[string][]string{inventory.InventoryServiceName: {addr}})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	svc := inventory.InventoryServiceName

	_, err := c.InvokeJSON(ctx, svc, "Restock", []byte(`{}`))
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Status != protocol.StatusServiceNotFound || pe.Remote || !errors.Is(err, proxy.ErrNotSent) {
		t.Errorf("unknown method: %v, want a local 60, not sent", err)
	}
	if err != nil && (!strings.Contains(err.Error(), "method inventory.Inventory.Restock not found") || !strings.Contains(err.Error(), "Deduct, Stock")) {
		t.Errorf("unknown method: %q does not name the method and the ones there are", err)
	}
	for _, bad := range []string{`{"sku":`, ``, `{"sku":"a"} {}`, `{"sku":1}`, `{"no_such_field":1}`} {
		_, err := c.InvokeJSON(ctx, svc, "Stock", []byte(bad))
		if !errors.Is(err, proxy.ErrBadRequest) || !errors.Is(err, proxy.ErrNotSent) {
			t.Errorf("request %q: %v, want ErrBadRequest, not sent", bad, err)
		}
	}
	_, err = c.InvokeJSON(ctx, svc, "Stock", []byte(`{"sku":`))
	if err == nil || !strings.Contains(err.Error(), "not valid JSON") {
		t.Errorf("bad JSON: %v does not say so", err)
	}
	if n := calls(&counts, svc+"/Stock") + calls(&counts, svc+"/Restock"); n != 0 {
		t.Errorf("the server ran %d calls of bad requests; none should be sent", n)
	}
	// Describe ran once: later calls used the kept description.
	if n := calls(&counts, reflection.ServiceName+"/"+reflection.MethodDescribe); n != 1 {
		t.Errorf("Describe reached the server %d times, want 1", n)
	}
}

// TestInvokeJSONThroughMiddlewares: InvokeJSON and Describe are calls of
// the client like a stub's, middlewares included; the server's
// interceptors see the reflection service like any.
func TestInvokeJSONThroughMiddlewares(t *testing.T) {
	var counts sync.Map
	addr := countingServer(t, &counts)
	var mu sync.Mutex
	var seen []string
	mw := func(next proxy.Invoker) proxy.Invoker {
		return func(ctx context.Context, call *proxy.Call) error {
			mu.Lock()
			seen = append(seen, fmt.Sprintf("%s/%s idempotent=%v timeout=%v", call.Service, call.Method, call.Idempotent, call.Timeout))
			mu.Unlock()
			return next(ctx, call)
		}
	}
	c := clientOf(t, map[string][]string{inventory.InventoryServiceName: {addr}}, proxy.WithMiddleware(mw))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if _, err := c.InvokeJSON(ctx, inventory.InventoryServiceName, "Stock", []byte(`{"sku":"sku-1"}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.InvokeJSON(ctx, inventory.InventoryServiceName, "Deduct", []byte(`{"sku":"sku-1","count":1,"requestId":"r1"}`),
		proxy.Timeout(3*time.Second)); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"dabb.Reflection/Describe idempotent=true timeout=1s",
		"inventory.Inventory/Stock idempotent=true timeout=200ms",
		"inventory.Inventory/Deduct idempotent=false timeout=3s",
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(seen, "\n") != strings.Join(want, "\n") {
		t.Errorf("middleware saw\n%s\nwant\n%s", strings.Join(seen, "\n"), strings.Join(want, "\n"))
	}
	for _, k := range []string{"dabb.Reflection/Describe", "inventory.Inventory/Stock", "inventory.Inventory/Deduct"} {
		if n := calls(&counts, k); n != 1 {
			t.Errorf("the server's interceptor saw %s %d times, want 1", k, n)
		}
	}
}

// TestInvokeJSONTimeoutDirective: Stock's //dabb:timeout 200ms, learnt
// from the server, bounds an InvokeJSON of it as it bounds a stub's call.
func TestInvokeJSONTimeoutDirective(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	addr := startDabb(t, func(s *dabb.Server) error {
		return inventory.RegisterInventoryServer(s, stallingStore{inventory.NewStore(nil), release})
	})
	c := clientOf(t, map[string][]string{inventory.InventoryServiceName: {addr}}, proxy.WithRetry(proxy.RetryPolicy{MaxAttempts: 1}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if _, err := c.Describe(ctx, inventory.InventoryServiceName); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := c.InvokeJSON(ctx, inventory.InventoryServiceName, "Stock", []byte(`{"sku":"x"}`))
	took := time.Since(start)
	if !errors.Is(err, proxy.ErrTimeout) {
		t.Fatalf("Stock on a stalled server = %v, want ErrTimeout", err)
	}
	if took < 150*time.Millisecond || took > 900*time.Millisecond {
		t.Errorf("Stock timed out after %v, want about 200ms (its directive), not the 1 s default", took)
	}
}

// stallingStore holds every call until release closes or the call's
// context ends.
type stallingStore struct {
	*inventory.Store
	release <-chan struct{}
}

func (s stallingStore) Stock(ctx context.Context, req *pb.StockRequest) (*pb.StockReply, error) {
	select {
	case <-s.release:
	case <-ctx.Done():
	}
	return nil, errors.New("stalled")
}

// TestViaBalancesOverService: a call Via a service goes to that service's
// instances, while the wire names another service.
func TestViaBalancesOverService(t *testing.T) {
	a, b := serveInventory(t, nil), serveOrders(t)
	c := clientOf(t, map[string][]string{inventory.InventoryServiceName: {a}, "test.Orders": {b}})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	for svc, want := range map[string]string{inventory.InventoryServiceName: inventory.InventoryServiceName, "test.Orders": "test.Orders"} {
		var reply reflection.ListReply
		var addr string
		rec := func(next proxy.Invoker) proxy.Invoker {
			return func(ctx context.Context, call *proxy.Call) error {
				err := next(ctx, call)
				addr = call.Addr
				return err
			}
		}
		c2 := clientOf(t, map[string][]string{inventory.InventoryServiceName: {a}, "test.Orders": {b}}, proxy.WithCodec("json"), proxy.WithMiddleware(rec))
		if err := c2.Invoke(ctx, reflection.ServiceName, reflection.MethodList, &reflection.ListRequest{}, &reply, proxy.Via(svc)); err != nil {
			t.Fatalf("List via %s: %v", svc, err)
		}
		wantList := []string{health.ServiceName, reflection.ServiceName, want}
		slices.Sort(wantList)
		if !slices.Equal(reply.Services, wantList) {
			t.Errorf("List via %s = %v, want %v", svc, reply.Services, wantList)
		}
		if wantAddr := map[string]string{inventory.InventoryServiceName: a, "test.Orders": b}[svc]; addr != wantAddr {
			t.Errorf("List via %s went to %s, want %s", svc, addr, wantAddr)
		}
	}
	// Without Via, dabb.Reflection is looked up as a service of its own,
	// which no registry lists.
	var reply reflection.ListReply
	err := c.Invoke(ctx, reflection.ServiceName, reflection.MethodList, &reflection.ListRequest{}, &reply)
	if !errors.Is(err, proxy.ErrUnavailable) {
		t.Errorf("List without Via = %v, want ErrUnavailable", err)
	}
}

// TestDescribeKept: a description is asked for once per DescribeTTL, and
// the copy returned is the caller's.
func TestDescribeKept(t *testing.T) {
	var counts sync.Map
	addr := countingServer(t, &counts)
	c := clientOf(t, map[string][]string{inventory.InventoryServiceName: {addr}})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	first, err := c.Describe(ctx, inventory.InventoryServiceName)
	if err != nil {
		t.Fatal(err)
	}
	first.Methods[0].Name = "Changed"
	second, err := c.Describe(ctx, inventory.InventoryServiceName)
	if err != nil {
		t.Fatal(err)
	}
	if second.Methods[0].Name != "Deduct" {
		t.Errorf("a caller's change to its copy reached the kept description: %s", second.Methods[0].Name)
	}
	if n := calls(&counts, reflection.ServiceName+"/"+reflection.MethodDescribe); n != 1 {
		t.Errorf("Describe reached the server %d times within DescribeTTL, want 1", n)
	}
}

// TestJSONProviderProcess is the server process of TestInvokeJSONRetries;
// it does nothing in a normal run. DABB_JSON_PROVIDER is "MODE ADDR URL":
// MODE is serve (the inventory with 7 of sku-1) or hang (an inventory
// whose methods print "hang METHOD" and never answer), URL the registry
// it publishes itself to.
func TestJSONProviderProcess(t *testing.T) {
	args := strings.Fields(os.Getenv("DABB_JSON_PROVIDER"))
	if len(args) != 3 {
		t.Skip("runs only as the server process of TestInvokeJSONRetries")
	}
	mode, addr, url := args[0], args[1], args[2]
	var impl inventory.Inventory = inventory.NewStore(map[string]int64{"sku-1": 7})
	if mode == "hang" {
		impl = hangingStore{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	reg, err := registry.Open(ctx, url)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	s := dabb.NewServer(dabb.WithLogger(quiet), dabb.WithRegistry(reg))
	if err := inventory.RegisterInventoryServer(s, impl); err != nil {
		t.Fatal(err)
	}
	s.ListenAndServe(addr) // until killed
}

// hangingStore tells of each call on stdout, then holds it until the
// process is killed or the call's context ends.
type hangingStore struct{}

func (hangingStore) Deduct(ctx context.Context, _ *pb.DeductRequest) (*pb.DeductReply, error) {
	fmt.Println("hang Deduct")
	<-ctx.Done()
	return nil, ctx.Err()
}

func (hangingStore) Stock(ctx context.Context, _ *pb.StockRequest) (*pb.StockReply, error) {
	fmt.Println("hang Stock")
	<-ctx.Done()
	return nil, ctx.Err()
}

// startProvider starts a TestJSONProviderProcess in mode, publishing
// itself to the registry at url, and returns it with its address. Each
// line it prints goes to lines, if not nil.
func startProvider(t *testing.T, mode, url string, lines chan<- string) (*proctest.Process, string) {
	t.Helper()
	ports, err := proctest.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	cmd := exec.Command(os.Args[0], "-test.run=^TestJSONProviderProcess$", "-test.timeout=10m")
	cmd.Env = append(os.Environ(), "DABB_JSON_PROVIDER="+mode+" "+addr+" "+url)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = w
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			if lines != nil {
				select {
				case lines <- sc.Text():
				default: // nobody waits for more
				}
			}
		}
		r.Close()
	}()
	p := new(proctest.Process)
	err = p.Start(cmd, 30*time.Second, func(ctx context.Context) error {
		conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err == nil {
			conn.Close()
		}
		return err
	})
	w.Close() // the child holds its own copy; EOF comes when it exits
	if err != nil {
		<-scanned
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Kill()
		<-scanned
	})
	return p, addr
}

// TestInvokeJSONRetries is the acceptance test of JSON calls: a call
// through InvokeJSON of an idempotent method retries on another instance
// after the first instance, holding the call, is killed with SIGKILL, as
// a stub call does. A method without //dabb:idempotent is not retried
// then: the directive Describe learnt is what allows it. The instances
// are processes of their own, found through etcd.
func TestInvokeJSONRetries(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts server processes")
	}
	svc := inventory.InventoryServiceName
	etcd := etcdtest.Start(t)
	cases := []struct {
		name  string
		call  func(ctx context.Context, c *proxy.Client) (string, error)
		hang  string // the line the held instance prints
		retry bool
	}{
		{"InvokeJSON Stock", func(ctx context.Context, c *proxy.Client) (string, error) {
			out, err := c.InvokeJSON(ctx, svc, "Stock", []byte(`{"sku":"sku-1"}`), proxy.Timeout(5*time.Second))
			return string(out), err
		}, "hang Stock", true},
		{"stub Stock", func(ctx context.Context, c *proxy.Client) (string, error) {
			r, err := inventory.NewInventoryClient(c).Stock(proxy.WithCallOptions(ctx, proxy.Timeout(5*time.Second)), &pb.StockRequest{Sku: "sku-1"})
			if err != nil {
				return "", err
			}
			return fmt.Sprintf(`{"sku":%q,"count":"%d"}`, r.Sku, r.Count), nil
		}, "hang Stock", true},
		{"InvokeJSON Deduct", func(ctx context.Context, c *proxy.Client) (string, error) {
			out, err := c.InvokeJSON(ctx, svc, "Deduct", []byte(`{"sku":"sku-1","count":1,"requestId":"r-1"}`), proxy.Timeout(5*time.Second))
			return string(out), err
		}, "hang Deduct", false},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			url := fmt.Sprintf("etcd://%s/services-%d?ttl=2s", etcd.Endpoint(), i)
			lines := make(chan string, 16)
			held, _ := startProvider(t, "hang", url, lines)
			startProvider(t, "serve", url, nil)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			reg, err := registry.Open(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			defer reg.Close()
			// Round robin: of any two calls in a row, one goes to the
			// instance that holds it.
			c := newClient(t, reg, proxy.WithLogger(quiet), proxy.WithBalancer("round_robin"))
			defer c.Close()
			wait.Until(t, 10*time.Second, 10*time.Millisecond, "the client to know both instances", func() bool {
				ins, err := c.Instances(ctx, svc)
				return err == nil && len(ins) == 2
			})
			if _, err := c.Describe(ctx, svc); err != nil {
				t.Fatal(err)
			}
			for i := 0; ; i++ {
				if i == 4 {
					t.Fatal("4 calls in a row went to the instance that answers")
				}
				type result struct {
					out string
					err error
				}
				done := make(chan result, 1)
				go func() {
					out, err := tc.call(ctx, c)
					done <- result{out, err}
				}()
				select {
				case r := <-done:
					if r.err != nil {
						t.Fatalf("call on the instance that answers: %v", r.err)
					}
					continue // it went there: try again
				case line := <-lines:
					if line != tc.hang {
						t.Fatalf("the held instance printed %q, want %q", line, tc.hang)
					}
				case <-ctx.Done():
					t.Fatal("the call neither returned nor reached the held instance within a minute")
				}
				held.Kill() // kill -9, with the call held on it
				var r result
				select {
				case r = <-done:
				case <-time.After(10 * time.Second):
					t.Fatal("the call did not return within 10 s of the kill")
				}
				if tc.retry {
					if r.err != nil {
						t.Fatalf("call after the kill: %v, want the answer of the other instance", r.err)
					}
					if r.out != `{"sku":"sku-1","count":"7"}` {
						t.Fatalf("call after the kill = %s, want the other instance's stock of sku-1", r.out)
					}
					return
				}
				var pe *protocol.Error
				if !errors.As(r.err, &pe) || pe.Status != protocol.StatusChannelInactive || errors.Is(r.err, proxy.ErrNotSent) {
					t.Fatalf("non-idempotent call after the kill: %v, want 35 after sending, not retried", r.err)
				}
				return
			}
		})
	}
}

// ExampleClient_InvokeJSON calls the inventory demo's Stock by name, with
// a JSON request, against a real server.
func ExampleClient_InvokeJSON() {
	s := dabb.NewServer(dabb.WithLogger(quiet))
	if err := inventory.RegisterInventoryServer(s, inventory.NewStore(map[string]int64{"sku-42": 3})); err != nil {
		panic(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(l) }()
	defer func() {
		s.Close()
		<-served
	}()

	reg := static.New(registry.Instance{Service: inventory.InventoryServiceName, ID: "1", Addr: l.Addr().String()})
	c, err := proxy.NewClient(reg, proxy.WithLogger(quiet))
	if err != nil {
		panic(err)
	}
	defer c.Close()
	ctx := context.Background()

	svc, err := c.Describe(ctx, inventory.InventoryServiceName)
	if err != nil {
		panic(err)
	}
	for _, m := range svc.Methods {
		fmt.Println(m.Name, m.Idempotent, m.Timeout, m.Request.Skeleton)
	}
	reply, err := c.InvokeJSON(ctx, inventory.InventoryServiceName, "Stock", []byte(`{"sku":"sku-42"}`))
	if err != nil {
		panic(err)
	}
	fmt.Println(string(reply))
	// Output:
	// Deduct false  {"sku":"","count":0,"requestId":""}
	// Stock true 200ms {"sku":""}
	// {"sku":"sku-42","count":"3"}
}

// TestInvokeJSONSendsAttachmentsToDescribe: against a server that requires
// a token, InvokeJSON with the token as an Attachment succeeds: the
// Describe it makes first carries the token too. The idempotency key
// stays on the call itself.
func TestInvokeJSONSendsAttachmentsToDescribe(t *testing.T) {
	keys := make(chan string, 4) // the idempotency key of each call of Describe
	record := func(ctx context.Context, info *dabb.CallInfo, next dabb.CallHandler) (any, error) {
		if info.Service == reflection.ServiceName {
			keys <- info.IdempotencyKey
		}
		return next(ctx)
	}
	addr := serveInventory(t, map[string]int64{"sku-42": 10}, dabb.WithInterceptor(record, dabb.RequireToken("s3cret")))
	c := clientOf(t, map[string][]string{inventory.InventoryServiceName: {addr}})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	_, err := c.InvokeJSON(ctx, inventory.InventoryServiceName, "Stock", []byte(`{"sku":"sku-42"}`))
	if !errors.Is(err, proxy.ErrUnauthenticated) {
		t.Fatalf("InvokeJSON without the token = %v, want ErrUnauthenticated", err)
	}
	<-keys
	out, err := c.InvokeJSON(ctx, inventory.InventoryServiceName, "Deduct", []byte(`{"sku":"sku-42","count":3}`),
		proxy.Attachment(dabb.AttachAuthorization, "Bearer s3cret"), proxy.IdempotencyKey("order-7"))
	if err != nil {
		t.Fatalf("InvokeJSON with the token as an attachment: %v", err)
	}
	if string(out) != `{"remaining":"7"}` {
		t.Errorf("Deduct = %s, want remaining 7", out)
	}
	if key := <-keys; key != "" {
		t.Errorf("the Describe carried the call's idempotency key %q", key)
	}
}
