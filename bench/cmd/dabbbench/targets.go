package main

import (
	"fmt"
	"io"
	"strings"
)

// maxAllocsOverFloor is dabb's target for allocations per call on the
// default path (an idempotency key per call), client and server together,
// over the protobuf codec floor; maxIdemAllocsOverFloor is dabb-idem's.
const (
	maxAllocsOverFloor     = 3
	maxIdemAllocsOverFloor = 1
)

// writeTargets writes dabb's standing against the goals it is built to,
// all relative to peers measured in the same run: the default path's
// calls/s against the raw references and every peer, its rise from c=128 to
// c=1024, CPU per call, the large-payload point, and the allocations per
// call over the codec floor. Lines whose points were not measured are left
// out.
func writeTargets(w io.Writer, res *results) {
	var lines []string
	check := func(what string, got, target float64, atLeast bool, unit string) {
		ok := got >= target
		op := "≥"
		if !atLeast {
			ok, op = got <= target, "≤"
		}
		verdict := "met"
		if !ok {
			verdict = "NOT met"
		}
		lines = append(lines, fmt.Sprintf("| %s | %.2f%s | %s %.2f%s | %s |", what, got, unit, op, target, unit, verdict))
	}
	rate := func(f string, c int) (float64, bool) {
		p, ok := res.find(f, c)
		return p.rate(), ok && p.Calls > 0
	}
	for _, t := range []struct {
		c      int
		target float64
	}{{1, 0.95}, {16, 0.9}, {128, 0.9}, {1024, 0.85}} {
		d, ok1 := rate("dabb", t.c)
		r, ok2 := rate("raw", t.c)
		if ok1 && ok2 && r > 0 {
			check(fmt.Sprintf("c=%d calls/s, dabb ÷ raw", t.c), d/r, t.target, true, "×")
		}
	}
	if d, ok1 := rate("dabb", 1); ok1 {
		if r, ok2 := rate("raw-conn", 1); ok2 && r > 0 {
			check("c=1 calls/s, dabb ÷ raw-conn", d/r, 0.8, true, "×")
		}
	}
	if hi, ok1 := rate("dabb", 1024); ok1 {
		if lo, ok2 := rate("dabb", 128); ok2 && lo > 0 {
			check("calls/s at c=1024 ÷ at c=128 (dabb)", hi/lo, 1, true, "×")
		}
	}
	for _, c := range res.cfg.conc {
		d, ok := rate("dabb", c)
		if !ok {
			continue
		}
		best, bestRate := "", 0.0
		for _, f := range res.cfg.frameworks {
			if f.Name == "raw" || f.Name == "raw-conn" || strings.HasPrefix(f.Name, "dabb") || f.TLS {
				continue
			}
			if q, ok := rate(f.Name, c); ok && q > bestRate {
				best, bestRate = f.Name, q
			}
		}
		if best != "" {
			check(fmt.Sprintf("c=%d calls/s, dabb ÷ the fastest peer (%s)", c, best), d/bestRate, 1, true, "×")
		}
	}
	if d, ok := res.find("dabb", 1024); ok {
		if r, ok := res.find("raw", 1024); ok && r.usPerCall() > 0 {
			check("c=1024 CPU per call, dabb ÷ raw", d.usPerCall()/r.usPerCall(), 1.3, false, "×")
		}
	}
	if a, m, ok := res.mixPair("dabb"); ok && a.P99 > 0 {
		check(fmt.Sprintf("small-call p99 with %d×1 MiB calls ÷ without (dabb)", res.cfg.large), float64(m.P99)/float64(a.P99), 3, false, "×")
		if _, g, ok := res.mixPair("grpc"); ok && g.LargeN > 0 && g.Window > 0 && m.Window > 0 {
			dl := float64(m.LargeN) / m.Window.Seconds()
			gl := float64(g.LargeN) / g.Window.Seconds()
			check("1 MiB calls/s at that point, dabb ÷ gRPC", dl/gl, 1, true, "×")
		}
	}
	allocRow := func(name string, over int64, limit int) {
		verdict := "met"
		if over > int64(limit) {
			verdict = "NOT met"
		}
		lines = append(lines, fmt.Sprintf("| allocations per call, %s − codec floor | %+d | ≤ %+d | %s |", name, over, limit, verdict))
	}
	if over, ok := res.allocs.overFloor("dabb"); ok {
		allocRow("dabb", over, maxAllocsOverFloor)
	}
	if over, ok := res.allocs.overFloor("dabb-idem"); ok {
		allocRow("dabb-idem", over, maxIdemAllocsOverFloor)
	}
	if len(lines) == 0 {
		return
	}
	fmt.Fprintln(w, "\ndabb against its targets (this run):")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| measure | dabb | target | |")
	fmt.Fprintln(w, "|---|---:|---:|---|")
	for _, l := range lines {
		fmt.Fprintln(w, l)
	}
}
