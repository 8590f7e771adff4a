package main

import (
	"strings"
	"testing"
	"time"
)

// TestWriteTLS: the TLS section divides dabb-tls by grpc-tls at each
// concurrency, beside dabb ÷ grpc, and each TLS framework by its plaintext
// self; a missing point is "-", and without both TLS frameworks there is
// no section.
func TestWriteTLS(t *testing.T) {
	// calls in a 1 s window, and CPU µs per call (client and server halves)
	type fig struct {
		calls uint64
		cpuUs int
	}
	all := map[string]map[int]fig{
		"dabb":     {1: {400, 20}, 128: {1000, 10}},
		"grpc":     {1: {200, 40}, 128: {400, 30}},
		"dabb-tls": {1: {300, 25}, 128: {800, 12}},
		"grpc-tls": {1: {150, 50}, 128: {200, 48}},
	}
	for _, tc := range []struct {
		frameworks string
		want, not  []string
	}{
		{"dabb,grpc,dabb-tls,grpc-tls", []string{
			"\nOver TLS 1.3 (this run;",
			"| c=1 | 2.00× | 2.00× | 0.75× | 0.75× | 1.25× | 1.25× |\n",
			"| c=128 | 4.00× | 2.50× | 0.80× | 0.50× | 1.20× | 1.60× |\n",
		}, nil},
		{"dabb-tls,grpc-tls", []string{"| c=1 | 2.00× | - | - | - | - | - |\n"}, nil},
		{"dabb,grpc,dabb-tls", nil, []string{"Over TLS"}},
		{"dabb,grpc", nil, []string{"Over TLS"}},
	} {
		t.Run(tc.frameworks, func(t *testing.T) {
			cfg, err := parseFlags([]string{"-frameworks", tc.frameworks, "-c", "1,128", "-mix=false", "-rounds", "1", "-allocs=false"})
			if err != nil {
				t.Fatal(err)
			}
			res := &results{cfg: cfg}
			for _, f := range cfg.frameworks {
				for c, v := range all[f.Name] {
					half := time.Duration(v.cpuUs) * time.Duration(v.calls) * time.Microsecond / 2
					res.points = append(res.points, point{Framework: f.Name, Round: 1, Payload: "small", C: c, Calls: v.calls,
						Window: time.Second, ClientCPU: half, ServerCPU: half})
				}
			}
			selectMedians(res.points)
			var md strings.Builder
			writeTLS(&md, res)
			checkText(t, md.String(), tc.want, tc.not)
		})
	}
}
