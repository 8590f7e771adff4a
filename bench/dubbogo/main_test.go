package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestParseRun reads run commands: the fields in order, and a clear
// error for a wrong count, a bad number or no goroutines.
func TestParseRun(t *testing.T) {
	s, err := parseRun(strings.Fields("16 2 0 1048000 250000000 4000000000"))
	if err != nil {
		t.Fatal(err)
	}
	want := runSpec{c: 16, large: 2, pad: 0, largePad: 1048000, warmup: 250 * time.Millisecond, duration: 4 * time.Second}
	if s != want {
		t.Fatalf("parseRun = %+v, want %+v", s, want)
	}
	for _, bad := range []string{"16 2 0", "x 2 0 0 1 1", "0 0 0 0 1 1", "1 0 0 0 1 0", "-1 0 0 0 1 1"} {
		if _, err := parseRun(strings.Fields(bad)); err == nil || !strings.HasPrefix(err.Error(), "run") {
			t.Errorf("parseRun(%q) = %v, want an error that names run", bad, err)
		}
	}
}

// TestHistogramText checks the text form of bench/hist's buckets: exact
// below 128 ns, the middle of a bucket above, the exact maximum first.
// hist's TestText reads the same text into the same histogram.
func TestHistogramText(t *testing.T) {
	var h histogram
	for _, d := range []time.Duration{100, 100, 1000, 1003, 1234567891} {
		h.record(d)
	}
	// 1000 and 1003 ns share the bucket [1000, 1008) of width 8, whose
	// middle is 1004.
	if got, want := h.String(), "1234567891 100:2 1004:2 1233125376:1"; got != want {
		t.Fatalf("text %q, want %q", got, want)
	}
	var o histogram
	o.merge(&h)
	o.record(-time.Second) // counts as zero
	if got := o.String(); !strings.HasPrefix(got, "1234567891 0:1 100:2 ") {
		t.Fatalf("merged text %q", got)
	}
}

// TestCheck accepts the server's answer and refuses a reply that is not.
func TestCheck(t *testing.T) {
	req := newMessage(100)
	if len(req.Padding) != 100 || req.Field22 != 100000 || req.Field129 != text || len(text) != 54 {
		t.Fatalf("newMessage(100): padding %d, field22 %d, field129 %d bytes", len(req.Padding), req.Field22, len(req.Field129))
	}
	reply := *req
	reply.Field1, reply.Field2 = "OK", 100
	if err := check(req, &reply); err != nil {
		t.Fatal(err)
	}
	for name, bad := range map[string]func(m *BenchmarkMessage){
		"not answered": func(m *BenchmarkMessage) { m.Field1 = text },
		"field3":       func(m *BenchmarkMessage) { m.Field3++ },
		"padding":      func(m *BenchmarkMessage) { m.Padding = nil },
	} {
		r := reply
		bad(&r)
		if err := check(req, &r); err == nil {
			t.Errorf("%s: check = nil, want an error", name)
		}
	}
	if err := check(req, nil); err == nil {
		t.Error("check(nil) = nil, want an error")
	}
}

// TestCommands answers sample, refuses an unknown command, and ends
// when stdin closes.
func TestCommands(t *testing.T) {
	var out bytes.Buffer
	err := commands(strings.NewReader("sample\n\nbogus\n"), &lines{w: &out, prefix: "p"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(got) != 2 || len(strings.Fields(got[0])) != 5 || !strings.HasPrefix(got[0], "p sample ") ||
		got[1] != `p error unknown command "bogus"` {
		t.Fatalf("output %q", got)
	}
}
