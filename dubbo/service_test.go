package dubbo

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
	"github.com/dabbrpc/dabb/internal/zktest"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/transport"
)

// store is the service the tests export as InventoryService, over every
// kind of method: primitives, strings, a POJO both ways, a null result, a
// void method, exceptions of each class.
type store struct {
	mu      sync.Mutex
	stock   map[int64]int64
	replies map[string]*DeductReply
	release chan struct{} // Block waits on it
	entered chan struct{} // Block reports itself on it
}

func newStore() *store {
	return &store{stock: map[int64]int64{10086: 1000}, replies: map[string]*DeductReply{},
		release: make(chan struct{}), entered: make(chan struct{}, 4)}
}

func (s *store) Deduct(_ context.Context, sku int64, count int32) (bool, error) {
	if count <= 0 {
		return false, protocol.NewError(protocol.StatusBadRequest, protocol.CodeInvalidArgument, fmt.Sprintf("count %d is not positive", count))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.stock[sku]
	if !ok {
		return false, fmt.Errorf("unknown sku %d", sku)
	}
	if n < int64(count) {
		return false, nil
	}
	s.stock[sku] = n - int64(count)
	return true, nil
}

func (s *store) Stock(_ context.Context, sku int64) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.stock[sku]
	if !ok {
		return 0, fmt.Errorf("unknown sku %d", sku)
	}
	return n, nil
}

func (s *store) DeductOnce(ctx context.Context, req *DeductRequest) (*DeductReply, error) {
	if req == nil {
		return nil, protocol.NewError(protocol.StatusBadRequest, "", "no request")
	}
	s.mu.Lock()
	if r, ok := s.replies[req.RequestId]; ok {
		s.mu.Unlock()
		return &DeductReply{Remaining: r.Remaining, Duplicate: true}, nil
	}
	s.mu.Unlock()
	var sku int64
	if _, err := fmt.Sscan(req.Sku, &sku); err != nil {
		return nil, protocol.NewError(protocol.StatusBadRequest, "", "sku "+req.Sku+" is not a number")
	}
	ok, err := s.Deduct(ctx, sku, req.Count)
	if err != nil || !ok {
		return nil, errors.Join(err, errors.New("not deducted"))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r := &DeductReply{Remaining: s.stock[sku]}
	s.replies[req.RequestId] = r
	return r, nil
}

// Find returns null for an unknown request id.
func (s *store) Find(_ context.Context, requestID string) (*DeductReply, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.replies[requestID], nil
}

// Echo takes a string, a double and a boolean.
func (s *store) Echo(_ context.Context, text string, x float64, loud bool) (string, error) {
	if loud {
		text = strings.ToUpper(text)
	}
	return fmt.Sprintf("%s %g", text, x), nil
}

// Reset is a void method.
func (s *store) Reset(context.Context) error { return nil }

// Refuse throws a Java exception of its own class.
func (s *store) Refuse(context.Context) (bool, error) {
	return false, &Exception{Class: "com.example.inventory.OutOfStockException", Message: "none left"}
}

// Meta returns an attachment of the call.
func (s *store) Meta(ctx context.Context, key string) (string, error) {
	return dabb.Attachments(ctx)[key], nil
}

// Budget returns the call's remaining budget in milliseconds, -1 for none.
func (s *store) Budget(ctx context.Context) (int64, error) {
	d, ok := ctx.Deadline()
	if !ok {
		return -1, nil
	}
	return time.Until(d).Milliseconds(), nil
}

// Block waits until released.
func (s *store) Block(ctx context.Context) error {
	s.entered <- struct{}{}
	select {
	case <-s.release:
	case <-ctx.Done():
	}
	return nil
}

// StockInt is stock(int), an overload of stock(long).
func (s *store) StockInt(ctx context.Context, sku int32) (int64, error) {
	return s.Stock(ctx, int64(sku))
}

// notServed has no context: Service leaves it out.
func (s *store) NotServed(x int) int { return x }

// serveStore serves a store as InventoryService on a fresh dabb Server and
// returns the store and the address.
func serveStore(t *testing.T, cfg transport.ServerConfig, opts ...ServiceOption) (*store, string) {
	t.Helper()
	st := newStore()
	opts = append([]ServiceOption{WithMethod("StockInt", "stock")}, opts...)
	desc, err := Service(inventory, st, opts...)
	if err != nil {
		t.Fatal(err)
	}
	s := dabb.NewServer(dabb.WithLogger(slog.New(slog.DiscardHandler)), dabb.WithTransport(cfg))
	if err := s.RegisterService(desc, st); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(l) }()
	t.Cleanup(func() {
		close(st.release)
		s.Close()
		if err := <-done; !errors.Is(err, dabb.ErrServerClosed) {
			t.Errorf("Serve = %v", err)
		}
	})
	return st, l.Addr().String()
}

// frameConn is a TCP connection that speaks Dubbo frames by hand.
type frameConn struct {
	t    *testing.T
	c    net.Conn
	next uint64
}

func dialFrames(t *testing.T, addr string) *frameConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &frameConn{t: t, c: c}
}

// send writes a two-way request frame with body and returns its id.
func (rc *frameConn) send(body []byte) uint64 {
	rc.t.Helper()
	rc.next++
	var h protocol.Header
	h.Init(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, Hessian2ID), 0, rc.next)
	h.SetMagic()
	h.SetBodyLen(uint32(len(body)))
	_ = rc.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := rc.c.Write(append(h[:], body...)); err != nil {
		rc.t.Fatal(err)
	}
	return rc.next
}

// answer reads one response frame: its header and body.
func (rc *frameConn) answer() (protocol.Header, []byte) {
	rc.t.Helper()
	var h protocol.Header
	if _, err := io.ReadFull(rc.c, h[:]); err != nil {
		rc.t.Fatalf("reading an answer: %v", err)
	}
	body := make([]byte, h.BodyLen())
	if _, err := io.ReadFull(rc.c, body); err != nil {
		rc.t.Fatalf("reading an answer's body: %v", err)
	}
	return h, body
}

// outcome is an answer decoded: the status and a result or a message.
type outcome struct {
	status protocol.Status
	resp   *Response
	msg    string
}

// call sends body and decodes the answer to it.
func (rc *frameConn) call(body []byte) outcome {
	rc.t.Helper()
	id := rc.send(body)
	h, b := rc.answer()
	if h.ID() != id || h.Flags().Serialization() != Hessian2ID || h.Flags().IsRequest() {
		rc.t.Fatalf("answer id %d flags %#02x; want a hessian2 response to %d", h.ID(), h.Flags(), id)
	}
	o := outcome{status: h.Status()}
	var err error
	if o.status == protocol.StatusOK {
		o.resp, err = DecodeResponse(b, Limits{})
	} else {
		o.msg, err = DecodeErrorMessage(b, Limits{})
	}
	if err != nil {
		rc.t.Fatalf("answer of status %d does not decode: %v (% x)", o.status, err, b)
	}
	return o
}

func (o outcome) String() string {
	if o.resp == nil {
		return fmt.Sprintf("status %d %q", o.status, o.msg)
	}
	if o.resp.Exception != nil {
		return fmt.Sprintf("status %d exception %+v", o.status, *o.resp.Exception)
	}
	return fmt.Sprintf("status %d value %#v attachments %v", o.status, o.resp.Value, o.resp.Attachments)
}

// request builds the body of a call of InventoryService.
func request(t *testing.T, method, desc string, args ...any) []byte {
	t.Helper()
	return requestWith(t, &Request{Path: inventory, Method: method, ParamTypes: desc, Args: args,
		Attachments: map[string]any{"interface": inventory, "path": inventory}})
}

func requestWith(t *testing.T, r *Request) []byte {
	t.Helper()
	b, err := AppendRequest(nil, r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestServeTyped: a dabb Server answers each kind of typed call of a
// Service as Java's provider would, with the result flag, the value in
// Java's types and the attachments a 2.0.2 consumer reads.
func TestServeTyped(t *testing.T) {
	_, addr := serveStore(t, transport.ServerConfig{})
	rc := dialFrames(t, addr)
	dubbo202 := map[string]any{"dubbo": "2.0.2"}
	for _, tc := range []struct {
		name   string
		body   []byte
		value  any
		attach map[string]any
	}{
		{"deduct", request(t, "deduct", "JI", int64(10086), int32(3)), true, dubbo202},
		{"stock", request(t, "stock", "J", int64(10086)), int64(997), dubbo202},
		{"stock(int)", request(t, "stock", "I", int32(10086)), int64(997), dubbo202},
		{"deductOnce", request(t, "deductOnce", "Lcom/example/inventory/DeductRequest;",
			&DeductRequest{Sku: "10086", Count: 7, RequestId: "r1"}), &DeductReply{Remaining: 990}, dubbo202},
		{"deductOnce again", request(t, "deductOnce", "Lcom/example/inventory/DeductRequest;",
			&DeductRequest{Sku: "10086", Count: 7, RequestId: "r1"}), &DeductReply{Remaining: 990, Duplicate: true}, dubbo202},
		{"find null", request(t, "find", "Ljava/lang/String;", "nope"), nil, dubbo202},
		{"echo", request(t, "echo", "Ljava/lang/String;DZ", "hi", 1.5, true), "HI 1.5", dubbo202},
		{"reset void", request(t, "reset", ""), nil, dubbo202},
		{"old consumer", requestWith(t, &Request{DubboVersion: "2.0.0", Path: inventory, Method: "stock", ParamTypes: "J",
			Args: []any{int64(10086)}}), int64(990), nil},
		{"timeout is the budget", requestWith(t, &Request{Path: inventory, Method: "budget",
			Attachments: map[string]any{"timeout": "5000"}}), nil, dubbo202},
		{"metadata", requestWith(t, &Request{Path: inventory, Method: "meta", Args: []any{"trace"},
			Attachments: map[string]any{"trace": "abc", "generic": false}}), "abc", dubbo202},
		{"path", request(t, "meta", "Ljava/lang/String;", "path"), inventory, dubbo202},
		{"dubbo version", request(t, "meta", "Ljava/lang/String;", "dubbo"), "2.0.2", dubbo202},
	} {
		o := rc.call(tc.body)
		if o.status != protocol.StatusOK || o.resp.Exception != nil {
			t.Errorf("%s: %v, want a value", tc.name, o)
			continue
		}
		if tc.name == "timeout is the budget" {
			if ms, _ := o.resp.Value.(int64); ms <= 0 || ms > 5000 {
				t.Errorf("%s: the handler saw a budget of %v ms, want 1-5000", tc.name, o.resp.Value)
			}
		} else if fmt.Sprintf("%#v", o.resp.Value) != fmt.Sprintf("%#v", tc.value) {
			t.Errorf("%s: %v, want value %#v", tc.name, o, tc.value)
		}
		if fmt.Sprint(o.resp.Attachments) != fmt.Sprint(tc.attach) {
			t.Errorf("%s: attachments %v, want %v", tc.name, o.resp.Attachments, tc.attach)
		}
	}
}

// TestServeExceptions: a handler's error is an exception result under
// status 20: IllegalArgumentException for the bad-request class,
// RuntimeException otherwise, an *Exception as itself; the text is the
// error's message.
func TestServeExceptions(t *testing.T) {
	_, addr := serveStore(t, transport.ServerConfig{})
	rc := dialFrames(t, addr)
	for _, tc := range []struct {
		name, class, msg string
		body             []byte
	}{
		{"bad request", IllegalArgumentException, "count 0 is not positive", request(t, "deduct", "JI", int64(10086), int32(0))},
		{"error", RuntimeException, "unknown sku 42", request(t, "stock", "J", int64(42))},
		{"own class", "com.example.inventory.OutOfStockException", "none left", request(t, "refuse", "")},
		{"null POJO", IllegalArgumentException, "no request", request(t, "deductOnce", "Lcom/example/inventory/DeductRequest;", nil)},
	} {
		o := rc.call(tc.body)
		if o.status != protocol.StatusOK || o.resp.Exception == nil ||
			o.resp.Exception.Class != tc.class || o.resp.Exception.Message != tc.msg {
			t.Errorf("%s: %v, want exception %s: %s", tc.name, o, tc.class, tc.msg)
		}
	}
}

// TestServeGeneric: $invoke calls a method by name and types (or name
// alone), with POJOs as maps, and answers POJOs as maps with "class";
// exceptions come wrapped in GenericException.
func TestServeGeneric(t *testing.T) {
	_, addr := serveStore(t, transport.ServerConfig{})
	rc := dialFrames(t, addr)
	const genericDesc = "Ljava/lang/String;[Ljava/lang/String;[Ljava/lang/Object;"
	invoke := func(name string, types []string, args ...any) []byte {
		var tv any
		if types != nil {
			tv = types
		}
		return requestWith(t, &Request{Path: inventory, Method: "$invoke", ParamTypes: genericDesc,
			Args: []any{name, tv, args}, Attachments: map[string]any{"generic": "true"}})
	}
	reqMap := map[string]any{"class": "com.example.inventory.DeductRequest", "sku": "10086", "count": int32(5), "requestId": "g1"}
	for _, tc := range []struct {
		name  string
		body  []byte
		value string
	}{
		{"by types", invoke("stock", []string{"long"}, int64(10086)), "1000"},
		{"overload by types", invoke("stock", []string{"int"}, int32(10086)), "1000"},
		{"widened", invoke("deduct", []string{"long", "int"}, int32(10086), int64(0x10)), "true"},
		{"by name alone", invoke("echo", nil, "a", int32(2), false), `"a 2"`},
		{"POJO map in and out", invoke("deductOnce", []string{"com.example.inventory.DeductRequest"}, reqMap),
			`map[class:com.example.inventory.DeductReply duplicate:false remaining:979]`},
		{"null result", invoke("find", []string{"java.lang.String"}, "none"), "<nil>"},
		{"async", requestWith(t, &Request{Path: inventory, Method: "$invokeAsync", ParamTypes: genericDesc,
			Args: []any{"stock", []string{"long"}, []any{int64(10086)}}}), "979"},
	} {
		o := rc.call(tc.body)
		if o.status != protocol.StatusOK || o.resp.Exception != nil {
			t.Errorf("%s: %v, want a value", tc.name, o)
			continue
		}
		got := fmt.Sprintf("%#v", o.resp.Value)
		if m, ok := o.resp.Value.(map[any]any); ok {
			got = fmt.Sprint(m)
		}
		if got != tc.value {
			t.Errorf("%s: value %s, want %s", tc.name, got, tc.value)
		}
	}

	o := rc.call(invoke("stock", []string{"long"}, int64(42)))
	if o.status != protocol.StatusOK || o.resp.Exception == nil || o.resp.Exception.Class != GenericException ||
		o.resp.Exception.WrappedClass != RuntimeException || o.resp.Exception.WrappedMessage != "unknown sku 42" ||
		o.resp.Exception.Message != RuntimeException+": unknown sku 42" {
		t.Errorf("$invoke of a failing call: %v, want a GenericException around RuntimeException: unknown sku 42", o)
	}
	for _, tc := range []struct {
		name   string
		body   []byte
		status protocol.Status
		text   string
	}{
		{"unknown method", invoke("nope", nil), protocol.StatusServiceError, "No such method nope in class " + inventory},
		{"no such types", invoke("stock", []string{"java.lang.String"}, "x"), protocol.StatusServiceError, "No such method stock(java.lang.String)"},
		{"not unique", invoke("stock", nil, int64(1)), protocol.StatusBadRequest, "Not unique method for method name(stock)"},
		{"argument of another type", invoke("stock", []string{"long"}, "x"), protocol.StatusBadRequest, "argument 1 of stock(long)"},
		{"too few arguments", invoke("stock", []string{"long"}), protocol.StatusBadRequest, "0 arguments for stock(long)"},
		{"POJO of another class", invoke("deductOnce", []string{"com.example.inventory.DeductRequest"},
			map[string]any{"class": "com.example.Other"}), protocol.StatusBadRequest, "class com.example.Other"},
	} {
		o := rc.call(tc.body)
		if o.status != tc.status || !strings.Contains(o.msg, tc.text) {
			t.Errorf("%s: %v, want status %d with %q", tc.name, o, tc.status, tc.text)
		}
	}
}

// TestServeFailures: failures of the framework are a status and a string,
// as Java's HeaderExchangeHandler answers them, and the connection stays
// for the next call wherever the frame was read whole.
func TestServeFailures(t *testing.T) {
	_, addr := serveStore(t, transport.ServerConfig{MaxBody: 4096}, WithVersion("1.0"))
	rc := dialFrames(t, addr)
	v1 := func(r *Request) []byte {
		r.Version = "1.0"
		return requestWith(t, r)
	}
	valid := v1(&Request{Path: inventory, Method: "stock", Args: []any{int64(10086)}})
	head := func(desc string) []byte { // the fields before the arguments
		b, err := appendValues(nil, []any{"2.0.2", inventory, "1.0", "stock", desc}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, tc := range []struct {
		name   string
		body   []byte
		status protocol.Status
		text   string
	}{
		{"unknown service", requestWith(t, &Request{Path: "com.example.Nope", Method: "stock", Args: []any{int64(1)}}),
			protocol.StatusServiceError, "Not found exported service: com.example.Nope"},
		{"unknown method", v1(&Request{Path: inventory, Method: "nope", Args: []any{int64(1)}}),
			protocol.StatusServiceError, "No such method nope in service " + inventory},
		{"other version", requestWith(t, &Request{Path: inventory, Method: "stock", Version: "2.0", Args: []any{int64(1)}}),
			protocol.StatusServiceError, "Not found exported service: " + inventory + ":2.0"},
		{"other group", v1(&Request{Path: inventory, Method: "stock", Args: []any{int64(1)}, Attachments: map[string]any{"group": "g"}}),
			protocol.StatusServiceError, "Not found exported service: g/" + inventory},
		{"descriptor of no method", v1(&Request{Path: inventory, Method: "stock", ParamTypes: "D", Args: []any{1.5}}),
			protocol.StatusServiceError, "No such method stock(D)"},
		{"descriptor of another method's types", v1(&Request{Path: inventory, Method: "stock", ParamTypes: "Ljava/lang/Object;", Args: []any{"x"}}),
			protocol.StatusServiceError, "No such method stock(Ljava/lang/Object;)"},
		{"malformed", append(head("J"), 0x40, 0x41), protocol.StatusBadRequest, "malformed"},
		{"unknown class", append(head("Ljava/lang/Object;"), append([]byte{'C'}, append(hessianString("com.example.Evil"), 0x90, 'H', 'Z')...)...),
			protocol.StatusBadRequest, "com.example.Evil"},
		{"list longer than the body", append(head("Ljava/util/List;"), 'X', 0xd5, 0xff, 0xff), protocol.StatusBadRequest, "declared length"},
		{"fewer values than the descriptor", head("JJ"), protocol.StatusBadRequest, "descriptor"},
		{"over the size limit", v1(&Request{Path: inventory, Method: "echo", Args: []any{strings.Repeat("x", 5000), 1.0, false}}),
			protocol.StatusBadRequest, "4096"},
	} {
		o := rc.call(tc.body)
		if o.status != tc.status || !strings.Contains(o.msg, tc.text) {
			t.Errorf("%s: %v, want status %d with %q", tc.name, o, tc.status, tc.text)
		}
		if o := rc.call(valid); o.status != protocol.StatusOK || o.resp.Value != int64(1000) {
			t.Fatalf("after %s, a valid call on the same connection: %v", tc.name, o)
		}
	}
	// dubbo-go's failover retries send timeout "0": no budget, not a
	// spent one, so the call is served.
	zero := v1(&Request{Path: inventory, Method: "stock", Args: []any{int64(10086)}, Attachments: map[string]any{"timeout": "0"}})
	if o := rc.call(zero); o.status != protocol.StatusOK || o.resp.Value != int64(1000) {
		t.Errorf("timeout 0: %v, want the stock answered", o)
	}
}

// TestServeOverload: a call past MaxConcurrent is answered 100 with a
// string.
func TestServeOverload(t *testing.T) {
	st, addr := serveStore(t, transport.ServerConfig{MaxConcurrent: 1})
	rc := dialFrames(t, addr)
	rc.send(request(t, "block", ""))
	select {
	case <-st.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("block did not start within 10s")
	}
	o := rc.call(request(t, "stock", "J", int64(10086)))
	if o.status != protocol.StatusServerThreadpoolExhausted || !strings.Contains(o.msg, "busy") {
		t.Errorf("a call past MaxConcurrent: %v, want status 100 with a string", o)
	}
}

// TestServiceRefuses: Service refuses what it cannot serve, naming it.
func TestServiceRefuses(t *testing.T) {
	type noPOJO struct{}
	for _, tc := range []struct {
		name, iface string
		impl        any
		opts        []ServiceOption
		text        string
	}{
		{"no interface name", "Inventory", newStore(), nil, "not a package-qualified"},
		{"nil", inventory, nil, nil, "nil implementation"},
		{"no methods", inventory, noPOJO{}, nil, "has no method"},
		{"unknown Go name", inventory, newStore(), []ServiceOption{WithMethod("Nope", "nope")}, `WithMethod("Nope")`},
		{"not served form", inventory, newStore(), []ServiceOption{WithMethod("NotServed", "x")}, "not of the form"},
		{"type count", inventory, newStore(), []ServiceOption{WithMethod("Stock", "stock", "long", "int")}, "2 Java types for 1 parameters"},
		{"same signature twice", inventory, newStore(), []ServiceOption{WithMethod("StockInt", "stock", "long")}, "are both stock(long)"},
		{"bad Java name", inventory, newStore(), []ServiceOption{WithMethod("Stock", "$stock")}, "not a Java method name"},
	} {
		_, err := Service(tc.iface, tc.impl, tc.opts...)
		if err == nil || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("%s: Service = %v, want an error with %q", tc.name, err, tc.text)
		}
	}
	_, err := Service(inventory, &badParam{})
	if err == nil || !errors.Is(err, ErrUnknownClass) {
		t.Errorf("a parameter of an unregistered struct: %v, want ErrUnknownClass", err)
	}
}

type badParam struct{}

func (*badParam) Take(context.Context, *struct{ X int }) error { return nil }

// TestServiceDesc: the description names the Java methods, the generic
// ones, and the metadata the zookeeper:// registry publishes, the
// signatures of its service definition (overloads included) among them.
func TestServiceDesc(t *testing.T) {
	desc, err := Service(inventory, newStore(), WithMethod("StockInt", "stock"), WithMethod("Find", "findReply"),
		WithVersion("1.0"), WithGroup("g"), WithApplication("shop"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range desc.Methods {
		names = append(names, m.Name)
	}
	const want = "block budget deduct deductOnce echo findReply meta refuse reset stock $invoke $invokeAsync $echo"
	if got := strings.Join(names, " "); desc.Name != inventory || got != want {
		t.Errorf("desc %s with methods %q, want %s with %q", desc.Name, got, inventory, want)
	}
	wantMeta := map[string]string{
		MetaMethods: "block,budget,deduct,deductOnce,echo,findReply,meta,refuse,reset,stock",
		MetaVersion: "1.0", MetaGroup: "g", MetaApplication: "shop",
		MetaSignatures: "block()void;budget()long;deduct(long,int)boolean;" +
			"deductOnce(com.example.inventory.DeductRequest)com.example.inventory.DeductReply;" +
			"echo(java.lang.String,double,boolean)java.lang.String;findReply(java.lang.String)com.example.inventory.DeductReply;" +
			"meta(java.lang.String)java.lang.String;refuse()boolean;reset()void;stock(long)long;stock(int)long",
	}
	if fmt.Sprint(desc.Metadata) != fmt.Sprint(wantMeta) {
		t.Errorf("metadata %v, want %v", desc.Metadata, wantMeta)
	}
}

// TestServicePublishedInDubboLayout: a Server with a zookeeper://
// registry publishes a Service's export as Java's provider node, with the
// methods, version and application the ServiceDesc's Metadata gives, and
// removes it when it closes.
func TestServicePublishedInDubboLayout(t *testing.T) {
	zs := zktest.Shared(t)
	reg := newTestRegistry(t, "zookeeper://"+zs.Addr())
	conn := rawConn(t, zs.Addr())
	iface := ifaceFor(t)
	st := newStore()
	desc, err := Service(iface, st, WithMethod("StockInt", "stock"), WithVersion("1.0"), WithApplication("shop"))
	if err != nil {
		t.Fatal(err)
	}
	s, l := serveOnRegistry(t, reg, desc, st)
	// Serve answers calls once it has published.
	fc := dialFrames(t, l.Addr().String())
	if o := fc.call(requestWith(t, &Request{Path: iface, Version: "1.0", Method: "stock", Args: []any{int64(10086)}})); o.status != protocol.StatusOK {
		t.Fatalf("stock: %v", o)
	}
	providers := "/dubbo/" + iface + "/providers"
	nodes := children(t, conn, providers)
	if len(nodes) != 1 {
		t.Fatalf("%s holds %v, want one node", providers, nodes)
	}
	raw, err := zkDecode(nodes[0])
	if err != nil {
		t.Fatal(err)
	}
	u, err := parseProviderURL(raw)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"interface": iface, "methods": "block,budget,deduct,deductOnce,echo,find,meta,refuse,reset,stock",
		"version": "1.0", "application": "shop", "serialization": "hessian2", "side": "provider",
	}
	for k, v := range want {
		if u.params[k] != v {
			t.Errorf("parameter %s=%q, want %q", k, u.params[k], v)
		}
	}
	if u.addr != l.Addr().String() {
		t.Errorf("provider at %s, want %s", u.addr, l.Addr())
	}
	s.Close()
	waitChildren(t, conn, providers, 0, 10*time.Second, "after Close")
}

// TestServeJavaHeartbeat: Java's heartbeat, an event of serialization
// hessian2 whose body is null, is answered with the heartbeat response on
// the same id, and calls go on after it.
func TestServeJavaHeartbeat(t *testing.T) {
	_, addr := serveStore(t, transport.ServerConfig{})
	fc := dialFrames(t, addr)
	var h protocol.Header
	h.Init(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay|protocol.FlagEvent, Hessian2ID), 0, 77)
	h.SetMagic()
	h.SetBodyLen(1)
	_ = fc.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fc.c.Write(append(h[:], 'N')); err != nil {
		t.Fatal(err)
	}
	got, _ := fc.answer()
	if got.ID() != 77 || !got.Flags().IsEvent() || got.Flags().IsRequest() || got.Status() != protocol.StatusOK {
		t.Errorf("heartbeat answer id %d flags %#02x status %d; want the event response to 77", got.ID(), got.Flags(), got.Status())
	}
	if o := fc.call(request(t, "stock", "J", int64(10086))); o.status != protocol.StatusOK {
		t.Errorf("a call after the heartbeat: %v", o)
	}
}

// serveOnRegistry serves desc, implemented by st, on a loopback listener
// with reg as the server's registry, until the test ends; st's waiting
// calls are released first.
func serveOnRegistry(t *testing.T, reg *Registry, desc *dabb.ServiceDesc, st *store) (*dabb.Server, net.Listener) {
	t.Helper()
	s := dabb.NewServer(dabb.WithLogger(testLogger(t)), dabb.WithRegistry(reg))
	if err := s.RegisterService(desc, st); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(l) }()
	t.Cleanup(func() {
		close(st.release)
		s.Close()
		<-done
	})
	return s, l
}
