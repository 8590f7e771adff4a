package dubbo

import (
	"errors"
	"reflect"
	"testing"
	"time"
)

func TestParseDescMakeDesc(t *testing.T) {
	cases := []struct {
		desc  string
		types []string
	}{
		{"", nil},
		{"JI", []string{"long", "int"}},
		{"ZBCSIJFD", []string{"boolean", "byte", "char", "short", "int", "long", "float", "double"}},
		{"Ljava/lang/String;", []string{"java.lang.String"}},
		{"Lcom/example/inventory/DeductRequest;", []string{"com.example.inventory.DeductRequest"}},
		{"[I[[Ljava/lang/String;J", []string{"int[]", "java.lang.String[][]", "long"}},
		{"Ljava/lang/String;[Ljava/lang/String;[Ljava/lang/Object;", []string{"java.lang.String", "java.lang.String[]", "java.lang.Object[]"}},
	}
	for _, c := range cases {
		got, err := ParseDesc(c.desc)
		if err != nil || !reflect.DeepEqual(got, c.types) {
			t.Fatalf("ParseDesc(%q) = %q, %v; want %q", c.desc, got, err, c.types)
		}
		desc, err := MakeDesc(c.types...)
		if err != nil || desc != c.desc {
			t.Fatalf("MakeDesc(%q) = %q, %v; want %q", c.types, desc, err, c.desc)
		}
	}
	for _, bad := range []string{"Q", "[", "L;", "Ljava/lang/String", "JX"} {
		if types, err := ParseDesc(bad); !errors.Is(err, ErrDescriptor) {
			t.Fatalf("ParseDesc(%q) = %q, %v; want ErrDescriptor", bad, types, err)
		}
	}
	for _, bad := range []string{"", "java/lang/String", "int]", "a b", "[]"} {
		if desc, err := MakeDesc(bad); !errors.Is(err, ErrDescriptor) {
			t.Fatalf("MakeDesc(%q) = %q, %v; want ErrDescriptor", bad, desc, err)
		}
	}
}

func TestJavaTypeAndDescOf(t *testing.T) {
	n := int32(1)
	desc, err := DescOf(true, int8(1), int16(1), int32(1), int64(1), 1, float32(1), 1.0, "s",
		[]byte("b"), []any{1}, []string{"a"}, map[string]any{}, time.Time{}, &n,
		&DeductRequest{}, DeductReply{})
	want := "ZBSIJJFDLjava/lang/String;[BLjava/util/List;[Ljava/lang/String;Ljava/util/Map;Ljava/util/Date;" +
		"Ljava/lang/Integer;Lcom/example/inventory/DeductRequest;Lcom/example/inventory/DeductReply;"
	if err != nil || desc != want {
		t.Fatalf("DescOf = %q, %v; want %q", desc, err, want)
	}
	if _, err := DescOf(nil); !errors.Is(err, ErrDescriptor) {
		t.Fatalf("DescOf(nil): %v, want ErrDescriptor", err)
	}
	if _, err := JavaType(reflect.TypeOf(make(chan int))); !errors.Is(err, ErrDescriptor) {
		t.Fatalf("JavaType(chan): %v, want ErrDescriptor", err)
	}
}

func TestRegisterPOJO(t *testing.T) {
	if err := RegisterPOJO("com.example.inventory.DeductRequest", DeductRequest{}); err != nil {
		t.Fatalf("registering the same type again: %v", err)
	}
	type other struct{ X int32 }
	if err := RegisterPOJO("com.example.inventory.DeductRequest", other{}); err == nil {
		t.Fatal("a second type under a registered class was accepted")
	}
	if err := RegisterPOJO("com.example.Other", &DeductRequest{}); err == nil {
		t.Fatal("a registered type under a second class was accepted")
	}
	for _, bad := range []any{nil, 1, "x"} {
		if err := RegisterPOJO("com.example.Bad", bad); err == nil {
			t.Fatalf("RegisterPOJO(%T) accepted a non-struct", bad)
		}
	}
	if err := RegisterPOJO("int", other{}); err == nil {
		t.Fatal("RegisterPOJO accepted a primitive's name")
	}
}
