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

			var b bytes.Buffer
			if err := writeCSV(&b, res); err != nil {
				t.Fatal(err)
			}
			rows, err := csv.NewReader(&b).ReadAll()
			if err != nil {
				t.Fatal(err)
			}
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
