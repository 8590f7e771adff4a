// The table's TLS section: dabb-tls against grpc-tls, and each against itself in plaintext.

package main

import (
	"fmt"
	"io"
	"strings"
)

// writeTLS writes, for each concurrency at which dabb-tls and grpc-tls
// were both measured, their calls/s ratio beside the plaintext one of the
// same run, and what TLS costs each framework: its TLS calls/s over its
// plaintext calls/s, and the same for CPU per call. A cell whose points
// were not measured is "-"; without any dabb-tls and grpc-tls pair the
// section is left out.
func writeTLS(w io.Writer, res *results) {
	rate := func(f string, c int) (float64, bool) {
		p, ok := res.find(f, c)
		return p.rate(), ok && p.Calls > 0
	}
	cpu := func(f string, c int) (float64, bool) {
		p, ok := res.find(f, c)
		return p.usPerCall(), ok && p.Calls > 0
	}
	ratio := func(get func(string, int) (float64, bool), a, b string, c int) string {
		x, ok1 := get(a, c)
		y, ok2 := get(b, c)
		if !ok1 || !ok2 || y <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f×", x/y)
	}
	var rows []string
	for _, c := range res.cfg.conc {
		tls := ratio(rate, "dabb-tls", "grpc-tls", c)
		if tls == "-" {
			continue
		}
		rows = append(rows, fmt.Sprintf("| c=%d | %s | %s | %s | %s | %s | %s |", c, tls, ratio(rate, "dabb", "grpc", c),
			ratio(rate, "dabb-tls", "dabb", c), ratio(rate, "grpc-tls", "grpc", c),
			ratio(cpu, "dabb-tls", "dabb", c), ratio(cpu, "grpc-tls", "grpc", c)))
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w, "\nOver TLS 1.3 (this run; TLS ÷ plaintext is each framework against itself):")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| point | calls/s, dabb-tls ÷ grpc-tls | plaintext, dabb ÷ grpc | calls/s TLS ÷ plaintext, dabb | gRPC | CPU per call TLS ÷ plaintext, dabb | gRPC |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|")
	fmt.Fprintln(w, strings.Join(rows, "\n"))
}
