package dubbo

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// nest is a recursive Go type.
type nest []nest

func TestConvert(t *testing.T) {
	type ptrs struct{ P *int64 }
	cyclic := []any{nil}
	cyclic[0] = cyclic // as a hessian2 reference can make a list
	for _, tc := range []struct {
		name string
		v    any
		to   any // a value of the target type
		want string
		err  string
	}{
		{"int widens", int32(7), int64(0), "7", ""},
		{"long narrows when it fits", int64(7), int32(0), "7", ""},
		{"long overflows int", int64(1 << 40), int32(0), "", "overflows"},
		{"int to Go int", int32(-3), 0, "-3", ""},
		{"double to float32", 1.5, float32(0), "1.5", ""},
		{"long to double", int64(2), 0.0, "2", ""},
		{"string for long", "x", int64(0), "", "a string for a int64"},
		{"null for long", nil, int64(0), "", "null for a int64"},
		{"null for a pointer", nil, (*DeductRequest)(nil), "<nil>", ""},
		{"list to []int64", []any{int32(1), int64(2)}, []int64(nil), "[1 2]", ""},
		{"list element mismatch", []any{"x"}, []int64(nil), "", "element 0"},
		{"map to map", map[any]any{"a": int32(1)}, map[string]int64(nil), "map[a:1]", ""},
		{"map to POJO", map[any]any{"class": "com.example.inventory.DeductRequest", "sku": "s", "count": int32(2), "other": 1},
			(*DeductRequest)(nil), "&{Sku:s Count:2 RequestId:}", ""},
		{"map of another class", map[string]any{"class": "com.x.Y"}, (*DeductRequest)(nil), "", "class com.x.Y"},
		{"POJO to struct", &DeductReply{Remaining: 3}, DeductReply{}, "{Remaining:3 Duplicate:false}", ""},
		{"pointer to long", int32(4), ptrs{}.P, "4", ""},
		{"any keeps", "x", any(nil), "x", ""},
		{"cyclic list into a recursive type", cyclic, nest(nil), "", "nested deeper than"},
	} {
		var typ reflect.Type
		if tc.to == nil {
			typ = reflect.TypeOf((*any)(nil)).Elem()
		} else {
			typ = reflect.TypeOf(tc.to)
		}
		got, err := convert(tc.v, typ)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: convert = %v, %v; want an error with %q", tc.name, got, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		s := fmt.Sprintf("%+v", got.Interface())
		if got.Kind() == reflect.Pointer && !got.IsNil() && got.Elem().Kind() != reflect.Struct {
			s = fmt.Sprint(got.Elem().Interface())
		}
		if got.Type() != typ || s != tc.want {
			t.Errorf("%s: %s (%v), want %s (%v)", tc.name, s, got.Type(), tc.want, typ)
		}
	}
}

func TestGeneralize(t *testing.T) {
	got := generalize(reflect.ValueOf([]*DeductReply{{Remaining: 1}, nil}))
	want := "[map[class:com.example.inventory.DeductReply duplicate:false remaining:1] <nil>]"
	if fmt.Sprint(got) != want {
		t.Errorf("generalize = %v, want %s", got, want)
	}
	if got := generalize(reflect.ValueOf(map[string]*DeductReply{"a": nil})); fmt.Sprint(got) != "map[a:<nil>]" {
		t.Errorf("generalize of a map = %v", got)
	}
}
