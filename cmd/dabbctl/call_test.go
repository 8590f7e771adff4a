//go:build !windows

// Tests of call: JSON in and out, attachments, -addr, and failed calls.

package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestCall: call sends a JSON request and prints the JSON reply (indented
// for tables, one line for -o json), from an argument, a file or standard
// input; -H attachments reach the handler, ${NAME} expanded; -addr calls
// one instance; a 40 and a 60 print their status on one line and exit 1.
func TestCall(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			url := b.url(t)
			s := startServer(t, url, serverOpts{})

			r := ctl(t, "-registry", url, "call", inventoryService+".Stock", `{"sku":"sku-1"}`)
			wantCode(t, r, exitOK, "call")
			if want := "{\n  \"sku\": \"sku-1\",\n  \"count\": \"100\"\n}\n"; r.stdout != want {
				t.Errorf("call printed %q, want %q", r.stdout, want)
			}

			file := filepath.Join(t.TempDir(), "deduct.json")
			if err := os.WriteFile(file, []byte(`{"sku":"sku-1","count":3,"request_id":"order-1"}`), 0o600); err != nil {
				t.Fatal(err)
			}
			r = ctl(t, "-registry", url, "-o", "json", "call", "-d", "@"+file, inventoryService+".Deduct")
			wantCode(t, r, exitOK, "call -d @file")
			if want := `{"remaining":"97"}` + "\n"; r.stdout != want {
				t.Errorf("call -d @file -o json printed %q, want %q", r.stdout, want)
			}
			r = ctlWith(t, `{"sku":"sku-1","count":3,"requestId":"order-1"}`, nil, "-registry", url, "-o", "json", "call", inventoryService+".Deduct", "-d", "@-")
			wantCode(t, r, exitOK, "call -d @-")
			if want := `{"remaining":"97","duplicate":true}` + "\n"; r.stdout != want {
				t.Errorf("call -d @- (the same request id again) printed %q, want %q", r.stdout, want)
			}

			r = ctlWith(t, "", []string{"DABBCTL_TEST_SECRET=s3cret"}, "-o", "json", "call", "-addr", s.addr,
				"-H", "x-token=Bearer ${DABBCTL_TEST_SECRET}", "-H", "x-other=1", echoService+".Attachment", `{"key":"x-token"}`)
			wantCode(t, r, exitOK, "call -H")
			var echo echoReply
			if err := json.Unmarshal([]byte(r.stdout), &echo); err != nil || echo.Value != "Bearer s3cret" {
				t.Errorf("call -H: the handler saw %+v (%v), want x-token=Bearer s3cret:\n%s", echo, err, r)
			}

			r = ctl(t, "-registry", url, "call", inventoryService+".Deduct", `{"sku":"sku-1","count":0}`)
			wantCode(t, r, exitFail, "a call answered 40")
			if lines := nonEmpty(r.stderr); len(lines) != 1 || !strings.Contains(lines[0], "call inventory.Inventory.Deduct: remote status 40 (bad request): count must be positive") {
				t.Errorf("a call answered 40: stderr is not one line naming the call and the status:\n%s", r.stderr)
			}
			r = ctl(t, "call", "-addr", s.addr, inventoryService+".Nope")
			wantCode(t, r, exitFail, "a call of a method the server does not have")
			if lines := nonEmpty(r.stderr); len(lines) != 1 || !regexp.MustCompile(`call inventory\.Inventory\.Nope at \S+: status 60 \(service not found\)`).MatchString(lines[0]) {
				t.Errorf("a call of a method the server does not have: stderr is not one line naming the call and status 60:\n%s", r.stderr)
			}
			r = ctl(t, "call", "-addr", s.addr, "nosuch.Service.Do")
			wantCode(t, r, exitFail, "a call of a service the server does not have")
			if lines := nonEmpty(r.stderr); len(lines) != 1 || !strings.Contains(lines[0], "remote status 60 (service not found)") {
				t.Errorf("a call of a service the server does not have: stderr is not one line with the server's status 60:\n%s", r.stderr)
			}
			r = ctl(t, "-registry", url, "call", "nosuch.Service.Do")
			wantCode(t, r, exitFail, "a call of a service the registry does not list")
			if !strings.Contains(r.stderr, "status 35") {
				t.Errorf("a call of a service the registry does not list: stderr does not give the status:\n%s", r.stderr)
			}
		})
	}
}

// TestCallUsage: a call that cannot be made as asked exits 2 with the
// reason, before any I/O.
func TestCallUsage(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no method", []string{"call"}, "want SERVICE.METHOD"},
		{"no dot", []string{"call", "-addr", "127.0.0.1:1", "Stock"}, `"Stock": want SERVICE.METHOD`},
		{"two requests", []string{"call", "-addr", "127.0.0.1:1", "-d", "{}", "a.B.C", "{}"}, "as an argument or with -d, not both"},
		{"bad JSON", []string{"call", "-addr", "127.0.0.1:1", "a.B.C", "{sku"}, "the request is not valid JSON"},
		{"missing file", []string{"call", "-addr", "127.0.0.1:1", "-d", "@/nonexistent.json", "a.B.C"}, "-d @/nonexistent.json: open /nonexistent.json"},
		{"bad header", []string{"call", "-addr", "127.0.0.1:1", "-H", "novalue", "a.B.C"}, `invalid value "novalue" for flag -H: "novalue": want key=value`},
		{"unset variable", []string{"call", "-addr", "127.0.0.1:1", "-H", "k=${DABBCTL_TEST_UNSET}", "a.B.C"}, "-H k: the environment variable DABBCTL_TEST_UNSET is not set"},
		{"describe template without method", []string{"describe", "-addr", "127.0.0.1:1", "-template"}, "want one SERVICE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := ctl(t, tc.args...)
			wantCode(t, r, exitUsage, strings.Join(tc.args, " "))
			if !strings.Contains(r.stderr, tc.want) {
				t.Errorf("stderr does not say %q:\n%s", tc.want, r.stderr)
			}
		})
	}
}
