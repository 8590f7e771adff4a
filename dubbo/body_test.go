package dubbo

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/dabbrpc/dabb/protocol"
)

// DeductRequest is com.example.inventory.DeductRequest of the demo.
type DeductRequest struct {
	Sku       string
	Count     int32
	RequestId string //nolint:revive // the Java field is requestId
}

// DeductReply is com.example.inventory.DeductReply of the demo.
type DeductReply struct {
	Remaining int64
	Duplicate bool
}

const inventory = "com.example.inventory.InventoryService"

func init() {
	if err := RegisterPOJO("com.example.inventory.DeductRequest", &DeductRequest{}); err != nil {
		panic(err)
	}
	if err := RegisterPOJO("com.example.inventory.DeductReply", DeductReply{}); err != nil {
		panic(err)
	}
}

// golden returns the body of a frame in testdata/golden, which dubbo-go's
// encoder wrote (testdata/dubbogo/golden).
func golden(t testing.TB, name string) (header, body []byte) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "golden", name+".bin"))
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 16 || b[0] != 0xda || b[1] != 0xbb || b[2]&0x1f != 2 {
		t.Fatalf("%s: not a hessian2 Dubbo frame: % x", name, b[:min(len(b), 16)])
	}
	return b[:16], b[16:]
}

func TestDecodeRequestGolden(t *testing.T) {
	wantAttachments := func(version string) map[string]any {
		return map[string]any{
			"interface": inventory, "path": inventory, "timeout": "3000", "trace": "t-1", "version": version,
		}
	}
	cases := []struct {
		name string
		want *Request
	}{
		{"request_deduct", &Request{
			DubboVersion: "2.0.2", Path: inventory, Method: "deduct", ParamTypes: "JI",
			Args: []any{int64(10086), int32(3)}, Attachments: wantAttachments(""),
		}},
		{"request_deduct_once", &Request{
			DubboVersion: "2.0.2", Path: inventory, Version: "1.0.0", Method: "deductOnce",
			ParamTypes:  "Lcom/example/inventory/DeductRequest;",
			Args:        []any{&DeductRequest{Sku: "10086", Count: 2, RequestId: "r-1"}},
			Attachments: wantAttachments("1.0.0"),
		}},
		{"request_invoke", &Request{
			DubboVersion: "2.0.2", Path: inventory, Method: "$invoke",
			ParamTypes:  "Ljava/lang/String;[Ljava/lang/String;Ljava/util/List;",
			Args:        []any{"stock", []string{"long"}, []any{int64(10086)}},
			Attachments: wantAttachments(""),
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			header, body := golden(t, c.name)
			if header[2]&0x80 == 0 {
				t.Fatalf("header % x is not a request's", header)
			}
			got, err := DecodeRequest(body, Limits{})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("decoded\n%#v\nwant\n%#v", got, c.want)
			}
		})
	}
}

func TestDecodeResponseGolden(t *testing.T) {
	withVersion := map[string]any{"dubbo": "2.0.2", "k": "v"}
	cases := []struct {
		name string
		want *Response
	}{
		{"response_value", &Response{Value: true, Attachments: withVersion}},
		{"response_value_plain", &Response{Value: int64(999997)}},
		{"response_pojo", &Response{Value: &DeductReply{Remaining: 999998, Duplicate: true}, Attachments: withVersion}},
		{"response_null", &Response{Attachments: withVersion}},
		{"response_exception", &Response{
			Exception:   &Exception{Class: IllegalArgumentException, Message: "unknown sku 42"},
			Attachments: withVersion,
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			header, body := golden(t, c.name)
			if header[3] != 20 {
				t.Fatalf("status %d, want 20", header[3])
			}
			// dubbo-go ends every response body with one more null.
			if body[len(body)-1] != 'N' {
				t.Fatalf("body does not end in the null dubbo-go appends: % x", body)
			}
			got, err := DecodeResponse(body, Limits{})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("decoded\n%#v\nwant\n%#v", got, c.want)
			}
		})
	}
	t.Run("response_error_status", func(t *testing.T) {
		header, body := golden(t, "response_error_status")
		if header[3] != 70 {
			t.Fatalf("status %d, want 70", header[3])
		}
		msg, err := DecodeErrorMessage(body, Limits{})
		if err != nil {
			t.Fatal(err)
		}
		if want := "Not found exported service: com.example.Missing:20880"; msg != want {
			t.Fatalf("message %q, want %q", msg, want)
		}
	})
}

func TestRequestRoundTrip(t *testing.T) {
	in := &Request{
		Path: inventory, Method: "deductOnce",
		Args:        []any{&DeductRequest{Sku: "日本", Count: 7, RequestId: strings.Repeat("x", 2000)}},
		Attachments: map[string]any{"timeout": "250", "group": "g"},
	}
	body, err := AppendRequest([]byte("prefix"), in)
	if err != nil {
		t.Fatal(err)
	}
	if string(body[:6]) != "prefix" {
		t.Fatalf("AppendRequest lost dst: %q", body[:6])
	}
	got, err := DecodeRequest(append(body[6:], 'N', 'N'), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	want := *in
	want.DubboVersion = DubboVersion
	want.ParamTypes = "Lcom/example/inventory/DeductRequest;"
	if !reflect.DeepEqual(got, &want) {
		t.Fatalf("decoded\n%#v\nwant\n%#v", got, &want)
	}
}

func TestResponseRoundTrip(t *testing.T) {
	cases := []*Response{
		{Value: int64(-1)},
		{Value: "ok", Attachments: map[string]any{"dubbo": "2.0.2"}},
		{},
		{Attachments: map[string]any{}},
		{Value: &DeductReply{Remaining: 1 << 40}, Attachments: map[string]any{}},
		{Exception: &Exception{Class: RuntimeException, Message: "boom"}},
		{Exception: &Exception{Class: "com.example.OutOfStock", Message: "sku 1"}, Attachments: map[string]any{}},
		{Exception: NewGenericException(IllegalArgumentException, "count 0"), Attachments: map[string]any{}},
	}
	for _, in := range cases {
		body, err := AppendResponse(nil, in)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeResponse(body, Limits{})
		if err != nil {
			t.Fatalf("%+v: %v", in, err)
		}
		if !reflect.DeepEqual(got, in) {
			t.Fatalf("decoded\n%#v %+v\nwant\n%#v %+v", got, got.Exception, in, in.Exception)
		}
	}
	if got := NewGenericException(IllegalArgumentException, "count 0").Error(); got !=
		"org.apache.dubbo.rpc.service.GenericException: java.lang.IllegalArgumentException: count 0" {
		t.Fatalf("GenericException text %q", got)
	}
}

func TestErrorMessageRoundTrip(t *testing.T) {
	body := AppendErrorMessage(nil, "No such method stock2 in service "+inventory)
	msg, err := DecodeErrorMessage(body, Limits{})
	if err != nil || msg != "No such method stock2 in service "+inventory {
		t.Fatalf("got %q, %v", msg, err)
	}
}

func TestAppendRequestRefuses(t *testing.T) {
	if _, err := AppendRequest(nil, &Request{Method: "m", ParamTypes: "J", Args: []any{int64(1), int64(2)}}); !errors.Is(err, ErrDescriptor) {
		t.Fatalf("2 arguments for descriptor J: %v, want ErrDescriptor", err)
	}
	type unregistered struct{ A int }
	if _, err := AppendRequest(nil, &Request{Method: "m", Args: []any{unregistered{}}}); !errors.Is(err, ErrUnknownClass) {
		t.Fatalf("unregistered struct: %v, want ErrUnknownClass", err)
	}
	if _, err := AppendResponse(nil, &Response{Exception: &Exception{Class: "not a class"}}); err == nil {
		t.Fatal("exception class with spaces encoded")
	}
}

// hessianString encodes s as a short hessian2 string.
func hessianString(s string) []byte {
	if len(s) < 32 {
		return append([]byte{byte(len(s))}, s...)
	}
	return append([]byte{0x30 | byte(len(s)>>8), byte(len(s))}, s...)
}

// requestHead is a request body's five leading strings.
func requestHead(desc string) []byte {
	var b []byte
	for _, s := range []string{"2.0.2", inventory, "", "deduct", desc} {
		b = append(b, hessianString(s)...)
	}
	return b
}

func TestDecodeRequestRefuses(t *testing.T) {
	_, valid := golden(t, "request_deduct")
	cases := []struct {
		name string
		body []byte
		want error
	}{
		{"empty", nil, ErrMalformed},
		{"truncated", valid[:len(valid)-3], ErrTooLarge}, // inside a string
		{"bad tag", append(requestHead("J"), 0x40), ErrMalformed},
		{"header not a string", append([]byte{0x91}, valid...), ErrMalformed},
		{"bad descriptor", append(requestHead("Q"), 'H', 'Z'), ErrDescriptor},
		{"fewer arguments than the descriptor", append(requestHead("JI"), 0xe0, 'H', 'Z'), ErrDescriptor},
		{"more arguments than the descriptor", append(requestHead("J"), 0xe0, 0xe1, 'H', 'Z'), ErrDescriptor},
		{"argument of another type", append(requestHead("J"), 0x91, 'H', 'Z'), ErrDescriptor},
		// 'X' then int 0x7fffffff: a list of 2^31-1 elements in a few bytes.
		{"list longer than the body", append(requestHead("Ljava/util/List;"), 'X', 'I', 0x7f, 0xff, 0xff, 0xff, 'H', 'Z'), ErrTooLarge},
		{"string longer than the body", append(requestHead("Ljava/lang/String;"), 'S', 0xff, 0xff, 'a'), ErrTooLarge},
		{"negative list", append(requestHead("Ljava/util/List;"), 'X', 0x8f, 'H', 'Z'), ErrTooLarge},
		{"deep nesting", append(requestHead("Ljava/util/List;"), []byte(strings.Repeat("\x79", 200)+"N")...), ErrTooLarge},
		{"unknown class", append(append(requestHead("Lcom/example/Evil;"), 'C'), append(hessianString("com.example.Evil"), 0x91, 1, 'a', 0x60, 'N', 'H', 'Z')...), ErrUnknownClass},
		// The hessian2 library panics setting a long into the string
		// field sku; the panic is recovered into an error.
		{"field of another type", append(append(requestHead("Lcom/example/inventory/DeductRequest;"), 'C'),
			append(hessianString("com.example.inventory.DeductRequest"),
				0x93, 3, 's', 'k', 'u', 5, 'c', 'o', 'u', 'n', 't', 9, 'r', 'e', 'q', 'u', 'e', 's', 't', 'I', 'd',
				0x60, 0xe0, 0x91, 'N', 'H', 'Z')...), ErrMalformed},
		{"object before its class", append(requestHead("Lcom/example/Evil;"), 0x60, 'H', 'Z'), ErrMalformed},
		{"attachment key not a string", append(requestHead(""), 'H', 0x91, 0x91, 'Z'), ErrDescriptor},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := DecodeRequest(c.body, Limits{})
			if !errors.Is(err, c.want) {
				t.Fatalf("DecodeRequest = %+v, %v; want an error matching %v", r, err, c.want)
			}
			if c.name == "field of another type" && !strings.Contains(err.Error(), "panicked") {
				t.Fatalf("%v: the library did not panic; this case no longer tests the recover", err)
			}
		})
	}
}

func TestDecodeResponseRefuses(t *testing.T) {
	cases := []struct {
		name string
		body []byte
		want error
	}{
		{"empty", nil, ErrMalformed},
		{"flag not an int", []byte{'N'}, ErrMalformed},
		{"flag out of range", []byte{0x96}, ErrMalformed},
		{"value missing", []byte{0x91}, ErrMalformed},
		{"attachments missing", []byte{0x94, 'T'}, ErrMalformed},
		{"attachments not a map", []byte{0x94, 'T', 'T'}, ErrMalformed},
		{"exception not a throwable", []byte{0x90, 'T'}, ErrMalformed},
		{"binary longer than the body", []byte{0x91, 'B', 0xff, 0xff, 1}, ErrMalformed},
		{"map never ends", []byte{0x91, 'H', 0x91, 0x91}, ErrMalformed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := DecodeResponse(c.body, Limits{})
			if !errors.Is(err, c.want) {
				t.Fatalf("DecodeResponse = %+v, %v; want an error matching %v", r, err, c.want)
			}
		})
	}
	if _, err := DecodeErrorMessage([]byte{0x91}, Limits{}); !errors.Is(err, ErrMalformed) {
		t.Fatalf("error message of an int: %v, want ErrMalformed", err)
	}
}

func TestLimitsMaxDepth(t *testing.T) {
	// Ten nested one-element lists around a null.
	body := append(requestHead("Ljava/util/List;"), []byte(strings.Repeat("\x79", 10)+"N"+"H"+"Z")...)
	if _, err := DecodeRequest(body, Limits{MaxDepth: 10}); err != nil {
		t.Fatalf("depth 10 within MaxDepth 10: %v", err)
	}
	if _, err := DecodeRequest(body, Limits{MaxDepth: 9}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("depth 10 past MaxDepth 9: %v, want ErrTooLarge", err)
	}
}

func FuzzDecode(f *testing.F) {
	entries, err := os.ReadDir(filepath.Join("testdata", "golden"))
	if err != nil {
		f.Fatal(err)
	}
	for _, e := range entries {
		_, body := golden(f, strings.TrimSuffix(e.Name(), ".bin"))
		f.Add(body)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		// Neither may panic or hang; a body that decodes re-encodes.
		if r, err := DecodeRequest(body, Limits{}); err == nil {
			if _, err := AppendRequest(nil, r); err != nil && !errors.Is(err, ErrDescriptor) && !errors.Is(err, ErrUnknownClass) {
				t.Fatalf("decoded request %+v does not encode: %v", r, err)
			}
		}
		if r, err := DecodeResponse(body, Limits{}); err == nil {
			if _, err := AppendResponse(nil, r); err != nil {
				t.Fatalf("decoded response %+v does not encode: %v", r, err)
			}
		}
		_, _ = DecodeErrorMessage(body, Limits{})
		// The body format and the codec, as a server and a client meet it.
		for _, h := range []struct {
			f protocol.Flags
			s protocol.Status
		}{
			{protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, Hessian2ID), 0},
			{protocol.MakeFlags(0, Hessian2ID), protocol.StatusOK},
			{protocol.MakeFlags(0, Hessian2ID), protocol.StatusBadRequest},
		} {
			var m protocol.Message
			m.Header.Init(h.f, h.s, 1)
			_ = Format{}.DecodeBody(&m, append([]byte(nil), body...))
		}
		var a Args
		_ = Codec{}.Unmarshal(body, &a)
	})
}

func TestSupportsResponseAttachments(t *testing.T) {
	for v, want := range map[string]bool{
		"2.0.2": true, "2.0.3": true, "2.0.99": true, "2.0.2.0": true,
		"": false, "2.0.0": false, "2.0.1": false, "2.6.2": false, "3.0.0": false, "x": false, "2.0.100": false,
	} {
		if got := SupportsResponseAttachments(v); got != want {
			t.Errorf("SupportsResponseAttachments(%q) = %v, want %v", v, got, want)
		}
	}
}

func TestExceptionClassesBounded(t *testing.T) {
	exceptionClasses.Lock()
	saved := exceptionClasses.names
	full := map[string]bool{}
	for k := range saved {
		full[k] = true
	}
	for i := 0; len(full) < maxExceptionClasses; i++ {
		full[fmt.Sprintf("com.example.Filler%d", i)] = true
	}
	exceptionClasses.names = full
	exceptionClasses.Unlock()
	defer func() {
		exceptionClasses.Lock()
		exceptionClasses.names = saved
		exceptionClasses.Unlock()
	}()
	body, err := AppendResponse(nil, &Response{Exception: &Exception{Class: "com.example.OneTooMany", Message: "m"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := DecodeResponse(body, Limits{}); !errors.Is(err, ErrUnknownClass) {
		t.Fatalf("an exception class past the bound: %v, want ErrUnknownClass", err)
	}
	body, err = AppendResponse(nil, &Response{Exception: &Exception{Class: "com.example.Filler0", Message: "m"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := DecodeResponse(body, Limits{}); err != nil {
		t.Fatalf("a class seen before: %v", err)
	}
}
