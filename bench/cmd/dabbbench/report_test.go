package main

import (
	"bytes"
	"encoding/csv"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestUncountedWrites: Kitex writes with sendmsg, which /proc/self/io does
// not count, so its writes per call show as n/a in the table (with a note
// saying why) and are left empty in the CSV, not as 0.
func TestUncountedWrites(t *testing.T) {
	for _, tc := range []struct {
		frameworks string
		want, not  []string
	}{
		{"dabb,kitex", []string{
			"| dabb | 1 | 100 | - | - | - | - | 0.00 | 0.00 | 2.00+2.00 | 0 |\n",
			"| kitex | 1 | 100 | - | - | - | - | 0.00 | 0.00 | 2.00+n/a | 0 |\n",
			"\nWrites n/a: kitex writes with sendmsg, which /proc/self/io does not count",
		}, nil},
		{"dabb", []string{"| 2.00+2.00 |"}, []string{"n/a"}},
	} {
		t.Run(tc.frameworks, func(t *testing.T) {
			cfg, err := parseFlags([]string{"-frameworks", tc.frameworks, "-c", "1", "-mix=false", "-rounds", "1", "-allocs=false"})
			if err != nil {
				t.Fatal(err)
			}
			res := &results{cfg: cfg}
			for _, f := range cfg.frameworks {
				s := sample{sysr: 100, sysw: 100}
				if f.UncountedWrites {
					s.sysw = 0 // what /proc/self/io shows for sendmsg
				}
				res.points = append(res.points, point{Framework: f.Name, Round: 1, Payload: "small", C: 1, Calls: 100,
					Window: time.Second, Client: s, Server: s})
			}
			selectMedians(res.points)
			var md strings.Builder
			writeMarkdown(&md, res, "bench.svg")
			checkText(t, md.String(), tc.want, tc.not)

			rows := csvRows(t, res)
			cr, cw := slices.Index(csvHeader, "client_reads_per_call"), slices.Index(csvHeader, "client_writes_per_call")
			sr, sw := slices.Index(csvHeader, "server_reads_per_call"), slices.Index(csvHeader, "server_writes_per_call")
			for _, r := range rows[1:] {
				want := "1.000"
				if r[0] == "kitex" {
					want = ""
				}
				if r[cr] != "1.000" || r[sr] != "1.000" || r[cw] != want || r[sw] != want {
					t.Errorf("%s: reads %q %q, writes %q %q; want 1.000 reads and writes %q", r[0], r[cr], r[sr], r[cw], r[sw], want)
				}
			}
		})
	}
}

// TestPerCallCountsLargeCalls: at the -mix point the processes' CPU and
// system calls include the 1 MiB calls, so the per-call figures divide by
// the small and the large calls together.
func TestPerCallCountsLargeCalls(t *testing.T) {
	s := sample{sysr: 300, sysw: 100}
	p := point{Framework: "dabb", Round: 1, Median: true, Payload: "small", C: 2, Large: 1, Calls: 60, LargeN: 40,
		Window: time.Second, ClientCPU: 3 * time.Millisecond, ServerCPU: time.Millisecond, Client: s, Server: s}
	if got := p.usPerCall(); got != 40 {
		t.Errorf("usPerCall = %v, want 4000 µs ÷ 100 calls = 40", got)
	}
	if got := p.per100k(p.ClientCPU); got != 3 {
		t.Errorf("per100k(client) = %v, want 3 ms ÷ 100 calls × 100k = 3 s", got)
	}
	if r, w := p.syscallsPerCall(); r != 6 || w != 2 {
		t.Errorf("syscallsPerCall = %v+%v, want 600 ÷ 100 = 6 and 200 ÷ 100 = 2", r, w)
	}
	cfg, err := parseFlags([]string{"-frameworks", "dabb", "-c", "1", "-mixc", "2", "-large", "1", "-rounds", "1", "-allocs=false"})
	if err != nil {
		t.Fatal(err)
	}
	rows := csvRows(t, &results{cfg: cfg, points: []point{p}})
	want := map[string]string{"calls": "60", "calls_per_s": "60.000", "large_calls": "40",
		"client_cpu_s_per_100k": "3.000", "server_cpu_s_per_100k": "1.000", "cpu_us_per_call": "40.000",
		"client_reads_per_call": "3.000", "client_writes_per_call": "1.000"}
	for col, v := range want {
		if got := rows[1][slices.Index(csvHeader, col)]; got != v {
			t.Errorf("CSV %s = %q, want %q", col, got, v)
		}
	}
}

// csvRows writes res as CSV and reads it back.
func csvRows(t *testing.T, res *results) [][]string {
	t.Helper()
	var b bytes.Buffer
	if err := writeCSV(&b, res); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&b).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	return rows
}
