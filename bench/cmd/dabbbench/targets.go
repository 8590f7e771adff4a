package main

import (
	"fmt"
	"io"
)

// maxAllocsOverFloor is dabb's target for allocations per call, client
// and server together, over the protobuf codec floor.
const maxAllocsOverFloor = 4

// writeTargets writes dabb's standing against the goals it is built to:
// throughput, latency and CPU per call relative to the peers in the same
// run, the large-payload ratio, and the allocations per call over the
// codec floor. Lines whose points were not measured are left out.
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
	ratio := func(c int, peer string, target float64, name string) {
		d, ok1 := rate("dabb", c)
		q, ok2 := rate(peer, c)
		if ok1 && ok2 && q > 0 {
			check(fmt.Sprintf("c=%d calls/s, dabb ÷ %s", c, name), d/q, target, true, "×")
		}
	}
	for _, c := range []int{128, 1024} {
		ratio(c, "grpc", 2.5, "gRPC")
		ratio(c, "rpcx", 1.6, "rpcx")
		ratio(c, "raw", 0.7, "raw")
	}
	ratio(1, "raw", 1, "raw")
	ratio(1, "grpc", 2, "gRPC")
	if d, ok := res.find("dabb", 1024); ok {
		if g, ok := res.find("grpc", 1024); ok && g.P99 > 0 {
			check("c=1024 p99, dabb ÷ gRPC", float64(d.P99)/float64(g.P99), 0.5, false, "×")
		}
	}
	if d, ok := res.find("dabb", 128); ok {
		if r, ok := res.find("raw", 128); ok && r.usPerCall() > 0 {
			check("c=128 CPU per call, dabb ÷ raw", d.usPerCall()/r.usPerCall(), 1.4, false, "×")
		}
	}
	if a, m, ok := res.mixPair("dabb"); ok && a.P99 > 0 {
		check(fmt.Sprintf("small-call p99 with %d×1 MiB calls ÷ without (dabb)", res.cfg.large), float64(m.P99)/float64(a.P99), 3, false, "×")
	}
	if over, ok := res.allocs.dabbOverFloor(); ok {
		verdict := "met"
		if over > maxAllocsOverFloor {
			verdict = "NOT met"
		}
		lines = append(lines, fmt.Sprintf("| allocations per call, dabb − codec floor | %+d | ≤ %+d | %s |", over, maxAllocsOverFloor, verdict))
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
