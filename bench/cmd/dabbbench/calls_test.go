package main

import (
	"bytes"
	"errors"
	"net"
	"testing"

	"github.com/dabbrpc/dabb/bench/frameworks"
)

// TestCallsMain makes a fixed count of calls to each raw reference's
// server and to dabb's, and refuses bad flags, an address nobody serves
// and a server of another framework.
func TestCallsMain(t *testing.T) {
	for _, name := range []string{"dabb", "raw", "raw-conn"} {
		t.Run(name, func(t *testing.T) {
			f, err := frameworks.Lookup(name)
			if err != nil {
				t.Fatal(err)
			}
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv, err := f.Serve(l)
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			var out bytes.Buffer
			if err := callsMain([]string{"-calls", "25", "-framework", name, "-addr", l.Addr().String()}, &out); err != nil {
				t.Fatal(err)
			}
			if got := out.String(); got != "calls 25\n" {
				t.Errorf("stdout = %q, want %q", got, "calls 25\n")
			}
		})
	}

	// An address with no server: a listener closed at once.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	dabbL, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dabbSrv, err := frameworks.Dabb().Serve(dabbL)
	if err != nil {
		t.Fatal(err)
	}
	defer dabbSrv.Close()
	for _, tc := range []struct {
		name  string
		args  []string
		usage bool
	}{
		{"no address", []string{"-calls", "5", "-framework", "raw"}, true},
		{"no calls", []string{"-calls", "0", "-framework", "raw", "-addr", dead}, true},
		{"too many calls", []string{"-calls", "100000001", "-framework", "raw", "-addr", dead}, true},
		{"unknown framework", []string{"-calls", "5", "-framework", "thrift", "-addr", dead}, true},
		{"extra argument", []string{"-calls", "5", "-framework", "raw", "-addr", dead, "more"}, true},
		{"nobody serves", []string{"-calls", "5", "-framework", "raw-conn", "-addr", dead}, false},
		{"another framework", []string{"-calls", "5", "-framework", "raw-conn", "-addr", dabbL.Addr().String()}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := callsMain(tc.args, &out)
			if err == nil {
				t.Fatal("callsMain succeeded")
			}
			if errors.Is(err, ErrUsage) != tc.usage {
				t.Errorf("callsMain(%q) = %v; want ErrUsage: %v", tc.args, err, tc.usage)
			}
			t.Log(err)
			if out.Len() != 0 {
				t.Errorf("stdout = %q, want nothing", out.String())
			}
		})
	}
}

func TestCallsMode(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"-calls", "5"}, true},
		{[]string{"-framework", "raw", "--calls=5"}, true},
		{[]string{"-calls=5"}, true},
		{[]string{"-frameworks", "raw"}, false},
		{[]string{"-callsx", "5"}, false},
		{[]string{"-out", "calls"}, false},
	} {
		if got := callsMode(tc.args); got != tc.want {
			t.Errorf("callsMode(%q) = %v, want %v", tc.args, got, tc.want)
		}
	}
}
