package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/bench/frameworks"
)

// sampleInproc is go test -benchmem output as the allocation benchmarks
// print it with GOMAXPROCS=2, with grpc not selected.
const sampleInproc = `goos: linux
goarch: amd64
pkg: github.com/dabbrpc/dabb/bench
cpu: Intel(R) Xeon(R) Processor
BenchmarkEcho/dabb-2      	   38412	     26961 ns/op	    2243 B/op	      19 allocs/op
BenchmarkEcho/grpc-2      	   21021	     58259 ns/op	   12574 B/op	     162 allocs/op
BenchmarkEcho/raw-2       	   36531	     27917 ns/op	    1338 B/op	      18 allocs/op
BenchmarkEchoParallel/dabb-2         	   92740	     10868 ns/op	        64.00 goroutines	    2251 B/op	      20 allocs/op
BenchmarkEchoParallel/grpc-2         	   58167	     20031 ns/op	        64.00 goroutines	   12414 B/op	     150 allocs/op
BenchmarkEchoParallel/raw-2          	  138786	      8124 ns/op	        64.00 goroutines	    1342 B/op	      18 allocs/op
BenchmarkDabbKeyed-2                 	   33256	     32128 ns/op	    2675 B/op	      24 allocs/op
BenchmarkCodecFloor-2                	  249218	      5118 ns/op	    1666 B/op	      18 allocs/op
PASS
ok  	github.com/dabbrpc/dabb/bench	17.885s
`

func TestParseAllocs(t *testing.T) {
	for _, tc := range []struct {
		name         string
		input        string
		names        []string
		echo, par    map[string]benchResult
		keyed, floor *benchResult
		missing      string
	}{
		{
			name:  "GOMAXPROCS suffix, unselected framework dropped",
			input: sampleInproc,
			names: []string{"dabb", "raw"},
			echo: map[string]benchResult{
				"dabb": {26961, 2243, 19},
				"raw":  {27917, 1338, 18},
			},
			par: map[string]benchResult{
				"dabb": {10868, 2251, 20},
				"raw":  {8124, 1342, 18},
			},
			keyed: &benchResult{32128, 2675, 24},
			floor: &benchResult{5118, 1666, 18},
		},
		{
			name:  "dabb not selected: no keyed row",
			input: sampleInproc,
			names: []string{"grpc"},
			echo:  map[string]benchResult{"grpc": {58259, 12574, 162}},
			par:   map[string]benchResult{"grpc": {20031, 12414, 150}},
			floor: &benchResult{5118, 1666, 18},
		},
		{
			name: "GOMAXPROCS=1: no suffix; a result after logged lines",
			input: "BenchmarkEcho/raw \t2024/01/02 server says hello\nmore log\n" +
				"   36531\t     27917 ns/op\t    1338 B/op\t      18 allocs/op\n" +
				"BenchmarkCodecFloor\t249218\t5118 ns/op\t1666 B/op\t18 allocs/op\n",
			names:   []string{"raw"},
			echo:    map[string]benchResult{"raw": {27917, 1338, 18}},
			par:     map[string]benchResult{},
			floor:   &benchResult{5118, 1666, 18},
			missing: "BenchmarkEchoParallel/raw",
		},
		{
			name: "failed and malformed lines skipped",
			input: "BenchmarkEcho/dabb-2\t100\t5 ns/op\n" + // no -benchmem columns
				"BenchmarkEcho/raw-2\tx\t5 ns/op\t1 B/op\t1 allocs/op\n" +
				"--- FAIL: BenchmarkEchoParallel/dabb-2\n    inproc_test.go:99: connection refused\n" +
				"FAIL\nexit status 1\n",
			names:   []string{"dabb", "raw"},
			echo:    map[string]benchResult{},
			par:     map[string]benchResult{},
			missing: "BenchmarkEcho/dabb BenchmarkEchoParallel/dabb BenchmarkEcho/raw BenchmarkEchoParallel/raw BenchmarkDabbKeyed BenchmarkCodecFloor",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var a allocResults
			parseAllocs(&a, strings.NewReader(tc.input), tc.names)
			checkResults(t, "BenchmarkEcho", a.echo, tc.echo)
			checkResults(t, "BenchmarkEchoParallel", a.parallel, tc.par)
			checkOne(t, "BenchmarkDabbKeyed", a.keyed, tc.keyed)
			checkOne(t, "BenchmarkCodecFloor", a.floor, tc.floor)
			if got := strings.Join(a.missing(tc.names), " "); got != tc.missing {
				t.Errorf("missing = %q, want %q", got, tc.missing)
			}
			for n := range tc.par {
				if g := a.goroutines[n]; g != 64 {
					t.Errorf("BenchmarkEchoParallel/%s: %d goroutines, want the 64 printed", n, g)
				}
			}
		})
	}
}

// TestParallelHeader: the parallel column is named by the goroutines
// BenchmarkEchoParallel reports (32 × GOMAXPROCS of go test), not by a
// fixed count.
func TestParallelHeader(t *testing.T) {
	line := func(fw string, g string) string {
		return "BenchmarkEchoParallel/" + fw + "-4\t1000\t5000 ns/op\t" + g + "\t2000 B/op\t20 allocs/op\n"
	}
	for _, tc := range []struct {
		name, input, want string
	}{
		{"GOMAXPROCS=4", line("dabb", "128.0 goroutines") + line("raw", "128.0 goroutines"), "allocs/op, 128 goroutines"},
		{"no metric printed", line("dabb", "") + line("raw", ""), "allocs/op, 32 × GOMAXPROCS goroutines"},
		{"counts differ", line("dabb", "128.0 goroutines") + line("raw", "64.00 goroutines"), "allocs/op, 32 × GOMAXPROCS goroutines"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var a allocResults
			parseAllocs(&a, strings.NewReader(tc.input), []string{"dabb", "raw"})
			if len(a.parallel) != 2 {
				t.Fatalf("parsed %v, want dabb and raw", a.parallel)
			}
			if got := a.parallelHeader(); got != tc.want {
				t.Errorf("header %q, want %q", got, tc.want)
			}
		})
	}
}

func checkResults(t *testing.T, what string, got, want map[string]benchResult) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: got %v, want %v", what, got, want)
	}
	for k, w := range want {
		if g, ok := got[k]; !ok || g != w {
			t.Errorf("%s/%s: got %+v (present %v), want %+v", what, k, g, ok, w)
		}
	}
}

func checkOne(t *testing.T, what string, got, want *benchResult) {
	t.Helper()
	switch {
	case got == nil && want == nil:
	case got == nil || want == nil:
		t.Errorf("%s: got %v, want %v", what, got, want)
	case *got != *want:
		t.Errorf("%s: got %+v, want %+v", what, *got, *want)
	}
}

func TestAllocsBenchRegexp(t *testing.T) {
	for _, tc := range []struct {
		names   []string
		match   []string // benchmark/sub-benchmark names go test would run
		noMatch []string
	}{
		{
			names:   []string{"dabb", "raw"},
			match:   []string{"BenchmarkEcho/dabb", "BenchmarkEchoParallel/raw", "BenchmarkDabbKeyed", "BenchmarkCodecFloor"},
			noMatch: []string{"BenchmarkEcho/grpc", "BenchmarkEchoParallel/rpcx"},
		},
		{
			names:   []string{"grpc"},
			match:   []string{"BenchmarkEcho/grpc", "BenchmarkCodecFloor"},
			noMatch: []string{"BenchmarkDabbKeyed", "BenchmarkEcho/dabb", "BenchmarkEcho/grpcx"},
		},
	} {
		t.Run(strings.Join(tc.names, ","), func(t *testing.T) {
			re := allocsBenchRegexp(tc.names)
			for _, n := range tc.match {
				if !benchSelects(t, re, n) {
					t.Errorf("-bench %q does not select %s", re, n)
				}
			}
			for _, n := range tc.noMatch {
				if benchSelects(t, re, n) {
					t.Errorf("-bench %q selects %s", re, n)
				}
			}
		})
	}
	if d := allocsEstimate(strings.Split(frameworks.Names(), ",")); d < 15*time.Second || d > 30*time.Second {
		t.Errorf("estimate for every framework = %v, want about 20 s", d)
	}
}

// benchSelects reports whether go test -bench re runs and reports the
// benchmark name ("BenchmarkX" or "BenchmarkX/sub"): re is split at
// unparenthesized '|' into alternatives and each at '/' into levels, and
// an alternative selects a name whose every element matches its level
// and that has no fewer elements than levels.
func benchSelects(t *testing.T, re, name string) bool {
	t.Helper()
	elems := strings.Split(name, "/")
	for _, alt := range splitTop(re, '|') {
		levels := splitTop(alt, '/')
		if len(elems) < len(levels) {
			continue // only run to find sub-benchmarks
		}
		ok := true
		for i, l := range levels {
			rx, err := regexp.Compile(l)
			if err != nil {
				t.Fatalf("-bench %q: level %q: %v", re, l, err)
			}
			ok = ok && rx.MatchString(elems[i])
		}
		if ok {
			return true
		}
	}
	return false
}

// splitTop splits s at the seps outside parentheses.
func splitTop(s string, sep byte) []string {
	var parts []string
	depth, from := 0, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '(':
			depth++
		case ')':
			depth--
		case sep:
			if depth == 0 {
				parts = append(parts, s[from:i])
				from = i + 1
			}
		}
	}
	return append(parts, s[from:])
}

// allocsRun returns results of dabb and raw with the given allocations.
func allocsRun(t *testing.T, a *allocResults) *results {
	t.Helper()
	cfg, err := parseFlags([]string{"-frameworks", "dabb,raw", "-c", "1", "-mix=false", "-out", t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	return &results{cfg: cfg, allocs: a}
}

func TestWriteAllocs(t *testing.T) {
	parsed := func(dabbAllocs int64) *allocResults {
		a := &allocResults{command: "go test -bench x"}
		parseAllocs(a, strings.NewReader(sampleInproc), []string{"dabb", "raw"})
		if dabbAllocs != 0 {
			a.echo["dabb"] = benchResult{1, 2000, dabbAllocs}
		}
		return a
	}
	failed := &allocResults{command: "go test -bench x", err: errors.New("dabbbench: allocations: go test: exit status 1:\n\tFAIL")}
	partial := parsed(0)
	partial.err = errors.New("dabbbench: allocations: go test: exit status 1")
	delete(partial.parallel, "raw")
	for _, tc := range []struct {
		name       string
		a          *allocResults
		want, not  []string
		wantTarget string // the targets row, or "" for none
	}{
		{
			name: "measured, target met",
			a:    parsed(0),
			want: []string{
				"(`cd bench && go test -bench x`, output in [inproc.txt](results/inproc.txt))",
				"| framework | allocs/op | B/op | allocs/op, 64 goroutines | over the codec floor (18) |",
				"| dabb | 19 | 2243 | 20 | +1 |",
				"| raw | 18 | 1338 | 18 | +0 |",
				"| dabb, method not idempotent (`BenchmarkDabbKeyed`) | 24 | 2675 | | +6 |",
				"| codec floor (`BenchmarkCodecFloor`) | 18 | 1666 | | |",
			},
			not:        []string{"grpc", "Not measured"},
			wantTarget: "| allocations per call, dabb − codec floor | +1 | ≤ +3 | met |",
		},
		{
			name:       "target just met",
			a:          parsed(21),
			want:       []string{"| dabb | 21 | 2000 | 20 | +3 |"},
			wantTarget: "| allocations per call, dabb − codec floor | +3 | ≤ +3 | met |",
		},
		{
			name:       "target not met",
			a:          parsed(22),
			want:       []string{"| dabb | 22 | 2000 | 20 | +4 |"},
			wantTarget: "| allocations per call, dabb − codec floor | +4 | ≤ +3 | NOT met |",
		},
		{
			name: "go test failed: the error in the table's place",
			a:    failed,
			want: []string{"Not measured: dabbbench: allocations: go test: exit status 1:; FAIL\n"},
			not:  []string{"| framework |", "codec floor ("},
		},
		{
			name:       "go test failed part way: the error and what was measured",
			a:          partial,
			want:       []string{"Not measured: dabbbench: allocations: go test: exit status 1\n", "What was measured", "| raw | 18 | 1338 | - | +0 |"},
			wantTarget: "| allocations per call, dabb − codec floor | +1 | ≤ +3 | met |",
		},
		{
			name: "without -allocs",
			not:  []string{"Allocations per call", "allocations per call"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := allocsRun(t, tc.a)
			var b strings.Builder
			writeAllocs(&b, res, "results/inproc.txt")
			writeTargets(&b, res)
			md := b.String()
			checkText(t, md, tc.want, tc.not)
			if got := strings.Contains(md, "allocations per call, dabb"); got != (tc.wantTarget != "") {
				t.Errorf("targets row present = %v, want %v:\n%s", got, tc.wantTarget != "", md)
			}
			if tc.wantTarget != "" && !strings.Contains(md, tc.wantTarget) {
				t.Errorf("lacks targets row %q:\n%s", tc.wantTarget, md)
			}
		})
	}
}

// TestWriteAllocsAdapterNote: a framework whose adapter allocates on top
// of the framework (Kitex's converts the reply) gets a line under the
// table saying so, when its row was measured.
func TestWriteAllocsAdapterNote(t *testing.T) {
	const kitexLines = "BenchmarkEcho/kitex-2\t23643\t50928 ns/op\t6338 B/op\t52 allocs/op\n" +
		"BenchmarkEchoParallel/kitex-2\t84565\t12706 ns/op\t64.00 goroutines\t6114 B/op\t45 allocs/op\n"
	for _, tc := range []struct {
		name, frameworks, input string
		note                    bool
	}{
		{"kitex measured", "dabb,kitex", sampleInproc + kitexLines, true},
		{"kitex not measured", "dabb,kitex", sampleInproc, false},
		{"kitex not run", "dabb,raw", sampleInproc + kitexLines, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parseFlags([]string{"-frameworks", tc.frameworks, "-c", "1", "-mix=false"})
			if err != nil {
				t.Fatal(err)
			}
			a := &allocResults{command: "go test -bench x"}
			parseAllocs(a, strings.NewReader(tc.input), cfg.frameworkNames())
			var b strings.Builder
			writeAllocs(&b, &results{cfg: cfg, allocs: a}, "results/inproc.txt")
			const note = "\nkitex's row includes one allocation per call made by the bench's adapter, not by Kitex: the reply copied from Kitex's generated type into benchpb's.\n"
			if got := strings.Contains(b.String(), note); got != tc.note {
				t.Errorf("note present = %v, want %v:\n%s", got, tc.note, b.String())
			}
		})
	}
}

// TestWriteAllocsProgram: the allocation benchmarks leave out a framework
// with a program of its own (dubbo-go), and the table says why under its
// empty row.
func TestWriteAllocsProgram(t *testing.T) {
	cfg, err := parseFlags([]string{"-frameworks", "dabb,dubbo-go", "-c", "1", "-mix=false"})
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.inProcessNames(); !slices.Equal(got, []string{"dabb"}) {
		t.Fatalf("inProcessNames = %q, want only dabb", got)
	}
	a := &allocResults{command: "go test -bench x"}
	parseAllocs(a, strings.NewReader(sampleInproc), cfg.inProcessNames())
	var b strings.Builder
	writeAllocs(&b, &results{cfg: cfg, allocs: a}, "results/inproc.txt")
	checkText(t, b.String(), []string{"| dubbo-go | - | - | - | - |",
		"\ndubbo-go: not measured here; its client and server are a program of its own module"}, []string{"Not measured:"})
}

func TestFindBenchModule(t *testing.T) {
	root := t.TempDir()
	bench := filepath.Join(root, "bench")
	deep := filepath.Join(bench, "cmd", "dabbbench")
	if err := os.MkdirAll(deep, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(path, s string) {
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(root, "go.mod"), "module github.com/dabbrpc/dabb\n\ngo 1.26\n")
	write(filepath.Join(bench, "go.mod"), "// the benchmarks\nmodule "+benchModule+"\n\ngo 1.26.0\n")
	for _, tc := range []struct {
		name, from string
		want       string // "" for errNoBenchModule
	}{
		{"bench", bench, bench},
		{"below bench", deep, bench},
		{"repository root", root, bench},
		{"elsewhere", t.TempDir(), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := findBenchModule(tc.from)
			if tc.want == "" {
				if !errors.Is(err, errNoBenchModule) {
					t.Fatalf("findBenchModule(%s) = %q, %v; want errNoBenchModule", tc.from, got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("findBenchModule(%s) = %q, %v; want %q", tc.from, got, err, tc.want)
			}
		})
	}
}

// TestAllocsWithoutGo checks that a missing go tool is reported in the
// table and in inproc.txt while the rest of the results are written.
func TestAllocsWithoutGo(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	a := measureAllocs(t.Context(), []string{"dabb", "raw"})
	if a.err == nil || !errors.Is(a.err, exec.ErrNotFound) {
		t.Fatalf("measureAllocs without go: err = %v, want exec.ErrNotFound", a.err)
	}
	res := allocsRun(t, a)
	res.start, res.end = time.Now(), time.Now()
	var stdout strings.Builder
	if err := writeResults(res, &stdout); err != nil {
		t.Fatalf("writeResults: %v", err)
	}
	md, err := os.ReadFile(filepath.Join(res.cfg.out, "bench.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), "Not measured: dabbbench: allocations:") || !strings.Contains(string(md), "calls/s:") {
		t.Errorf("bench.md lacks the sweep or the allocations error:\n%s", md)
	}
	raw, err := os.ReadFile(filepath.Join(res.cfg.out, inprocFile))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), a.err.Error()) {
		t.Errorf("inproc.txt = %q, want the error %q", raw, a.err)
	}
}
