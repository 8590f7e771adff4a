//go:build !windows

// Tests of describe: methods, fields, templates, and a server without reflection.

package main

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/dabbrpc/dabb/reflection"
)

// TestDescribe: describe lists a service's methods with their directives
// and their request and reply fields (Deduct's sku, count and requestId
// among them), one method, a request template, in both output formats,
// found through the registry or at -addr; a server without reflection
// fails with "reflection disabled on that server".
func TestDescribe(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			url := b.url(t)
			s := startServer(t, url, serverOpts{})

			r := ctl(t, "-registry", url, "describe", inventoryService)
			wantCode(t, r, exitOK, "describe SERVICE")
			for _, want := range []string{
				`(?m)^inventory\.Inventory$`,
				`(?m)^  Deduct$`,
				`(?m)^    request: dabb\.examples\.inventory\.DeductRequest \(\*inventorypb\.DeductRequest\)$`,
				`(?m)^      sku\s+string$`,
				`(?m)^      count\s+int32$`,
				`(?m)^      requestId\s+string$`,
				`(?m)^      remaining\s+int64$`,
				`(?m)^  Stock  idempotent  timeout 200ms$`,
			} {
				if !regexp.MustCompile(want).MatchString(r.stdout) {
					t.Errorf("describe SERVICE: no line matching %s in\n%s", want, r.stdout)
				}
			}

			r = ctl(t, "-registry", url, "describe", inventoryService+".Stock")
			wantCode(t, r, exitOK, "describe SERVICE.METHOD")
			if strings.Contains(r.stdout, "Deduct") || !strings.Contains(r.stdout, "Stock  idempotent") {
				t.Errorf("describe SERVICE.METHOD does not describe Stock alone:\n%s", r.stdout)
			}

			r = ctl(t, "-registry", url, "-o", "json", "describe", inventoryService+".Deduct")
			wantCode(t, r, exitOK, "-o json describe SERVICE.METHOD")
			var m reflection.Method
			if err := json.Unmarshal([]byte(r.stdout), &m); err != nil {
				t.Fatalf("-o json describe: %v\n%s", err, r.stdout)
			}
			if m.Name != "Deduct" || m.Request.Proto != "dabb.examples.inventory.DeductRequest" || m.Idempotent {
				t.Errorf("-o json describe = %+v, want Deduct, not idempotent, its request message", m)
			}

			r = ctl(t, "-registry", url, "-o", "json", "describe", "-template", inventoryService+".Deduct")
			wantCode(t, r, exitOK, "describe -template")
			if got := strings.TrimSpace(r.stdout); got != `{"sku":"","count":0,"requestId":""}` {
				t.Errorf("describe -template -o json = %s", got)
			}

			r = ctl(t, "describe", "-addr", s.addr, echoService+".Attachment")
			wantCode(t, r, exitOK, "describe -addr of a JSON method")
			for _, want := range []string{`(?m)^    request: \*main\.echoRequest \(JSON\)$`, `(?m)^      key\s+string$`, `(?m)^      value\s+string$`} {
				if !regexp.MustCompile(want).MatchString(r.stdout) {
					t.Errorf("describe -addr of a JSON method: no line matching %s in\n%s", want, r.stdout)
				}
			}

			r = ctl(t, "describe", "-addr", s.addr, inventoryService+".Nope")
			wantCode(t, r, exitFail, "describe of a method the service does not have")
			if !strings.Contains(r.stderr, "inventory.Inventory has no method Nope (it has Deduct, Stock)") {
				t.Errorf("describe of a method the service does not have: stderr does not say so:\n%s", r.stderr)
			}

			offURL := b.url(t) // a registry of its own: its one instance serves no reflection
			off := startServer(t, offURL, serverOpts{noReflect: true})
			for _, args := range [][]string{
				{"-registry", offURL, "describe", inventoryService},
				{"describe", "-addr", off.addr, inventoryService + ".Deduct"},
				{"-registry", offURL, "call", inventoryService + ".Stock", `{"sku":"sku-1"}`},
			} {
				r = ctl(t, args...)
				wantCode(t, r, exitFail, strings.Join(args, " ")+" of a server without reflection")
				if lines := nonEmpty(r.stderr); len(lines) != 1 || !strings.Contains(lines[0], "reflection disabled on that server") {
					t.Errorf("%s of a server without reflection: stderr is not one line saying reflection is disabled:\n%s", strings.Join(args, " "), r.stderr)
				}
			}
		})
	}
}
