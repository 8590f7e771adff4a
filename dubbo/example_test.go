package dubbo_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"sync"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/dubbo"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
)

// Reservation is the Java class com.example.shop.Reservation:
// {String sku; int count; String requestId}.
type Reservation struct {
	Sku       string
	Count     int32
	RequestId string //nolint:revive // the Java field is requestId
}

// Receipt is the Java class com.example.shop.Receipt:
// {long remaining; boolean duplicate}.
type Receipt struct {
	Remaining int64
	Duplicate bool
}

// Shop serves the Java interface com.example.shop.ShopService:
//
//	boolean deduct(long sku, int count);
//	long stock(long sku);
//	Receipt reserve(Reservation r);
type Shop struct {
	mu    sync.Mutex
	stock map[int64]int64
}

func (s *Shop) Deduct(_ context.Context, sku int64, count int32) (bool, error) {
	if count <= 0 {
		// dabb's bad-request class: java.lang.IllegalArgumentException.
		return false, protocol.NewError(protocol.StatusBadRequest, protocol.CodeInvalidArgument, "count must be positive")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stock[sku] < int64(count) {
		return false, nil
	}
	s.stock[sku] -= int64(count)
	return true, nil
}

func (s *Shop) Stock(_ context.Context, sku int64) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.stock[sku]
	if !ok {
		return 0, fmt.Errorf("unknown sku %d", sku) // java.lang.RuntimeException
	}
	return n, nil
}

func (s *Shop) Reserve(ctx context.Context, r *Reservation) (*Receipt, error) {
	var sku int64
	if _, err := fmt.Sscan(r.Sku, &sku); err != nil {
		return nil, protocol.NewError(protocol.StatusBadRequest, "", "sku "+r.Sku+" is not a number")
	}
	if _, err := s.Deduct(ctx, sku, r.Count); err != nil {
		return nil, err
	}
	n, err := s.Stock(ctx, sku)
	return &Receipt{Remaining: n}, err
}

// ExampleService serves a Go type as a Java interface on a dabb Server,
// and calls it as a Java consumer does: typed, with a POJO, and with
// Dubbo's generic $invoke. A Server with dabb.WithRegistry of a
// zookeeper:// registry also publishes it in Dubbo's layout.
func ExampleService() {
	// The POJOs by class name, then the interface by reflection.
	if err := dubbo.RegisterPOJO("com.example.shop.Reservation", &Reservation{}); err != nil {
		log.Fatal(err)
	}
	if err := dubbo.RegisterPOJO("com.example.shop.Receipt", &Receipt{}); err != nil {
		log.Fatal(err)
	}
	shop := &Shop{stock: map[int64]int64{10086: 1000}}
	desc, err := dubbo.Service("com.example.shop.ShopService", shop, dubbo.WithApplication("shop"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("methods:", desc.Metadata[dubbo.MetaMethods])

	s := dabb.NewServer()
	if err := s.RegisterService(desc, shop); err != nil {
		log.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(l) }()
	defer func() { s.Close(); <-done }()

	conn, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	const iface = "com.example.shop.ShopService"
	for _, req := range []*dubbo.Request{
		{Path: iface, Method: "deduct", Args: []any{int64(10086), int32(3)}},
		{Path: iface, Method: "stock", Args: []any{int64(10086)}},
		{Path: iface, Method: "reserve", Args: []any{&Reservation{Sku: "10086", Count: 7, RequestId: "r-1"}}},
		{Path: iface, Method: "deduct", Args: []any{int64(10086), int32(0)}},
		{Path: iface, Method: "stock", Args: []any{int64(42)}},
		{Path: iface, Method: "$invoke", ParamTypes: "Ljava/lang/String;[Ljava/lang/String;[Ljava/lang/Object;",
			Args: []any{"reserve", []string{"com.example.shop.Reservation"},
				[]any{map[string]any{"class": "com.example.shop.Reservation", "sku": "10086", "count": int32(10)}}}},
	} {
		fmt.Printf("%s: %s\n", req.Method, callJava(conn, req))
	}
	// Output:
	// methods: deduct,reserve,stock
	// deduct: true
	// stock: 997
	// reserve: &{Remaining:990 Duplicate:false}
	// deduct: java.lang.IllegalArgumentException: count must be positive
	// stock: java.lang.RuntimeException: unknown sku 42
	// $invoke: map[class:com.example.shop.Receipt duplicate:false remaining:980]
}

// callJava sends r in a Dubbo frame of serialization hessian2 and returns
// the answer as text, as a Java consumer would read it.
func callJava(conn net.Conn, r *dubbo.Request) string {
	body, err := dubbo.AppendRequest(nil, r)
	if err != nil {
		return err.Error()
	}
	var h protocol.Header
	h.Init(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, dubbo.Hessian2ID), 0, 1)
	h.SetMagic()
	h.SetBodyLen(uint32(len(body)))
	if _, err := conn.Write(append(h[:], body...)); err != nil {
		return err.Error()
	}
	if _, err := io.ReadFull(conn, h[:]); err != nil {
		return err.Error()
	}
	body = make([]byte, h.BodyLen())
	if _, err := io.ReadFull(conn, body); err != nil {
		return err.Error()
	}
	if h.Status() != protocol.StatusOK {
		msg, _ := dubbo.DecodeErrorMessage(body, dubbo.Limits{})
		return fmt.Sprintf("status %d: %s", h.Status(), msg)
	}
	resp, err := dubbo.DecodeResponse(body, dubbo.Limits{})
	switch {
	case err != nil:
		return err.Error()
	case resp.Exception != nil:
		return resp.Exception.Error()
	}
	if r, ok := resp.Value.(*Receipt); ok {
		return fmt.Sprintf("%+v", r)
	}
	return fmt.Sprint(resp.Value)
}

// ExampleNewClient calls a Java interface typed and generically through a
// proxy.Client, from the same declaration the provider serves: here a
// dabb Server serving Shop, found in a static registry. With a
// zookeeper:// registry the client finds Java and dubbo-go providers the
// same way.
func ExampleNewClient() {
	for class, proto := range map[string]any{"com.example.shop.Reservation": &Reservation{}, "com.example.shop.Receipt": &Receipt{}} {
		if err := dubbo.RegisterPOJO(class, proto); err != nil {
			log.Fatal(err)
		}
	}
	const iface = "com.example.shop.ShopService"
	shop := &Shop{stock: map[int64]int64{10086: 1000}}
	desc, err := dubbo.Service(iface, shop)
	if err != nil {
		log.Fatal(err)
	}
	s := dabb.NewServer()
	if err := s.RegisterService(desc, shop); err != nil {
		log.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(l) }()
	defer func() { s.Close(); <-done }()

	reg := static.New(registry.Instance{Service: iface, Addr: l.Addr().String()})
	defer reg.Close()
	c, err := proxy.NewClient(reg, proxy.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()

	// Typed: the declaration is Shop's own methods.
	client, err := dubbo.NewClient(c, iface, (*Shop)(nil), dubbo.WithIdempotent("Stock"))
	if err != nil {
		log.Fatal(err)
	}
	var ok bool
	err = client.Call(ctx, "Deduct", []any{10086, 3}, &ok)
	fmt.Println("deduct:", ok, err)
	var receipt *Receipt
	err = client.Call(ctx, "Reserve", []any{&Reservation{Sku: "10086", Count: 7, RequestId: "r-1"}}, &receipt)
	fmt.Printf("reserve: %+v %v\n", receipt, err)
	var n int64
	err = client.Call(ctx, "Stock", []any{42}, &n)
	var exc *dubbo.Exception
	fmt.Println("stock(42):", errors.Is(err, proxy.ErrServiceError), errors.As(err, &exc) && exc.Class == dubbo.RuntimeException, exc.Message)

	// Generic: no declaration; the types inferred (10086 is a long).
	v, err := dubbo.Invoke(ctx, c, iface, "stock", nil, []any{10086})
	fmt.Println("$invoke stock:", v, err)
	v, err = dubbo.Invoke(ctx, c, iface, "reserve", nil,
		[]any{map[string]any{"class": "com.example.shop.Reservation", "sku": "10086", "count": 10}})
	fmt.Println("$invoke reserve:", v, err)
	// Output:
	// deduct: true <nil>
	// reserve: &{Remaining:990 Duplicate:false} <nil>
	// stock(42): true true unknown sku 42
	// $invoke stock: 990 <nil>
	// $invoke reserve: map[class:com.example.shop.Receipt duplicate:false remaining:980] <nil>
}
