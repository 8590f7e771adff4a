//go:build !windows

// Tests of health: serving, unknown, and not serving once Shutdown begins.

package main

import (
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestHealth: health asks every instance about every service it is listed
// for (serving), or about one service, or, with -addr, one instance; a
// server whose Shutdown has begun is not serving, through the registry and
// directly, and the exit status of health and of ls -health says so.
func TestHealth(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			url := b.url(t)
			a := startServer(t, url, serverOpts{})
			d := startServer(t, url, serverOpts{hold: true})

			r := ctl(t, "-registry", url, "-o", "json", "health")
			wantCode(t, r, exitOK, "health")
			var got []healthLine
			for _, line := range nonEmpty(r.stdout) {
				var h healthLine
				if err := json.Unmarshal([]byte(line), &h); err != nil {
					t.Fatalf("health -o json line %q: %v", line, err)
				}
				got = append(got, h)
			}
			want := []healthLine{}
			for _, svc := range []string{echoService, inventoryService} {
				for _, s := range sortedAddrs(a, d) {
					want = append(want, healthLine{Service: svc, Addr: s, Status: "serving"})
				}
			}
			if !slices.Equal(got, want) {
				t.Errorf("health -o json = %+v, want %+v", got, want)
			}

			r = ctl(t, "-registry", url, "health", inventoryService)
			wantCode(t, r, exitOK, "health SERVICE")
			for _, s := range []*server{a, d} {
				if re := `(?m)^inventory\.Inventory\s+` + regexp.QuoteMeta(s.addr) + `\s+serving$`; !regexp.MustCompile(re).MatchString(r.stdout) {
					t.Errorf("health SERVICE: no line matching %s in\n%s", re, r.stdout)
				}
			}

			r = ctl(t, "health", "-addr", a.addr)
			wantCode(t, r, exitOK, "health -addr")
			if re := `(?m)^\(server\)\s+` + regexp.QuoteMeta(a.addr) + `\s+serving$`; !regexp.MustCompile(re).MatchString(r.stdout) {
				t.Errorf("health -addr: no line matching %s in\n%s", re, r.stdout)
			}
			r = ctl(t, "health", "-addr", a.addr, "nosuch.Service")
			wantCode(t, r, exitFail, "health -addr of a service the server does not have")
			if !regexp.MustCompile(`(?m)^nosuch\.Service\s+\S+\s+unknown$`).MatchString(r.stdout) {
				t.Errorf("health of a service the server does not have does not say unknown:\n%s", r.stdout)
			}

			// Shutdown begins; its withdrawal from the registry is held.
			d.signal(t, syscall.SIGTERM)
			d.out.await(t, 5*time.Second, "the withdrawal", func(l string) bool { return strings.HasPrefix(l, "withdrawing") })
			r = ctl(t, "-registry", url, "health", inventoryService)
			wantCode(t, r, exitFail, "health while a server shuts down")
			for _, want := range []string{
				`(?m)^inventory\.Inventory\s+` + regexp.QuoteMeta(a.addr) + `\s+serving$`,
				`(?m)^inventory\.Inventory\s+` + regexp.QuoteMeta(d.addr) + `\s+not serving$`,
			} {
				if !regexp.MustCompile(want).MatchString(r.stdout) {
					t.Errorf("health while a server shuts down: no line matching %s in\n%s", want, r.stdout)
				}
			}
			if !strings.Contains(r.stderr, "dabbctl: health: 1 of 2 not serving") {
				t.Errorf("health while a server shuts down: stderr does not count the one not serving:\n%s", r.stderr)
			}
			r = ctl(t, "-registry", url, "ls", "-health", inventoryService)
			wantCode(t, r, exitFail, "ls -health while a server shuts down")
			if re := `(?m)^` + regexp.QuoteMeta(d.addr) + `\s+100\s+-\s+not serving$`; !regexp.MustCompile(re).MatchString(r.stdout) {
				t.Errorf("ls -health while a server shuts down: no line matching %s in\n%s", re, r.stdout)
			}
			if want := "dabbctl: ls -health: 1 of 2 instances of inventory.Inventory not serving\n"; r.stderr != want {
				t.Errorf("ls -health while a server shuts down: stderr = %q, want %q", r.stderr, want)
			}
			d.signal(t, syscall.SIGUSR1) // the withdrawals go on, then the drain
			d.wait(t)

			r = ctl(t, "health", "-addr", d.addr, "-timeout", "1s")
			wantCode(t, r, exitFail, "health of a server that is gone")
			if !strings.Contains(r.stdout, "error: dabb.Health/Check at "+d.addr) {
				t.Errorf("health of a server that is gone does not say the check failed:\n%s", r.stdout)
			}
		})
	}
}

func sortedAddrs(ss ...*server) []string {
	var out []string
	for _, s := range ss {
		out = append(out, s.addr)
	}
	slices.Sort(out)
	return out
}

// TestHealthDuringDrainDelay: a server given dabb.WithDrainDelay keeps
// answering while it drains after SIGTERM, and dabbctl health -addr, a
// fresh connection, reads not serving and exits 1. Then the server exits.
func TestHealthDuringDrainDelay(t *testing.T) {
	d := startServer(t, "", serverOpts{drain: 3 * time.Second})
	r := ctl(t, "health", "-addr", d.addr, inventoryService)
	wantCode(t, r, exitOK, "health before the shutdown")
	d.signal(t, syscall.SIGTERM)
	notServing := regexp.MustCompile(`(?m)^inventory\.Inventory\s+` + regexp.QuoteMeta(d.addr) + `\s+not serving$`)
	deadline := time.Now().Add(2 * time.Second)
	for {
		r = ctl(t, "health", "-addr", d.addr, "-timeout", "1s", inventoryService)
		if r.code == exitFail && notServing.MatchString(r.stdout) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("health during the drain delay: exit %d, stdout\n%s\nstderr\n%s\nwant a line saying not serving", r.code, r.stdout, r.stderr)
		}
	}
	d.wait(t)
}
