package main

import (
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDubboErrors runs rpcgen on each interface of a package of bad Dubbo
// declarations and checks the one error each must report.
func TestDubboErrors(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "go.mod"), "module example.com/bad\n\ngo 1.26\n")
	writeFile(t, filepath.Join(dir, "bad.go"), `package bad

import "context"

type POJO struct{ A int32 }

//dabb:dubbo Greeter
type NotQualified interface {
	M(ctx context.Context) error
}

//dabb:dubbo
type NoName interface {
	M(ctx context.Context) error
}

//dabb:dubbo com.example.X version=1 version=2
type TwoVersions interface {
	M(ctx context.Context) error
}

//dabb:dubbo com.example.X colour=red
type UnknownKey interface {
	M(ctx context.Context) error
}

//dabb:dubbo com.example.X group=a/b
type BadGroup interface {
	M(ctx context.Context) error
}

//dabb:dubbo com.example.X
//dabb:service x.Y
type WithService interface {
	M(ctx context.Context) error
}

type JavaWithoutDubbo interface {
	//dabb:java m
	M(ctx context.Context, req *POJO) (*POJO, error)
}

//dabb:dubbo com.example.X
type JavaTwice interface {
	//dabb:java m
	//dabb:java n
	M(ctx context.Context) error
}

//dabb:dubbo com.example.X
type JavaBadName interface {
	//dabb:java $m
	M(ctx context.Context) error
}

//dabb:dubbo com.example.X
type JavaBadType interface {
	//dabb:java m(String)
	M(ctx context.Context, s string) error
}

//dabb:dubbo com.example.X
type JavaUnclosed interface {
	//dabb:java m(long
	M(ctx context.Context, n int64) error
}

//dabb:dubbo com.example.X
type JavaCount interface {
	//dabb:java m(long, int)
	M(ctx context.Context, n int64) error
}

//dabb:dubbo com.example.X
type NoContext interface {
	M(n int64) error
}

//dabb:dubbo com.example.X
type Variadic interface {
	M(ctx context.Context, n ...int64) error
}

//dabb:dubbo com.example.X
type ThreeResults interface {
	M(ctx context.Context) (int64, int64, error)
}

//dabb:dubbo com.example.X
type NoError interface {
	M(ctx context.Context) int64
}

//dabb:dubbo com.example.X
type Unsigned interface {
	M(ctx context.Context, n uint32) error
}

//dabb:dubbo com.example.X
type Chan interface {
	M(ctx context.Context) (chan int, error)
}

//dabb:dubbo com.example.X
type Array interface {
	M(ctx context.Context, a [2]int64) error
}

//dabb:dubbo com.example.X
type ServiceOnMethod interface {
	//dabb:dubbo com.example.Y
	M(ctx context.Context) error
}
`)
	l, info, err := loadPackage(config{dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ typ, want string }{
		{"NotQualified", `type NotQualified: //dabb:dubbo: "Greeter" is not a package-qualified Java interface name such as com.example.Greeter`},
		{"NoName", "type NoName: //dabb:dubbo: wants a Java interface name such as com.example.Greeter, then optional version=V and group=G"},
		{"TwoVersions", "type TwoVersions: //dabb:dubbo: version given twice"},
		{"UnknownKey", `type UnknownKey: //dabb:dubbo: "colour=red": want version=V or group=G`},
		{"BadGroup", `type BadGroup: //dabb:dubbo: group "a/b": want a non-empty value without '/', ':' or ','`},
		{"WithService", "type WithService: //dabb:service and //dabb:dubbo exclude each other: a Dubbo interface is named by its Java interface"},
		{"JavaWithoutDubbo", "method M: //dabb:java is for the methods of a Dubbo interface: add //dabb:dubbo to the interface's doc comment"},
		{"JavaTwice", "method M: //dabb:java given twice"},
		{"JavaBadName", `method M: //dabb:java: "$m" is not a Java method name such as deduct or deduct(long,int)`},
		{"JavaBadType", `method M: //dabb:java: "m(String)": "String" is not a Java primitive or a package-qualified class name such as java.lang.String`},
		{"JavaUnclosed", `method M: //dabb:java: "m(long": want the parameter types in one pair of parentheses, such as deduct(long,int)`},
		{"JavaCount", "method M: //dabb:java m(long,int): 2 Java types for 1 parameters after the context"},
		{"NoContext", "method M: first parameter must be context.Context"},
		{"Variadic", "method M: must not be variadic; a Java method's parameters are fixed"},
		{"ThreeResults", "method M: must return (R, error) or error, returns (int64, int64, error)"},
		{"NoError", "method M: must return (R, error) or error, returns (int64)"},
		{"Unsigned", "method M: parameter 1: uint32 has no Java type (Java has no uint32); give the types with //dabb:java"},
		{"Chan", "method M: result: chan int has no Java type (a channel)"},
		{"Array", "method M: parameter 1: [2]int64 has no Java type (use a slice for a Java array); give the types with //dabb:java"},
		{"ServiceOnMethod", "method M: //dabb:dubbo belongs in the interface's doc comment"},
	} {
		t.Run(tc.typ, func(t *testing.T) {
			_, err := l.services(info, []string{tc.typ})
			if err == nil {
				t.Fatalf("no error, want %q", tc.want)
			}
			if msgs := strings.Split(err.Error(), "\n"); len(msgs) != 1 || !strings.HasSuffix(msgs[0], "rpcgen: "+tc.want) {
				t.Errorf("error:\n got: %v\nwant: ...: rpcgen: %s", err, tc.want)
			}
		})
	}
}

// TestDubboShadowedType: a type named like a local of the stub's methods
// is refused, as the stub would not compile.
func TestDubboShadowedType(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "go.mod"), "module example.com/shadow\n\ngo 1.26\n")
	writeFile(t, filepath.Join(dir, "shadow.go"), `package shadow

import "context"

type c struct{ A int32 }

//dabb:dubbo com.example.Shadow
type Shadow interface {
	M(ctx context.Context, n int64) ([]*c, error)
}
`)
	_, err := generate(config{dir: dir, types: []string{"Shadow"}}, "")
	if err == nil || !strings.Contains(err.Error(), "shadow.go:5: rpcgen: type c: used by Shadow, named like a variable of the generated Dubbo client (c, ctx); rename it") {
		t.Errorf("generate = %v; want the type c refused", err)
	}
}

// TestDubboImports: a file with a Dubbo interface imports the dubbo module
// and no codec; a file without one does not import it.
func TestDubboImports(t *testing.T) {
	files, err := generate(config{dir: filepath.Join("testdata", "dubbo"), types: []string{"Shop"}}, filepath.Join(t.TempDir(), "out_dabb.go"))
	if err != nil {
		t.Fatal(err)
	}
	src := string(files[0].src)
	if !strings.Contains(src, `"`+dubboPath+`"`) || strings.Contains(src, "/codec/") {
		t.Errorf("the Dubbo file's imports: want %s and no codec:\n%s", dubboPath, src)
	}
	for _, tc := range goldenCases {
		if tc.dubbo {
			continue
		}
		golden, err := filepath.Glob(filepath.Join("testdata", tc.name, "*.golden"))
		if err != nil || len(golden) != 1 {
			t.Fatalf("%s: golden files %v, %v", tc.name, golden, err)
		}
		b, err := os.ReadFile(golden[0])
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), dubboPath) {
			t.Errorf("%s imports %s, but has no Dubbo interface", golden[0], dubboPath)
		}
	}
}

// TestDubboParamNames: the stub keeps the source's parameter names where
// they are usable, and names the others argN.
func TestDubboParamNames(t *testing.T) {
	g := &generator{
		pkg:      &pkgInfo{scope: map[string]token.Position{"store": {}}, kept: map[string]token.Position{"arg2": {}}},
		imports:  &importSet{byPath: map[string]string{"context": "context", "example.com/pb": "pb"}},
		declared: [][2]string{{"Shop", "NewShopDubboClient"}},
	}
	for _, n := range []string{"c", "ctx", "err", "out", "any", "len", "store", "arg2", "pb", "NewShopDubboClient"} {
		if !g.stubReserved(n) {
			t.Errorf("%s is usable as a parameter name, want reserved", n)
		}
	}
	for _, n := range []string{"req", "resp", "srv", "impl", "sku"} {
		if g.stubReserved(n) {
			t.Errorf("%s is reserved, want usable as a parameter name", n)
		}
	}
	got := paramNames([]string{"sku", "", "_", "out", "sku", "arg3", "req"}, g.stubReserved)
	want := []string{"sku", "arg2_", "arg3_", "arg4", "arg5", "arg3", "req"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("paramNames = %v, want %v", got, want)
	}
}

// dubboLoopbackTest is added to the generated Dubbo case: the generated
// client calls a dabb server that serves the same declaration through
// the generated registration, over TCP in hessian2.
const dubboLoopbackTest = `package shop

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/cmd/rpcgen/testdata/types/shared"
	"github.com/dabbrpc/dabb/dubbo"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
)

type store struct {
	mu    sync.Mutex
	stock map[int64]int64
	at    time.Time
	left  time.Duration // of Stock's budget, when it ran
}

func (s *store) Deduct(ctx context.Context, sku int64, count int32) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stock[sku] < int64(count) {
		return false, nil
	}
	s.stock[sku] -= int64(count)
	return true, nil
}

func (s *store) Stock(ctx context.Context, sku int64) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d, ok := ctx.Deadline(); ok {
		s.left = time.Until(d)
	}
	n, ok := s.stock[sku]
	if !ok {
		return 0, &dubbo.Exception{Class: dubbo.IllegalArgumentException, Message: fmt.Sprintf("unknown sku %d", sku)}
	}
	return n, nil
}

func (s *store) Reserve(ctx context.Context, r *Reservation) (*Receipt, error) {
	return &Receipt{Remaining: int64(len(r.Sku)) * int64(r.Count)}, nil
}

func (s *store) ReserveAll(ctx context.Context, rs []*Reservation) (*Receipt, error) {
	return &Receipt{Remaining: int64(len(rs))}, nil
}

func (s *store) Restock(ctx context.Context, sku string, count int64, at time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.at = at
	return nil
}

func (s *store) Note(context.Context, *shared.PingRequest) error { return nil }

func (s *store) Ping(ctx context.Context) error { return errors.New("ping refused") }

// Extra is not Shop's: it is not served.
func (s *store) Extra(ctx context.Context, x string) (string, error) { return x, nil }

func TestDubboLoopback(t *testing.T) {
	for class, proto := range map[string]any{"com.example.shop.Reservation": &Reservation{}, "com.example.shop.Receipt": &Receipt{}} {
		if err := dubbo.RegisterPOJO(class, proto); err != nil {
			t.Fatal(err)
		}
	}
	impl := &store{stock: map[int64]int64{10086: 1000}}
	s := dabb.NewServer()
	if err := RegisterShopDubboServer(s, impl, dubbo.WithApplication("shop-test")); err != nil {
		t.Fatal(err)
	}
	if err := RegisterShopDubboServer(dabb.NewServer(), nil); err == nil {
		t.Error("RegisterShopDubboServer(nil) succeeded")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(l) }()
	defer func() { s.Close(); <-done }()

	var mu sync.Mutex
	calls := map[string]proxy.Call{}
	record := func(next proxy.Invoker) proxy.Invoker {
		return func(ctx context.Context, call *proxy.Call) error {
			mu.Lock()
			calls[call.Method] = *call
			mu.Unlock()
			return next(ctx, call)
		}
	}
	// A static registry names an instance by the service key; the second
	// one points a version the server does not serve at it.
	reg := static.New(registry.Instance{Service: ShopJavaInterface + ":1.0.0:gold", Addr: l.Addr().String()},
		registry.Instance{Service: ShopJavaInterface + ":2.0.0:gold", Addr: l.Addr().String()})
	defer reg.Close()
	c, err := proxy.NewClient(reg, proxy.WithMiddleware(record), proxy.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	shop, err := NewShopDubboClient(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	if ok, err := shop.Deduct(ctx, 10086, 3); !ok || err != nil {
		t.Errorf("Deduct(10086, 3) = %v, %v; want true", ok, err)
	}
	if n, err := shop.Stock(ctx, 10086); n != 997 || err != nil {
		t.Errorf("Stock(10086) = %d, %v; want 997", n, err)
	}
	impl.mu.Lock()
	left := impl.left
	impl.mu.Unlock()
	if left <= 0 || left > 200*time.Millisecond {
		t.Errorf("Stock ran with %v of its budget left; want at most its 200ms timeout, sent as the timeout attachment", left)
	}
	_, err = shop.Stock(ctx, 42)
	var exc *dubbo.Exception
	if !errors.Is(err, proxy.ErrServiceError) || !errors.As(err, &exc) ||
		exc.Class != dubbo.IllegalArgumentException || exc.Message != "unknown sku 42" {
		t.Errorf("Stock(42) = %v; want ErrServiceError, IllegalArgumentException: unknown sku 42", err)
	}
	if r, err := shop.Reserve(ctx, &Reservation{Sku: "ab", Count: 4}); err != nil || r == nil || r.Remaining != 8 {
		t.Errorf("Reserve = %+v, %v; want remaining 8", r, err)
	}
	if r, err := shop.ReserveAll(ctx, []*Reservation{{Sku: "a"}, {Sku: "b"}, {Sku: "c"}}); err != nil || r == nil || r.Remaining != 3 {
		t.Errorf("ReserveAll (the overload reserve(Reservation[])) = %+v, %v; want remaining 3", r, err)
	}
	at := time.UnixMilli(1700000000123)
	if err := shop.Restock(ctx, "10086", 5, at); err != nil || !impl.at.Equal(at) {
		t.Errorf("Restock = %v, the store got %v; want nil, %v", err, impl.at, at)
	}
	if err := shop.Ping(ctx); !errors.As(err, &exc) || exc.Class != dubbo.RuntimeException || exc.Message != "ping refused" {
		t.Errorf("Ping = %v; want RuntimeException: ping refused", err)
	}

	mu.Lock()
	stock, deduct := calls["stock"], calls["deduct"]
	mu.Unlock()
	if !stock.Idempotent || stock.Timeout != 200*time.Millisecond {
		t.Errorf("stock's call: idempotent %v, timeout %v; want true, 200ms (its directives)", stock.Idempotent, stock.Timeout)
	}
	if deduct.Idempotent || deduct.Timeout == 200*time.Millisecond {
		t.Errorf("deduct's call: idempotent %v, timeout %v; want false and the client's default", deduct.Idempotent, deduct.Timeout)
	}

	// Only Shop's methods are served, in version 1.0.0 of group gold.
	extra, err := dubbo.NewClient(c, ShopJavaInterface, (*interface {
		Extra(ctx context.Context, x string) (string, error)
	})(nil), dubbo.WithVersion("1.0.0"), dubbo.WithGroup("gold"))
	if err != nil {
		t.Fatal(err)
	}
	if err := extra.Call(ctx, "Extra", []any{"x"}, nil); err == nil || !strings.Contains(err.Error(), "No such method extra") {
		t.Errorf("Extra, not a method of Shop: %v; want No such method extra", err)
	}
	other, err := NewShopDubboClient(c, dubbo.WithVersion("2.0.0"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Stock(ctx, 10086); err == nil || !strings.Contains(err.Error(), "Not found exported service") {
		t.Errorf("Stock of version 2.0.0: %v; want Not found exported service, the server serves 1.0.0 only", err)
	}
}
`
