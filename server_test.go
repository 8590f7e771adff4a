package dabb_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/balancer"
	"github.com/dabbrpc/dabb/codec"
	_ "github.com/dabbrpc/dabb/codec/proto"
	"github.com/dabbrpc/dabb/internal/dabbtest"
	pb "github.com/dabbrpc/dabb/internal/inventory/inventorypb"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
	"github.com/dabbrpc/dabb/transport"
	"go.uber.org/goleak"
	gproto "google.golang.org/protobuf/proto"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testTimeout = 10 * time.Second

// quiet discards the logs of servers that are made to fail on purpose.
var quiet = slog.New(slog.DiscardHandler)

// probe is a test service. Its one method, Do, acts on the request's sku:
//
//	"echo"         answers Sku back with Count = remaining budget in ms
//	"panic"        panics
//	"fail"         returns a plain error
//	"bad"          returns a status 40 error
//	"wrapbad"      returns a status 40 error wrapped by fmt.Errorf
//	"errorf"       returns protocol.Errorf(60, ...) wrapping io.EOF
//	"sleep:<dur>"  sleeps (or until ctx ends), then answers
//	"stall:<dur>"  sleeps, ignoring ctx, then answers
//	"block"        waits until the test releases it
//	"deaf"         waits until the test releases it, ignoring ctx
//	"key"          answers the call's idempotency key as Sku
//	"nil"          returns a nil reply and a nil error
type probe struct {
	ran     atomic.Int64
	release chan struct{}
	started chan struct{}
	delay   atomic.Int64              // nanoseconds every call waits first
	record  func(ctx context.Context) // called on every call, if set
	relay   proxy.Caller              // "relay" calls "echo" through it
}

func newProbe() *probe {
	return &probe{release: make(chan struct{}), started: make(chan struct{}, 1024)}
}

func (p *probe) Do(ctx context.Context, req *pb.StockRequest) (*pb.StockReply, error) {
	p.ran.Add(1)
	if p.record != nil {
		p.record(ctx)
	}
	if d := p.delay.Load(); d > 0 {
		time.Sleep(time.Duration(d))
	}
	sku := req.GetSku()
	switch {
	case sku == "panic":
		panic("probe: asked to panic")
	case sku == "fail":
		return nil, errors.New("probe: asked to fail")
	case sku == "bad":
		return nil, &protocol.Error{Status: protocol.StatusBadRequest, Msg: "probe: asked for a bad request"}
	case sku == "wrapbad":
		return nil, fmt.Errorf("probe: looking it up: %w", &protocol.Error{Status: protocol.StatusBadRequest, Msg: "no such sku"})
	case sku == "errorf":
		return nil, protocol.Errorf(protocol.StatusServiceNotFound, "probe: no sku %q: %w", "x", io.EOF)
	case sku == "relay":
		time.Sleep(100 * time.Millisecond) // spend some of the budget first
		return call(ctx, p.relay, "echo", proxy.Timeout(10*time.Second))
	case sku == "nil":
		return nil, nil
	case sku == "key":
		return &pb.StockReply{Sku: dabb.IdempotencyKey(ctx), Count: int64(len(dabb.Attachments(ctx)))}, nil
	case sku == "deaf":
		p.started <- struct{}{}
		<-p.release // ignores ctx
	case sku == "block":
		p.started <- struct{}{}
		select {
		case <-p.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	case strings.HasPrefix(sku, "stall:"):
		d, _ := time.ParseDuration(strings.TrimPrefix(sku, "stall:"))
		time.Sleep(d)
	case strings.HasPrefix(sku, "sleep:"):
		d, _ := time.ParseDuration(strings.TrimPrefix(sku, "sleep:"))
		p.started <- struct{}{}
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	var budget int64 = -1
	if dl, ok := ctx.Deadline(); ok {
		budget = time.Until(dl).Milliseconds()
	}
	return &pb.StockReply{Sku: sku, Count: budget}, nil
}

type prober interface {
	Do(ctx context.Context, req *pb.StockRequest) (*pb.StockReply, error)
}

var probeDesc = dabb.ServiceDesc{
	Name:        "test.Probe",
	HandlerType: (*prober)(nil),
	Methods: []dabb.MethodDesc{{
		Name: "Do",
		Handler: func(srv any, ctx context.Context, dec func(any) error) (any, error) {
			req := new(pb.StockRequest)
			if err := dec(req); err != nil {
				return nil, err
			}
			return srv.(prober).Do(ctx, req)
		},
	}},
}

// startServer serves a probe on a loopback port and returns its address.
func startServer(t testing.TB, p *probe, opts ...dabb.Option) (*dabb.Server, string) {
	t.Helper()
	return serveImpl(t, p, opts...)
}

// serveImpl serves impl under the probe's service on a loopback port. The
// server is closed when the test ends.
func serveImpl(t testing.TB, impl any, opts ...dabb.Option) (*dabb.Server, string) {
	t.Helper()
	s := dabb.NewServer(append([]dabb.Option{dabb.WithLogger(quiet)}, opts...)...)
	if err := s.RegisterService(&probeDesc, impl); err != nil {
		t.Fatal(err)
	}
	return s, dabbtest.Serve(t, s)
}

func newClient(t testing.TB, addrs ...string) *proxy.Client {
	t.Helper()
	return newClientWith(t, nil, addrs...)
}

func newClientWith(t testing.TB, opts []proxy.Option, addrs ...string) *proxy.Client {
	t.Helper()
	var ins []registry.Instance
	for _, a := range addrs {
		ins = append(ins, registry.Instance{Service: probeDesc.Name, ID: a, Addr: a})
	}
	c, err := proxy.NewClient(static.New(ins...), append([]proxy.Option{proxy.WithLogger(quiet)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func call(ctx context.Context, c proxy.Caller, sku string, opts ...proxy.CallOption) (*pb.StockReply, error) {
	resp := new(pb.StockReply)
	err := c.Invoke(ctx, probeDesc.Name, "Do", &pb.StockRequest{Sku: sku}, resp, opts...)
	return resp, err
}

func statusOf(t *testing.T, err error) *protocol.Error {
	t.Helper()
	var pe *protocol.Error
	if !errors.As(err, &pe) {
		t.Fatalf("error %v (%T) is not a *protocol.Error", err, err)
	}
	return pe
}

func TestCallOutcomes(t *testing.T) {
	p := newProbe()
	_, addr := startServer(t, p)
	c := newClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	tests := []struct {
		sku      string
		status   protocol.Status
		sentinel error
		msg      string
	}{
		{"echo", protocol.StatusOK, nil, ""},
		{"fail", protocol.StatusServiceError, proxy.ErrServiceError, "probe: asked to fail"},
		{"panic", protocol.StatusServiceError, proxy.ErrServiceError, "panic"},
		{"bad", protocol.StatusBadRequest, proxy.ErrBadRequest, "probe: asked for a bad request"},
		{"wrapbad", protocol.StatusBadRequest, proxy.ErrBadRequest, "probe: looking it up: no such sku"},
		{"errorf", protocol.StatusServiceNotFound, proxy.ErrNotFound, `probe: no sku "x": EOF`},
	}
	for _, tt := range tests {
		t.Run(tt.sku, func(t *testing.T) {
			reply, err := call(ctx, c, tt.sku)
			if tt.status == protocol.StatusOK {
				if err != nil {
					t.Fatalf("call: %v", err)
				}
				if reply.GetSku() != tt.sku {
					t.Fatalf("reply sku %q, want %q", reply.GetSku(), tt.sku)
				}
				return
			}
			pe := statusOf(t, err)
			if pe.Status != tt.status || !pe.Remote {
				t.Fatalf("got status %v remote=%v, want remote %v", pe.Status, pe.Remote, tt.status)
			}
			if !errors.Is(err, tt.sentinel) {
				t.Errorf("errors.Is(%v, %v) = false", err, tt.sentinel)
			}
			if !strings.Contains(pe.Msg, tt.msg) {
				t.Errorf("message %q does not contain %q", pe.Msg, tt.msg)
			}
			if strings.Contains(pe.Msg, "status ") {
				t.Errorf("message %q repeats a status the header carries", pe.Msg)
			}
		})
	}
	// The server lives on after the panic.
	if _, err := call(ctx, c, "echo"); err != nil {
		t.Fatalf("call after panic: %v", err)
	}
}

func TestIdempotencyKeyReachesHandler(t *testing.T) {
	_, addr := startServer(t, newProbe())
	c := newClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	reply, err := call(ctx, c, "key", proxy.IdempotencyKey("order-7"), proxy.Attachment("trace", "t"))
	if err != nil {
		t.Fatal(err)
	}
	// The key is read with IdempotencyKey, not among the Attachments.
	if reply.GetSku() != "order-7" || reply.GetCount() != 1 {
		t.Fatalf("handler saw key %q and %d attachments, want order-7 and 1 (trace)", reply.GetSku(), reply.GetCount())
	}
	// An idempotent call without attachments sends none.
	reply, err = call(ctx, c, "key", proxy.Idempotent())
	if err != nil {
		t.Fatal(err)
	}
	if reply.GetSku() != "" || reply.GetCount() != 0 {
		t.Fatalf("idempotent call without attachments: handler saw key %q and %d attachments", reply.GetSku(), reply.GetCount())
	}
	// A call that is not idempotent gets a fresh key from the client.
	keys := map[string]bool{}
	for range 3 {
		reply, err = call(ctx, c, "key")
		if err != nil {
			t.Fatal(err)
		}
		if reply.GetSku() == "" || keys[reply.GetSku()] {
			t.Fatalf("non-idempotent call: key %q (seen before: %v)", reply.GetSku(), keys[reply.GetSku()])
		}
		keys[reply.GetSku()] = true
	}
}

// plaintextOK lets credentials that require TLS travel in plaintext, as
// on a trusted test network.
type plaintextOK struct{ proxy.Credentials }

func (plaintextOK) RequireTransportSecurity() bool { return false }

// TestBearerTokenReachesHandler: a handler reads the token that the
// client's BearerToken sent with dabb.Attachments.
func TestBearerTokenReachesHandler(t *testing.T) {
	p := newProbe()
	got := make(chan string, 1)
	p.record = func(ctx context.Context) { got <- dabb.Attachments(ctx)[protocol.AttachAuthorization] }
	_, addr := startServer(t, p)
	token := proxy.BearerToken(func(context.Context) (string, error) { return "s3cret", nil })
	c := newClientWith(t, []proxy.Option{proxy.WithCredentials(plaintextOK{token})}, addr)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if _, err := call(ctx, c, "echo"); err != nil {
		t.Fatal(err)
	}
	if a := <-got; a != "Bearer s3cret" {
		t.Errorf("handler read authorization %q, want %q", a, "Bearer s3cret")
	}
}

func TestPanicReachesOnlyItsCaller(t *testing.T) {
	p := newProbe()
	_, addr := startServer(t, p)
	c := newClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	var wg sync.WaitGroup
	var okCalls, panics, other atomic.Int64
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sku := "echo"
			if i%10 == 0 {
				sku = "panic"
			}
			_, err := call(ctx, c, sku)
			switch {
			case err == nil && sku == "echo":
				okCalls.Add(1)
			case errors.Is(err, proxy.ErrServiceError) && sku == "panic":
				panics.Add(1)
			default:
				other.Add(1)
				t.Errorf("sku %s: %v", sku, err)
			}
		}()
	}
	wg.Wait()
	if okCalls.Load() != 180 || panics.Load() != 20 || other.Load() != 0 {
		t.Fatalf("ok=%d panics=%d other=%d, want 180/20/0", okCalls.Load(), panics.Load(), other.Load())
	}
}

func TestNotFound(t *testing.T) {
	p := newProbe()
	_, addr := startServer(t, p)
	c := newClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	for _, tc := range []struct{ service, method, want string }{
		{"test.Nope", "Do", "service test.Nope not found"},
		{probeDesc.Name, "Nope", "method test.Probe.Nope not found"},
	} {
		// The static registry lists the probe's address for its own name
		// only, so ask the transport directly for the unknown service.
		err := rawCall(ctx, t, addr, tc.service, tc.method, 22, mustMarshal(t, &pb.StockRequest{Sku: "echo"}))
		pe := statusOf(t, err)
		if pe.Status != protocol.StatusServiceNotFound || !errors.Is(err, proxy.ErrNotFound) {
			t.Errorf("%s.%s: got %v, want status 60", tc.service, tc.method, err)
		}
		if !strings.Contains(pe.Msg, tc.want) {
			t.Errorf("message %q does not contain %q", pe.Msg, tc.want)
		}
		if pe.Code != protocol.CodeUnimplemented {
			t.Errorf("%s.%s: code %q, want %q: the server's own 60 must differ from a handler's", tc.service, tc.method, pe.Code, protocol.CodeUnimplemented)
		}
	}
	_ = c
}

// failer implements the probe's service with a handler that returns err.
type failer struct {
	err error
	ran atomic.Int64
}

func (f *failer) Do(context.Context, *pb.StockRequest) (*pb.StockReply, error) {
	f.ran.Add(1)
	return nil, f.err
}

// startFailer serves a failer under the probe's service name.
func startFailer(t *testing.T, f *failer) string {
	t.Helper()
	_, addr := serveImpl(t, f)
	return addr
}

// TestHandlerErrorCodes: a handler's code and details reach the caller,
// with the status the handler chose when dabb passes it.
func TestHandlerErrorCodes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	downstream := &protocol.Error{Status: protocol.StatusBadRequest, Code: protocol.CodeUnauthenticated,
		Msg: "token rejected", Remote: true}
	tests := []struct {
		name string
		err  error
		want protocol.Error // as the caller gets it, Remote aside
	}{
		{"code and two details", protocol.NewError(protocol.StatusServiceNotFound, "payment_not_found", "no payment 7",
			"payment_id=7", "region=eu"),
			protocol.Error{Status: protocol.StatusServiceNotFound, Code: "payment_not_found", Msg: "no payment 7",
				Details: []string{"payment_id=7", "region=eu"}}},
		{"wrapped", fmt.Errorf("charge: %w", protocol.NewError(protocol.StatusServiceError, protocol.CodeFailedPrecondition,
			"ledger closed", "ledger=3")),
			protocol.Error{Status: protocol.StatusServiceError, Code: protocol.CodeFailedPrecondition, Msg: "charge: ledger closed",
				Details: []string{"ledger=3"}}},
		// The status is not the handler's to send, the code is.
		{"status not passed", protocol.NewError(protocol.StatusServerThreadpoolExhausted, protocol.CodeResourceExhausted, "quota spent"),
			protocol.Error{Status: protocol.StatusServiceError, Code: protocol.CodeResourceExhausted,
				Msg: "status 100 (server threadpool exhausted), code resource_exhausted: quota spent"}},
		{"rejected by a downstream", fmt.Errorf("call ledger: %w", downstream),
			protocol.Error{Status: protocol.StatusServiceError,
				Msg: "call ledger: remote status 40 (bad request), code unauthenticated: token rejected"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &failer{err: tt.err}
			c := newClient(t, startFailer(t, f))
			_, err := call(ctx, c, "x")
			pe := statusOf(t, err)
			want := tt.want
			want.Remote = true
			if pe.Status != want.Status || pe.Code != want.Code || pe.Msg != want.Msg || !pe.Remote ||
				!slices.Equal(pe.Details, want.Details) {
				t.Errorf("caller got %#v\nwant %#v", pe, &want)
			}
			if errors.Is(err, proxy.ErrUnauthenticated) {
				t.Error("a downstream's rejection reached the caller as its own")
			}
		})
	}

	t.Run("no such method is not entity not found", func(t *testing.T) {
		addr := startFailer(t, &failer{err: protocol.NewError(protocol.StatusServiceNotFound, protocol.CodeNotFound, "no payment 7")})
		c := newClient(t, addr)
		_, entity := call(ctx, c, "x")
		method := c.Invoke(ctx, probeDesc.Name, "Refund", &pb.StockRequest{}, new(pb.StockReply))
		pe, pm := statusOf(t, entity), statusOf(t, method)
		if pe.Status != pm.Status {
			t.Fatalf("statuses %v and %v: the test wants the same 60 for both", pe.Status, pm.Status)
		}
		if pe.Code != protocol.CodeNotFound || pm.Code != protocol.CodeUnimplemented {
			t.Errorf("codes %q (entity) and %q (method), want %q and %q", pe.Code, pm.Code,
				protocol.CodeNotFound, protocol.CodeUnimplemented)
		}
	})
}

// TestErrorResponseForAPeerWithoutCodes: a peer that writes a request with
// protocol alone and reads the response ignoring its attachments gets the
// status and the message as before codes existed.
func TestErrorResponseForAPeerWithoutCodes(t *testing.T) {
	addr := startFailer(t, &failer{err: protocol.NewError(protocol.StatusServiceNotFound, "payment_not_found",
		"no payment 7", "payment_id=7", "region=eu")})
	nc, err := net.DialTimeout("tcp", addr, testTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(testTimeout))
	req := &protocol.Message{Service: probeDesc.Name, Method: "Do", Payload: mustMarshal(t, &pb.StockRequest{Sku: "x"})}
	req.Header.Init(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, 22), 0, 5)
	if _, err := nc.Write(protocol.AppendMessage(nil, req)); err != nil {
		t.Fatal(err)
	}
	var resp protocol.Message
	if err := protocol.ReadMessage(bufio.NewReader(nc), &resp, 0); err != nil {
		t.Fatal(err)
	}
	if resp.Header.ID() != 5 || resp.Header.Status() != protocol.StatusServiceNotFound || string(resp.Payload) != "no payment 7" {
		t.Errorf("response id %d, status %v, payload %q; want 5, 60, the handler's message",
			resp.Header.ID(), resp.Header.Status(), resp.Payload)
	}
}

// logLines is a concurrency-safe log sink for a test server.
type logLines struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logLines) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

func TestBadPayload(t *testing.T) {
	p := newProbe()
	_, addr := startServer(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	err := rawCall(ctx, t, addr, probeDesc.Name, "Do", 22, []byte{0xff, 0xff, 0xff})
	if pe := statusOf(t, err); pe.Status != protocol.StatusBadRequest || !strings.Contains(pe.Msg, "decode Do request") {
		t.Errorf("undecodable payload: got %v, want status 40 naming the method", err)
	}
	if n := p.ran.Load(); n != 0 {
		t.Errorf("handler ran %d times for requests it could not decode", n)
	}
}

// order and its reply are the messages of a JSON service of plain Go
// types. orderReply is the reply of a newer server: an older client
// reads it into a type without Eta.
type (
	orderItem struct{ Sku string }
	order     struct {
		Customer string
		Items    []orderItem
	}
	orderReply struct{ ID, Eta string }
)

type orderTaker interface {
	Place(ctx context.Context, req *order) (*orderReply, error)
}

// orders takes every order and remembers the last.
type orders struct {
	mu   sync.Mutex
	last *order
}

func (o *orders) Place(_ context.Context, req *order) (*orderReply, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.last = req
	return &orderReply{ID: "o-1", Eta: "tomorrow"}, nil
}

var ordersDesc = dabb.ServiceDesc{
	Name:        "test.Orders",
	HandlerType: (*orderTaker)(nil),
	Methods: []dabb.MethodDesc{{
		Name: "Place",
		Handler: func(srv any, ctx context.Context, dec func(any) error) (any, error) {
			req := new(order)
			if err := dec(req); err != nil {
				return nil, err
			}
			return srv.(orderTaker).Place(ctx, req)
		},
	}},
}

// placeOrder sends req, whatever its type, as the JSON request of
// test.Orders.Place on a server made with opts, and decodes the reply
// into resp. It returns the order the handler got, nil if it did not run.
func placeOrder(t *testing.T, req, resp any, opts ...dabb.Option) (*order, error) {
	t.Helper()
	s := dabb.NewServer(append([]dabb.Option{dabb.WithLogger(quiet)}, opts...)...)
	impl := &orders{}
	if err := s.RegisterService(&ordersDesc, impl); err != nil {
		t.Fatal(err)
	}
	addr := dabbtest.Serve(t, s)
	c, err := proxy.NewClient(static.New(registry.Instance{Service: ordersDesc.Name, ID: addr, Addr: addr}),
		proxy.WithCodec("json"), proxy.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	err = c.Invoke(ctx, ordersDesc.Name, "Place", req, resp)
	impl.mu.Lock()
	defer impl.mu.Unlock()
	return impl.last, err
}

// TestJSONRequestWithUnknownField: a JSON request with a member its type
// has no field for is refused with 40 naming the member, before the
// handler runs; WithLaxJSON ignores the member instead.
func TestJSONRequestWithUnknownField(t *testing.T) {
	for _, tc := range []struct {
		name, field string
		req         map[string]any
	}{
		{"top", `"customr"`, map[string]any{"customr": "x"}},
		{"nested", `"skux"`, map[string]any{"Customer": "x", "Items": []any{map[string]any{"skux": "a"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := placeOrder(t, tc.req, new(orderReply))
			pe := statusOf(t, err)
			if !pe.Remote || pe.Status != protocol.StatusBadRequest || !errors.Is(err, proxy.ErrBadRequest) ||
				!strings.Contains(pe.Msg, "unknown field "+tc.field) || !strings.Contains(pe.Msg, "decode Place request") {
				t.Errorf("got %v, want a remote 40 naming the method and the field %s", err, tc.field)
			}
			if got != nil {
				t.Errorf("the handler ran with %+v", *got)
			}
		})
	}
	t.Run("lax", func(t *testing.T) {
		got, err := placeOrder(t, map[string]any{"customr": "x", "Items": []any{map[string]any{"Sku": "a"}}},
			new(orderReply), dabb.WithLaxJSON())
		if err != nil {
			t.Fatalf("WithLaxJSON: %v, want the call served", err)
		}
		if got == nil || got.Customer != "" || len(got.Items) != 1 || got.Items[0].Sku != "a" {
			t.Errorf("the handler got %+v, want the known fields and no customer", got)
		}
	})
	t.Run("known fields", func(t *testing.T) {
		// Names match without case, as encoding/json matches them.
		got, err := placeOrder(t, map[string]any{"customer": "ann", "Items": []any{}}, new(orderReply))
		if err != nil || got == nil || got.Customer != "ann" {
			t.Errorf("got %v and %+v, want the order of ann served", err, got)
		}
	})
}

// TestJSONReplyWithUnknownField: replies stay lax, so a client whose
// reply type lacks a field the server's has still reads the reply.
func TestJSONReplyWithUnknownField(t *testing.T) {
	var old struct{ ID string }
	if _, err := placeOrder(t, &order{Customer: "ann"}, &old); err != nil {
		t.Fatalf("an older client's call: %v, want the reply read", err)
	}
	if old.ID != "o-1" {
		t.Errorf("reply ID %q, want o-1", old.ID)
	}
}

func TestDeadlineBudget(t *testing.T) {
	p := newProbe()
	_, addr := startServer(t, p)
	c := newClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	reply, err := call(ctx, c, "echo", proxy.Timeout(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if b := reply.GetCount(); b <= 0 || b > 300 {
		t.Fatalf("handler saw a budget of %d ms, want in (0, 300]", b)
	}
	// The context's deadline wins when earlier than the method's timeout.
	short, cancel2 := context.WithTimeout(ctx, 150*time.Millisecond)
	defer cancel2()
	reply, err = call(short, c, "echo", proxy.Timeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if b := reply.GetCount(); b <= 0 || b > 150 {
		t.Fatalf("handler saw a budget of %d ms, want in (0, 150]", b)
	}
	// A slow handler: the client gives up with a local 31 at its budget.
	start := time.Now()
	_, err = call(ctx, c, "stall:300ms", proxy.Timeout(100*time.Millisecond))
	pe := statusOf(t, err)
	if pe.Status != protocol.StatusServerTimeout || pe.Remote || !errors.Is(err, proxy.ErrTimeout) {
		t.Fatalf("slow call: got %v, want a local status 31", err)
	}
	if el := time.Since(start); el > time.Second {
		t.Fatalf("slow call took %v to time out with a 100ms budget", el)
	}
	// A call whose budget is spent before sending never leaves: 30.
	spent, cancel3 := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel3()
	before := p.ran.Load()
	_, err = call(spent, c, "echo")
	if pe := statusOf(t, err); pe.Status != protocol.StatusClientTimeout || !errors.Is(err, proxy.ErrNotSent) {
		t.Fatalf("spent budget: got %v, want status 30 not sent", err)
	}
	if p.ran.Load() != before {
		t.Fatal("handler ran for a call whose budget was spent")
	}
}

// TestBudgetPropagates: a handler that calls another service with its own
// ctx passes on what remains of its caller's budget, however long the
// downstream method's own timeout is.
func TestBudgetPropagates(t *testing.T) {
	_, downstream := startServer(t, newProbe())
	up := newProbe()
	up.relay = newClient(t, downstream)
	_, upstream := startServer(t, up)
	c := newClient(t, upstream)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	reply, err := call(ctx, c, "relay", proxy.Timeout(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if b := reply.GetCount(); b <= 0 || b > 400 {
		t.Fatalf("downstream saw a budget of %d ms, want in (0, 400] after 100 ms of a 500 ms budget", b)
	}
}

func TestSpentBudgetOnTheWire(t *testing.T) {
	p := newProbe()
	_, addr := startServer(t, p)
	conn, err := net.DialTimeout("tcp", addr, testTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(testTimeout))
	m := &protocol.Message{Service: probeDesc.Name, Method: "Do", Timeout: -1, Payload: mustMarshal(t, &pb.StockRequest{Sku: "echo"})}
	m.Header.Init(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, 22), 0, 77)
	if _, err := conn.Write(protocol.AppendMessage(nil, m)); err != nil {
		t.Fatal(err)
	}
	var resp protocol.Message
	if err := protocol.ReadMessage(bufio.NewReader(conn), &resp, 0); err != nil {
		t.Fatal(err)
	}
	if resp.Header.ID() != 77 || resp.Header.Status() != protocol.StatusServerTimeout {
		t.Fatalf("got id %d status %v, want id 77 status 31", resp.Header.ID(), resp.Header.Status())
	}
	if p.ran.Load() != 0 {
		t.Fatal("handler ran although the budget was spent on arrival")
	}
}

func TestManyCallsOneClient(t *testing.T) {
	calls, workers := 100_000, 256
	if testing.Short() {
		calls = 10_000
	}
	p := newProbe()
	_, a1 := startServer(t, p)
	_, a2 := startServer(t, p)
	c := newClient(t, a1, a2)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var next, failed atomic.Int64
	var first atomic.Value
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(calls) {
					return
				}
				want := "echo-" + strconv.FormatInt(i, 10)
				reply, err := call(ctx, c, want, proxy.Timeout(10*time.Second))
				if err == nil && reply.GetSku() != want {
					err = fmt.Errorf("reply %q for request %q", reply.GetSku(), want)
				}
				if err != nil {
					failed.Add(1)
					first.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	wg.Wait()
	if n := failed.Load(); n != 0 {
		t.Fatalf("%d of %d calls failed; first: %v", n, calls, first.Load())
	}
	if got := p.ran.Load(); got != int64(calls) {
		t.Fatalf("server ran %d calls, want %d", got, calls)
	}
}

// TestShutdownDoesNotWaitForADeafHandler: Shutdown returns when its ctx
// ends, though a handler ignores its cancelled context.
func TestShutdownDoesNotWaitForADeafHandler(t *testing.T) {
	p := newProbe()
	defer close(p.release)
	s, addr := startServer(t, p)
	c := newClient(t, addr)
	go func() { _, _ = call(context.Background(), c, "deaf", proxy.Timeout(10*time.Second)) }()
	select {
	case <-p.started:
	case <-time.After(testTimeout):
		t.Fatal("the handler did not start")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := s.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown = %v, want context.DeadlineExceeded", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("Shutdown with a 100ms context returned after %v: it waited for the handler", el)
	}
}

func TestShutdownUnderLoad(t *testing.T) {
	p1, p2 := newProbe(), newProbe()
	s1, a1 := startServer(t, p1)
	_, a2 := startServer(t, p2)
	// Round robin over two equal instances alternates strictly, so each
	// gets exactly half of the slow calls.
	c := newClientWith(t, []proxy.Option{proxy.WithBalancer(balancer.RoundRobin)}, a1, a2)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	// Warm both connections, then start slow calls on both servers.
	for range 4 {
		if _, err := call(ctx, c, "echo"); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 1000)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := call(ctx, c, "sleep:200ms", proxy.Timeout(5*time.Second))
			errs <- err
		}()
	}
	for range 10 {
		select {
		case <-p1.started:
		case <-ctx.Done():
			t.Fatal("slow calls did not start on s1")
		}
	}
	ranBefore := p1.ran.Load()
	// A connection of its own to s1 (opened by a call to no service,
	// which runs no handler) tells when s1 began shutting down: its
	// read-only event. A call made earlier could reach s1 before that
	// and be run by it, as it should.
	readOnly := make(chan struct{})
	var once sync.Once
	watch := transport.NewPool(transport.Config{OnReadOnly: func(string) { once.Do(func() { close(readOnly) }) }})
	defer watch.Close()
	m := &protocol.Message{Service: "test.None", Method: "Do", Timeout: time.Second}
	m.Header.Init(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, 22), 0, 0)
	if resp, err := watch.RoundTrip(ctx, a1, m); err == nil {
		watch.Release(resp)
		t.Fatal("a call to no service succeeded")
	}
	shutdownDone := make(chan error, 1)
	go func() {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		shutdownDone <- s1.Shutdown(sctx)
	}()
	select {
	case <-readOnly:
	case <-ctx.Done():
		t.Fatal("s1 sent no read-only event after Shutdown began")
	}
	// Keep calling while s1 drains: every call must succeed, on s2 or
	// after a rejection by s1 that the client retries elsewhere.
	stop := time.After(400 * time.Millisecond)
loop:
	for {
		select {
		case <-stop:
			break loop
		default:
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := call(ctx, c, "echo")
			errs <- err
		}()
		time.Sleep(2 * time.Millisecond) // paces the load; not a synchronisation
	}
	wg.Wait()
	close(errs)
	n := 0
	for err := range errs {
		n++
		if err != nil {
			t.Errorf("call during shutdown: %v", err)
		}
	}
	if err := <-shutdownDone; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if got := p1.ran.Load(); got != ranBefore {
		t.Errorf("s1 ran %d calls after it began shutting down", got-ranBefore)
	}
	if n < 50 {
		t.Errorf("only %d calls made during the shutdown window", n)
	}
	for range 10 {
		if _, err := call(ctx, c, "echo"); err != nil {
			t.Fatalf("call after shutdown: %v", err)
		}
	}
}

func mustMarshal(t *testing.T, m gproto.Message) []byte {
	t.Helper()
	b, err := gproto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// rawCall sends one request with the given serialization id through a bare
// transport pool and returns the error it gets back.
func rawCall(ctx context.Context, t *testing.T, addr, service, method string, ser byte, payload []byte) error {
	t.Helper()
	// As a dabb client's pool: a frame in another protocol's
	// serialization is not parsed as dabb's.
	pool := transport.NewPool(transport.Config{Serializations: codec.Known})
	defer pool.Close()
	m := &protocol.Message{Service: service, Method: method, Timeout: time.Second, Payload: payload}
	m.Header.Init(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, ser), 0, 0)
	resp, err := pool.RoundTrip(ctx, addr, m)
	if err == nil {
		pool.Release(resp)
		t.Fatalf("%s.%s: call succeeded, want an error", service, method)
	}
	return err
}

// TestWithTransport: the transport.ServerConfig given to WithTransport
// takes effect, and its nil Logger gets the server's logger.
func TestWithTransport(t *testing.T) {
	t.Run("MaxConcurrent", func(t *testing.T) {
		p := newProbe()
		_, addr := startServer(t, p, dabb.WithTransport(transport.ServerConfig{MaxConcurrent: 1}))
		c := newClient(t, addr)
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		blocked := make(chan error, 1)
		go func() {
			_, err := call(ctx, c, "block")
			blocked <- err
		}()
		select {
		case <-p.started:
		case err := <-blocked:
			t.Fatalf("the blocking call ended before its handler started: %v", err)
		}
		_, err := call(ctx, c, "echo")
		if pe := statusOf(t, err); pe.Status != protocol.StatusServerThreadpoolExhausted {
			t.Errorf("a second call with MaxConcurrent 1: %v, want status 100", err)
		}
		close(p.release)
		if err := <-blocked; err != nil {
			t.Errorf("the blocking call: %v", err)
		}
	})
	t.Run("Logger", func(t *testing.T) {
		// The transport logs a request over MaxBody. The server itself
		// logs a handler's panic, with its own logger whatever the
		// transport's.
		for _, own := range []bool{false, true} {
			serverLogs, transportLogs := &logLines{}, &logLines{}
			cfg := transport.ServerConfig{MaxBody: 1024}
			if own {
				cfg.Logger = slog.New(slog.NewTextHandler(transportLogs, nil))
			}
			p := newProbe()
			_, addr := startServer(t, p, dabb.WithTransport(cfg), dabb.WithLogger(slog.New(slog.NewTextHandler(serverLogs, nil))))
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			c := newClient(t, addr)
			if _, err := call(ctx, c, strings.Repeat("x", 2048)); err == nil {
				t.Error("a call over MaxBody succeeded")
			}
			if _, err := call(ctx, c, "panic"); err == nil {
				t.Error("a call that panics succeeded")
			}
			cancel()
			want, other := serverLogs, transportLogs
			if own {
				want, other = transportLogs, serverLogs
			}
			if want.count("over MaxBody") != 1 || other.count("over MaxBody") != 0 {
				t.Errorf("own transport logger %v: the transport's event was logged %d times where it belongs, %d elsewhere",
					own, want.count("over MaxBody"), other.count("over MaxBody"))
			}
			if serverLogs.count("dabb: handler panic") != 1 || transportLogs.count("handler panic") != 0 {
				t.Errorf("own transport logger %v: the panic was logged %d times by the server, %d by its own transport logger, want 1 and 0",
					own, serverLogs.count("dabb: handler panic"), transportLogs.count("handler panic"))
			}
		}
	})
}

// TestKeptHandlerContext: a handler's context is cancelled with
// context.Canceled when ServeRPC returns, and dabb.IdempotencyKey(ctx)
// names the request it was made for. A handler that hands its context to
// work that outlives it (an audit log, a write-behind of the dedup record,
// via context.WithoutCancel) must see a done context and its own call's
// key while later calls run (a server that reused the context brought it
// back to life with the later call's key, racing with its decoding).
func TestKeptHandlerContext(t *testing.T) {
	p := newProbe()
	got := make(chan context.Context, 1)
	p.record = func(ctx context.Context) {
		select {
		case got <- ctx: // the first call's only
		default:
		}
	}
	_, addr := startServer(t, p)
	c := newClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if _, err := call(ctx, c, "key", proxy.IdempotencyKey("first")); err != nil {
		t.Fatal(err)
	}
	kept := <-got
	if kept.Err() == nil {
		t.Fatal("the handler's context is not done after the call")
	}
	// Work that outlives the handler keeps the request's values with
	// context.WithoutCancel (Go's way to detach work from a request).
	detached := context.WithoutCancel(kept)
	// While a later call runs, the kept context must still be done and
	// still name the first call.
	for i := range 20 {
		key := fmt.Sprintf("later-%d", i)
		done := make(chan error, 1)
		go func() {
			_, err := call(ctx, c, "sleep:100ms", proxy.IdempotencyKey(key))
			done <- err
		}()
		select {
		case <-p.started:
		case err := <-done:
			t.Fatalf("call %q ended before its handler started: %v", key, err)
		}
		k, err := dabb.IdempotencyKey(detached), kept.Err()
		if cerr := <-done; cerr != nil {
			t.Fatal(cerr)
		}
		if k != "first" {
			t.Fatalf("while call %q ran, the first call's context answered its key %q (Err %v): "+
				"work deduplicated with it would take the first call for the later one", key, k, err)
		}
		if err == nil {
			t.Fatalf("while call %q ran, the first call's (returned) context was no longer done", key)
		}
	}
}

// joined reports whether err is a multi-error (errors.Join's wrapper).
func joined(err error) bool {
	_, ok := err.(interface{ Unwrap() []error })
	return ok
}

// TestShutdownReturnsCtxErrItself: a Shutdown whose ctx ends before the
// drain returns ctx.Err() itself, as its doc says (and as net/http's
// Shutdown does), so err == context.DeadlineExceeded holds.
func TestShutdownReturnsCtxErrItself(t *testing.T) {
	p := newProbe()
	s, addr := startServer(t, p)
	c := newClient(t, addr)
	callDone := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		_, err := call(ctx, c, "block")
		callDone <- err
	}()
	select {
	case <-p.started:
	case err := <-callDone:
		t.Fatalf("call ended before its handler started: %v", err)
	case <-time.After(testTimeout):
		t.Fatal("the blocking call never reached its handler")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := s.Shutdown(ctx) // the handler runs until its context is cancelled
	select {
	case <-callDone:
	case <-time.After(testTimeout):
		t.Fatal("the call did not end after Shutdown closed the server")
	}
	if err != context.DeadlineExceeded { // the identity is the point
		t.Errorf("Shutdown = %v (%T), want context.DeadlineExceeded itself", err, err)
	}
}

// dubboFrame is a Dubbo consumer's request in serialization ser: the
// Dubbo version, the path, the service version, the method, the parameter
// types and the argument, as hessian2 strings.
func dubboFrame(id uint64, ser byte) []byte {
	var body []byte
	for _, s := range []string{"2.0.2", "org.example.Greeter", "0.0.0", "sayHello", "Ljava/lang/String;", "world"} {
		body = protocol.AppendHessianString(body, s)
	}
	var h protocol.Header
	h.Init(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, ser), 0, id)
	h.SetBodyLen(uint32(len(body)))
	return append(h[:], body...)
}

// TestDubboConsumerGets40 (#17): a Dubbo consumer's request reaches a
// dabb server. Its serialization is none of dabb's codecs, so it is
// answered 40 before its body is parsed (no "service 2.0.2 not found"),
// and the reason is written as Dubbo writes an error in the request's
// serialization: a hessian2 string for hessian2, a JSON string for
// fastjson. No handler runs; the server logs the peer once.
func TestDubboConsumerGets40(t *testing.T) {
	p := newProbe()
	logs := &logLines{}
	_, addr := startServer(t, p, dabb.WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	c, err := net.DialTimeout("tcp", addr, testTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(testTimeout))
	br := bufio.NewReader(c)
	for i, tt := range []struct {
		ser    byte
		decode func([]byte) (string, error)
	}{
		{protocol.Hessian2, func(b []byte) (string, error) {
			s, rest, err := protocol.DecodeHessianString(b)
			if err == nil && len(rest) != 0 {
				err = errors.New("bytes after the string")
			}
			return s, err
		}},
		{6, func(b []byte) (string, error) { // fastjson
			var s string
			return s, json.Unmarshal(b, &s)
		}},
	} {
		id := uint64(41 + i)
		if _, err := c.Write(dubboFrame(id, tt.ser)); err != nil {
			t.Fatal(err)
		}
		var h protocol.Header
		if _, err := io.ReadFull(br, h[:]); err != nil {
			t.Fatalf("serialization %d: reading the answer: %v", tt.ser, err)
		}
		body := make([]byte, h.BodyLen())
		if _, err := io.ReadFull(br, body); err != nil {
			t.Fatal(err)
		}
		if h.ID() != id || h.Status() != protocol.StatusBadRequest || h.Flags().Serialization() != tt.ser {
			t.Fatalf("serialization %d: answer id %d status %d serialization %d; want %d, 40, %d",
				tt.ser, h.ID(), h.Status(), h.Flags().Serialization(), id, tt.ser)
		}
		msg, err := tt.decode(body)
		if err != nil {
			t.Fatalf("serialization %d: the body %q does not decode: %v", tt.ser, body, err)
		}
		if !strings.Contains(msg, "dabb server") || strings.Contains(msg, "2.0.2") {
			t.Errorf("serialization %d: the answer says %q; want it to name dabb, not a service 2.0.2", tt.ser, msg)
		}
	}
	if n := logs.count("does not read"); n != 1 {
		t.Errorf("the server logged the Dubbo peer %d times, want once:\n%s", n, logs)
	}
	if n := p.ran.Load(); n != 0 {
		t.Errorf("a handler ran %d times for Dubbo requests", n)
	}
}

// TestClientOfADubboProvider (#17): a dabb client that reaches a Dubbo
// provider, which answers in hessian2, fails the call with a local 50
// saying the peer is not a dabb server and naming its serialization,
// instead of "connection lost".
func TestClientOfADubboProvider(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var h protocol.Header
		if _, err := io.ReadFull(c, h[:]); err != nil {
			return
		}
		if _, err := io.CopyN(io.Discard, c, int64(h.BodyLen())); err != nil {
			return
		}
		_, _ = c.Write(protocol.AppendForeignError(nil, h.ID(), protocol.Hessian2, protocol.StatusBadRequest,
			"Failed to decode request due to java.io.IOException"))
		_, _ = io.Copy(io.Discard, c) // until the client closes
	}()
	cl := newClient(t, l.Addr().String())
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	_, err = call(ctx, cl, "echo")
	pe := statusOf(t, err)
	if pe.Status != protocol.StatusBadResponse || !strings.Contains(pe.Error(), "not a dabb server") ||
		!strings.Contains(pe.Error(), "hessian2 (id 2)") {
		t.Fatalf("call to a Dubbo provider: %v; want 50 saying it is not a dabb server, naming hessian2 (id 2)", err)
	}
	cl.Close()
	<-done
}
