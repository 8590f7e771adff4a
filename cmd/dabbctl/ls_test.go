//go:build !windows

// Tests of ls: services, instances, health, against both registries.

package main

import (
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestLs: ls names the services with their number of instances (built-in
// services are not published, so not listed); ls SERVICE lists each
// instance's address, weight and metadata, and with -health its health; in
// both output formats, from -registry or $DABB_REGISTRY.
func TestLs(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			url := b.url(t)
			a := startServer(t, url, serverOpts{weight: 7, meta: "zone=a"})
			c := startServer(t, url, serverOpts{})

			r := ctl(t, "-registry", url, "ls")
			wantCode(t, r, exitOK, "ls")
			for _, want := range []string{`(?m)^SERVICE\s+INSTANCES$`, `(?m)^dabbctl\.test\.Echo\s+2$`, `(?m)^inventory\.Inventory\s+2$`} {
				if !regexp.MustCompile(want).MatchString(r.stdout) {
					t.Errorf("ls: no line matching %s in\n%s", want, r.stdout)
				}
			}
			if strings.Contains(r.stdout, "dabb.") {
				t.Errorf("ls lists a built-in service:\n%s", r.stdout)
			}

			r = ctlWith(t, "", []string{registryEnv + "=" + url}, "-o", "json", "ls")
			wantCode(t, r, exitOK, "-o json ls with $DABB_REGISTRY")
			var counts []serviceCount
			for _, line := range nonEmpty(r.stdout) {
				var sc serviceCount
				if err := json.Unmarshal([]byte(line), &sc); err != nil {
					t.Fatalf("ls -o json line %q: %v", line, err)
				}
				counts = append(counts, sc)
			}
			if want := []serviceCount{{echoService, 2}, {inventoryService, 2}}; !slices.Equal(counts, want) {
				t.Errorf("ls -o json = %v, want %v", counts, want)
			}

			r = ctl(t, "-registry", url, "ls", inventoryService)
			wantCode(t, r, exitOK, "ls SERVICE")
			for _, want := range []string{
				`(?m)^ADDRESS\s+WEIGHT\s+METADATA$`,
				`(?m)^` + regexp.QuoteMeta(a.addr) + `\s+7\s+zone=a$`,
				`(?m)^` + regexp.QuoteMeta(c.addr) + `\s+100\s+-$`,
			} {
				if !regexp.MustCompile(want).MatchString(r.stdout) {
					t.Errorf("ls SERVICE: no line matching %s in\n%s", want, r.stdout)
				}
			}

			r = ctl(t, "-registry", url, "-o", "json", "ls", "-health", inventoryService)
			wantCode(t, r, exitOK, "ls -health SERVICE")
			got := map[string]instanceJSON{}
			for _, line := range nonEmpty(r.stdout) {
				var in instanceJSON
				if err := json.Unmarshal([]byte(line), &in); err != nil {
					t.Fatalf("ls -o json line %q: %v", line, err)
				}
				got[in.Addr] = in
			}
			if in := got[a.addr]; in.Service != inventoryService || in.Weight != 7 || in.Metadata["zone"] != "a" || in.Health != "serving" {
				t.Errorf("ls -health -o json, the instance at %s = %+v, want weight 7, zone=a, serving", a.addr, in)
			}
			if in := got[c.addr]; in.Weight != 100 || len(in.Metadata) != 0 || in.Health != "serving" {
				t.Errorf("ls -health -o json, the instance at %s = %+v, want weight 100, no metadata, serving", c.addr, in)
			}
			if len(got) != 2 {
				t.Errorf("ls -health -o json listed %d instances, want 2:\n%s", len(got), r.stdout)
			}

			r = ctl(t, "-registry", url, "ls", "nosuch.Service")
			wantCode(t, r, exitOK, "ls of a service without instances")
			if !strings.Contains(r.stderr, "no instances of nosuch.Service") {
				t.Errorf("ls of a service without instances: stderr does not say so:\n%s", r.stderr)
			}
		})
	}
}

// TestLsHealthNotAnswering: ls -health exits 1 when a listed instance
// does not answer, and 0 when every one is serving.
func TestLsHealthNotAnswering(t *testing.T) {
	s := startServer(t, "", serverOpts{})
	dead := deadAddr(t)
	r := ctl(t, "-registry", "static://"+s.addr, "ls", "-health", inventoryService)
	wantCode(t, r, exitOK, "ls -health of a serving instance")
	r = ctl(t, "-registry", "static://"+s.addr+","+dead, "ls", "-health", "-timeout", "2s", inventoryService)
	wantCode(t, r, exitFail, "ls -health with an instance that does not answer")
	for _, want := range []string{
		`(?m)^` + regexp.QuoteMeta(s.addr) + `\s+100\s+-\s+serving$`,
		`(?m)^` + regexp.QuoteMeta(dead) + `\s+100\s+-\s+error: dabb\.Health/Check at ` + regexp.QuoteMeta(dead) + `: `,
	} {
		if !regexp.MustCompile(want).MatchString(r.stdout) {
			t.Errorf("ls -health with an instance that does not answer: no line matching %s in\n%s", want, r.stdout)
		}
	}
	if want := "dabbctl: ls -health: 1 of 2 instances of inventory.Inventory not serving\n"; r.stderr != want {
		t.Errorf("ls -health with an instance that does not answer: stderr = %q, want %q", r.stderr, want)
	}
}

// TestLsRegistryDown: a registry that does not answer fails ls with exit
// status 1 and one line naming what failed.
func TestLsRegistryDown(t *testing.T) {
	for _, url := range []string{"etcd://" + deadAddr(t) + "/services", "zk://" + deadAddr(t) + "/services"} {
		r := ctl(t, "-registry", url, "ls", "-timeout", "500ms")
		wantCode(t, r, exitFail, "ls of "+url)
		if lines := nonEmpty(r.stderr); len(lines) != 1 || !strings.HasPrefix(lines[0], "dabbctl: ls: list services:") {
			t.Errorf("ls of %s: stderr is not one line naming the listing:\n%s", url, r.stderr)
		}
	}
}

func nonEmpty(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	return out
}
