package json_test

import (
	"bytes"
	stdjson "encoding/json"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/dabbrpc/dabb/codec"
	dabbjson "github.com/dabbrpc/dabb/codec/json"
)

type deduct struct {
	SKU       string             `json:"sku"`
	Count     int32              `json:"count"`
	RequestID string             `json:"request_id,omitempty"`
	Raw       stdjson.RawMessage `json:"raw,omitempty"`
	Blob      []byte             `json:"blob,omitempty"`
}

func TestRegistered(t *testing.T) {
	byID, err := codec.ByID(16)
	if err != nil {
		t.Fatalf("ByID(16): %v", err)
	}
	if byID.Name() != "json" || byID.ID() != dabbjson.ID {
		t.Errorf("ByID(16) = %q id %d, want \"json\" id 16", byID.Name(), byID.ID())
	}
	byName, err := codec.ByName("json")
	if err != nil {
		t.Fatalf(`ByName("json"): %v`, err)
	}
	if byName.ID() != 16 {
		t.Errorf(`ByName("json").ID() = %d, want 16`, byName.ID())
	}
}

func TestMarshal(t *testing.T) {
	tests := []struct {
		name string
		in   any
		want string
	}{
		{"struct", deduct{SKU: "sku-42", Count: 2, RequestID: "r-1"}, `{"sku":"sku-42","count":2,"request_id":"r-1"}`},
		{"map", map[string]int{"b": 2, "a": 1}, `{"a":1,"b":2}`},
		{"string", "R", `"R"`},
		{"nil", nil, `null`},
		{"slice", []int64{1, -2}, `[1,-2]`},
	}
	var c dabbjson.Codec
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := c.Marshal([]byte("prefix:"), tt.in)
			if err != nil {
				t.Fatalf("Marshal: %v", err)
			}
			if want := "prefix:" + tt.want; string(got) != want {
				t.Errorf("Marshal = %s, want %s (appended, no newline)", got, want)
			}
		})
	}
}

func TestRoundTrip(t *testing.T) {
	var c dabbjson.Codec
	in := deduct{SKU: "sku-42", Count: 2, RequestID: "r-1", Raw: stdjson.RawMessage(`{"x":[1,2]}`), Blob: []byte{0, 1, 0xff}}
	b, err := c.Marshal(nil, in)
	if err != nil {
		t.Fatalf("Marshal: %v", err)
	}
	var out deduct
	if err := c.Unmarshal(b, &out); err != nil {
		t.Fatalf("Unmarshal: %v", err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Errorf("round trip: got %+v, want %+v", out, in)
	}
}

// A Gson writer ends each value with a newline.
func TestUnmarshalTrailingNewline(t *testing.T) {
	var c dabbjson.Codec
	var out deduct
	if err := c.Unmarshal([]byte("{\"sku\":\"a\",\"count\":3}\n"), &out); err != nil {
		t.Fatalf("Unmarshal: %v", err)
	}
	if out.SKU != "a" || out.Count != 3 {
		t.Errorf("got %+v", out)
	}
}

// The transport reuses a payload buffer once Unmarshal returns.
func TestUnmarshalDoesNotAlias(t *testing.T) {
	var c dabbjson.Codec
	data := []byte(`{"sku":"sku-42","raw":{"k":"v"},"blob":"AAH/"}`)
	var out deduct
	if err := c.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	for i := range data {
		data[i] = ' '
	}
	if out.SKU != "sku-42" || string(out.Raw) != `{"k":"v"}` || !bytes.Equal(out.Blob, []byte{0, 1, 0xff}) {
		t.Errorf("decoded value changed with the buffer: %+v", out)
	}
}

func TestErrors(t *testing.T) {
	var c dabbjson.Codec
	t.Run("marshal unsupported", func(t *testing.T) {
		dst := []byte("keep")
		got, err := c.Marshal(dst, make(chan int))
		var ute *stdjson.UnsupportedTypeError
		if !errors.As(err, &ute) {
			t.Fatalf("err = %v, want a wrapped *json.UnsupportedTypeError", err)
		}
		if !strings.Contains(err.Error(), "chan int") || !strings.HasPrefix(err.Error(), "codec/json: ") {
			t.Errorf("err %q lacks context", err)
		}
		if string(got) != "keep" {
			t.Errorf("Marshal returned %q on error, want dst unchanged", got)
		}
	})
	t.Run("marshal NaN", func(t *testing.T) {
		if _, err := c.Marshal(nil, math.NaN()); err == nil {
			t.Fatal("Marshal(NaN) succeeded")
		}
	})
	tests := []struct {
		name string
		data string
		into any
	}{
		{"syntax", `{"sku":`, &deduct{}},
		{"empty", ``, &deduct{}},
		{"type mismatch", `{"count":"two"}`, &deduct{}},
		{"non-pointer", `{}`, deduct{}},
		{"nil", `{}`, nil},
	}
	for _, tt := range tests {
		t.Run("unmarshal "+tt.name, func(t *testing.T) {
			err := c.Unmarshal([]byte(tt.data), tt.into)
			if err == nil {
				t.Fatal("Unmarshal succeeded")
			}
			if !strings.HasPrefix(err.Error(), "codec/json: unmarshal into ") {
				t.Errorf("err %q lacks context", err)
			}
		})
	}
}

// TestUnmarshalStrict: UnmarshalStrict refuses a member the type lacks,
// at any depth, naming it, and otherwise decodes and fails as Unmarshal.
func TestUnmarshalStrict(t *testing.T) {
	var c dabbjson.Codec
	type line struct {
		Item deduct `json:"item"`
	}
	for _, tt := range []struct {
		name, data, field string
		into              any
	}{
		{"top", `{"sku":"a","skux":"b"}`, `"skux"`, &deduct{}},
		{"nested", `{"item":{"sku":"a","cnt":1}}`, `"cnt"`, &line{}},
		{"in a list", `[{"sku":"a"},{"sku":"b","x":null}]`, `"x"`, &[]deduct{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := c.Unmarshal([]byte(tt.data), tt.into); err != nil {
				t.Fatalf("Unmarshal: %v, want the member ignored", err)
			}
			err := c.UnmarshalStrict([]byte(tt.data), tt.into)
			if err == nil || !strings.Contains(err.Error(), "unknown field "+tt.field) ||
				!strings.HasPrefix(err.Error(), "codec/json: unmarshal into ") {
				t.Errorf("UnmarshalStrict: %v, want an error naming %s", err, tt.field)
			}
		})
	}
	t.Run("as Unmarshal", func(t *testing.T) {
		for _, data := range []string{
			`{"sku":"a","count":3}`, "{\"SKU\":\"a\",\"count\":3}\n", `{"sku":"a","raw":{"any":"thing"}}`, `null`,
		} {
			var strict, lax deduct
			if err := c.UnmarshalStrict([]byte(data), &strict); err != nil {
				t.Errorf("%q: %v", data, err)
			}
			if err := c.Unmarshal([]byte(data), &lax); err != nil || !reflect.DeepEqual(strict, lax) {
				t.Errorf("%q: strict %+v, lax %+v (%v)", data, strict, lax, err)
			}
		}
		var m map[string]any
		if err := c.UnmarshalStrict([]byte(`{"any":1}`), &m); err != nil || m["any"] != 1.0 {
			t.Errorf("into a map: %v %v, want every member kept", m, err)
		}
	})
	for _, tt := range []struct {
		name, data string
		into       any
	}{
		{"syntax", `{"sku":`, &deduct{}},
		{"empty", ``, &deduct{}},
		{"blank", " \n", &deduct{}},
		{"trailing", `{"sku":"a"} {}`, &deduct{}},
		{"trailing text", `{"sku":"a"}x`, &deduct{}},
		{"type mismatch", `{"count":"two"}`, &deduct{}},
		{"non-pointer", `{}`, deduct{}},
		{"nil", `{}`, nil},
	} {
		t.Run("error "+tt.name, func(t *testing.T) {
			lax := c.Unmarshal([]byte(tt.data), tt.into)
			err := c.UnmarshalStrict([]byte(tt.data), tt.into)
			if err == nil || lax == nil || err.Error() != lax.Error() {
				t.Errorf("UnmarshalStrict: %v; want Unmarshal's error, %v", err, lax)
			}
		})
	}
}

// TestStrict: the registered JSON codec is a codec.Strict, the server's
// cue to decode requests with UnmarshalStrict.
func TestStrict(t *testing.T) {
	c, err := codec.ByID(dabbjson.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := c.(codec.Strict); !ok {
		t.Errorf("%T is not a codec.Strict", c)
	}
}

func BenchmarkMarshal(b *testing.B) {
	var c dabbjson.Codec
	v := deduct{SKU: "sku-42", Count: 2, RequestID: "r-1"}
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		buf, _ = c.Marshal(buf[:0], v)
	}
}

func BenchmarkUnmarshal(b *testing.B) {
	var c dabbjson.Codec
	data := []byte(`{"sku":"sku-42","count":2,"request_id":"r-1"}`)
	var v deduct
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Unmarshal(data, &v); err != nil {
			b.Fatal(err)
		}
	}
}
