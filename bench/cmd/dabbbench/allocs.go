package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// benchModule is the module path of the bench module, whose in-process
// benchmarks (inproc_test.go) count the allocations per call.
const benchModule = "github.com/dabbrpc/dabb/bench"

// allocsTimeout bounds the go test run of the allocation benchmarks: go
// test's own default timeout, and a minute to build.
const allocsTimeout = 11 * time.Minute

// errNoBenchModule reports a working directory outside the dabb tree.
var errNoBenchModule = errors.New("dabbbench: allocations: bench module not found")

// benchResult is one benchmark's line of go test -benchmem output.
type benchResult struct {
	NsPerOp     float64
	BytesPerOp  int64
	AllocsPerOp int64
}

// allocResults is what the in-process benchmarks measured: per framework
// one calling goroutine (BenchmarkEcho) and 32 × GOMAXPROCS of the go test
// process (BenchmarkEchoParallel), dabb's method without
// //dabb:idempotent (BenchmarkDabbKeyed) and the protobuf work of one call
// alone (BenchmarkCodecFloor).
type allocResults struct {
	command    string // the go test command line, as a user would type it
	output     string // what go test printed
	err        error  // why go test failed, or nil
	echo       map[string]benchResult
	parallel   map[string]benchResult
	goroutines map[string]int // BenchmarkEchoParallel's calling goroutines, its "goroutines" metric
	keyed      *benchResult
	floor      *benchResult
}

// allocsBenchRegexp returns the -bench expression selecting the
// benchmarks of the named frameworks, the codec floor and, with dabb,
// BenchmarkDabbKeyed. The floor always runs: every row is compared with
// it. go test splits the expression at unbracketed '|' into alternatives
// and each alternative at unbracketed '/' into one expression per level;
// the benchmarks without sub-benchmarks need an alternative of one
// level, or they would only be run to look for sub-benchmarks.
func allocsBenchRegexp(names []string) string {
	subs := make([]string, len(names))
	for i, n := range names {
		subs[i] = regexp.QuoteMeta(n)
	}
	re := fmt.Sprintf("^BenchmarkEcho(Parallel)?$/^(%s)$|^BenchmarkCodecFloor$", strings.Join(subs, "|"))
	if slices.Contains(names, "dabb") {
		re += "|^BenchmarkDabbKeyed$"
	}
	return re
}

// allocsEstimate is about how long the allocation benchmarks of the named
// frameworks take with a warm build cache: a little over the 1 s default
// benchtime per benchmark, and the build of the test binary.
func allocsEstimate(names []string) time.Duration {
	n := 2*len(names) + 1
	if slices.Contains(names, "dabb") {
		n++
	}
	return 2*time.Second + time.Duration(n)*1300*time.Millisecond
}

// findBenchModule returns the directory of the bench module: the
// directory holding its go.mod, looked for in dir and its parents and in
// their bench subdirectories, so the command works from bench/ (where it
// is normally run), from below it, and from the repository root.
func findBenchModule(dir string) (string, error) {
	for d := dir; ; {
		for _, cand := range []string{d, filepath.Join(d, "bench")} {
			if modulePath(filepath.Join(cand, "go.mod")) == benchModule {
				return cand, nil
			}
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", fmt.Errorf("%w: no go.mod of %s in %s, its parents or their bench directories; run from bench/ or use -allocs=false",
				errNoBenchModule, benchModule, dir)
		}
		d = parent
	}
}

// modulePath returns the module path declared by the go.mod file at
// file, or "" if it cannot be read.
func modulePath(file string) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "module"); ok && rest != "" && (rest[0] == ' ' || rest[0] == '\t') {
			return strings.Trim(strings.TrimSpace(rest), `"`)
		}
	}
	return ""
}

// measureAllocs runs the in-process benchmarks of the named frameworks
// with go test in the bench module and parses what they print. A failure
// is kept in the result's err (with whatever output there was), never
// returned: the rest of the run is written all the same.
func measureAllocs(ctx context.Context, names []string) *allocResults {
	re := allocsBenchRegexp(names)
	args := []string{"test", "-run", "^$", "-bench", re, "-benchmem", "-count", "1"}
	res := &allocResults{command: fmt.Sprintf("go test -run '^$' -bench '%s' -benchmem -count 1", re)}
	wd, err := os.Getwd()
	if err != nil {
		res.err = fmt.Errorf("dabbbench: allocations: %w", err)
		return res
	}
	dir, err := findBenchModule(wd)
	if err != nil {
		res.err = err
		return res
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		res.err = fmt.Errorf("dabbbench: allocations: %w", err)
		return res
	}
	ctx, cancel := context.WithTimeout(ctx, allocsTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, goTool, args...)
	cmd.Dir = dir
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	res.output = string(out)
	if err != nil {
		res.err = fmt.Errorf("dabbbench: allocations: go test in %s: %w%s", dir, err, lastLines(res.output, 3))
	}
	parseAllocs(res, strings.NewReader(res.output), names)
	if missing := res.missing(names); res.err == nil && len(missing) > 0 {
		res.err = fmt.Errorf("dabbbench: allocations: go test in %s printed no result for %s", dir, strings.Join(missing, ", "))
	}
	return res
}

// missing returns the benchmarks of the named frameworks that have no
// result.
func (a *allocResults) missing(names []string) []string {
	var m []string
	for _, n := range names {
		if _, ok := a.echo[n]; !ok {
			m = append(m, "BenchmarkEcho/"+n)
		}
		if _, ok := a.parallel[n]; !ok {
			m = append(m, "BenchmarkEchoParallel/"+n)
		}
	}
	if a.keyed == nil && slices.Contains(names, "dabb") {
		m = append(m, "BenchmarkDabbKeyed")
	}
	if a.floor == nil {
		m = append(m, "BenchmarkCodecFloor")
	}
	return m
}

// lastLines returns the last n non-empty lines of s, each on a line of
// its own after a colon, or "" for no output.
func lastLines(s string, n int) string {
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) == 0 {
		return ""
	}
	return ":\n\t" + strings.Join(lines[max(len(lines)-n, 0):], "\n\t")
}

// procSuffix matches the -GOMAXPROCS suffix go test adds to benchmark
// names when GOMAXPROCS > 1.
var procSuffix = regexp.MustCompile(`-[0-9]+$`)

// parseAllocs reads go test -benchmem output into res, keeping the
// frameworks in names. A result printed on a line after its benchmark's
// name, as when the benchmark logs, is still taken; lines that are not
// benchmark results are skipped.
func parseAllocs(res *allocResults, r io.Reader, names []string) {
	keep := make(map[string]bool, len(names))
	for _, n := range names {
		keep[n] = true
	}
	res.echo, res.parallel, res.goroutines = map[string]benchResult{}, map[string]benchResult{}, map[string]int{}
	var pending string // a benchmark name whose numbers have not come yet
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		name, rest := pending, f
		if strings.HasPrefix(f[0], "Benchmark") {
			name, rest = procSuffix.ReplaceAllString(f[0], ""), f[1:]
		}
		br, ok := parseBenchFields(rest)
		if !ok {
			if strings.HasPrefix(f[0], "Benchmark") {
				pending = name
			}
			continue
		}
		pending = ""
		top, sub, _ := strings.Cut(name, "/")
		switch {
		case top == "BenchmarkEcho" && keep[sub]:
			res.echo[sub] = br
		case top == "BenchmarkEchoParallel" && keep[sub]:
			res.parallel[sub] = br
			if g, ok := benchMetric(rest, "goroutines"); ok && g >= 1 {
				res.goroutines[sub] = int(g)
			}
		case top == "BenchmarkDabbKeyed" && sub == "" && keep["dabb"]:
			res.keyed = &br
		case top == "BenchmarkCodecFloor" && sub == "":
			res.floor = &br
		}
	}
}

// parseBenchFields parses "N v ns/op v B/op v allocs/op ...", the fields
// of a result line after the name.
func parseBenchFields(f []string) (benchResult, bool) {
	if len(f) < 7 || len(f)%2 == 0 {
		return benchResult{}, false
	}
	if _, err := strconv.ParseInt(f[0], 10, 64); err != nil {
		return benchResult{}, false
	}
	var br benchResult
	var have int
	for i := 1; i+1 < len(f); i += 2 {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return benchResult{}, false
		}
		switch f[i+1] {
		case "ns/op":
			br.NsPerOp = v
			have |= 1
		case "B/op":
			br.BytesPerOp = int64(v)
			have |= 2
		case "allocs/op":
			br.AllocsPerOp = int64(v)
			have |= 4
		}
	}
	return br, have == 7
}

// benchMetric returns the value of unit in the fields of a result line
// after the name, as a benchmark's b.ReportMetric prints it.
func benchMetric(f []string, unit string) (float64, bool) {
	for i := 1; i+1 < len(f); i += 2 {
		if f[i+1] == unit {
			v, err := strconv.ParseFloat(f[i], 64)
			return v, err == nil
		}
	}
	return 0, false
}

// parallelHeader names the table's BenchmarkEchoParallel column by the
// goroutines it ran with: 32 × GOMAXPROCS of the go test process, which
// the benchmark reports; in general terms if it did not, or if the
// frameworks' counts differ.
func (a *allocResults) parallelHeader() string {
	n := 0
	for _, g := range a.goroutines {
		if n != 0 && g != n {
			n = 0
			break
		}
		n = g
	}
	if n == 0 {
		return "allocs/op, 32 × GOMAXPROCS goroutines" // SetParallelism(32) in inproc_test.go
	}
	return fmt.Sprintf("allocs/op, %d goroutines", n)
}

// overFloor returns the allocations per call of framework's one-goroutine
// row over the codec floor.
func (a *allocResults) overFloor(framework string) (int64, bool) {
	if a == nil || a.floor == nil {
		return 0, false
	}
	d, ok := a.echo[framework]
	return d.AllocsPerOp - a.floor.AllocsPerOp, ok
}

// writeAllocs writes the allocations table of res, or why there is none;
// raw is the path of the go test output relative to the Markdown file.
func writeAllocs(w io.Writer, res *results, raw string) {
	a := res.allocs
	if a == nil {
		return
	}
	fmt.Fprintf(w, "\nAllocations per call, client and server in one process (`cd bench && %s`, output in [%s](%s)):\n\n",
		a.command, path.Base(raw), raw)
	if a.err != nil {
		fmt.Fprintf(w, "Not measured: %s\n", strings.ReplaceAll(a.err.Error(), "\n\t", "; "))
		if len(a.echo) == 0 && len(a.parallel) == 0 && a.keyed == nil && a.floor == nil {
			return
		}
		fmt.Fprintln(w, "\nWhat was measured:")
		fmt.Fprintln(w)
	}
	floor := "over the codec floor"
	over := func(int64) string { return "-" }
	if a.floor != nil {
		floor = fmt.Sprintf("over the codec floor (%d)", a.floor.AllocsPerOp)
		over = func(n int64) string { return fmt.Sprintf("%+d", n-a.floor.AllocsPerOp) }
	}
	fmt.Fprintf(w, "| framework | allocs/op | B/op | %s | %s |\n", a.parallelHeader(), floor)
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|")
	for _, f := range res.cfg.frameworks {
		one, ok1 := a.echo[f.Name]
		par, ok2 := a.parallel[f.Name]
		allocs, size, parallel, diff := "-", "-", "-", "-"
		if ok1 {
			allocs, size, diff = strconv.FormatInt(one.AllocsPerOp, 10), strconv.FormatInt(one.BytesPerOp, 10), over(one.AllocsPerOp)
		}
		if ok2 {
			parallel = strconv.FormatInt(par.AllocsPerOp, 10)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", f.Name, allocs, size, parallel, diff)
	}
	if k := a.keyed; k != nil {
		fmt.Fprintf(w, "| dabb, method not idempotent (`BenchmarkDabbKeyed`) | %d | %d | | %s |\n", k.AllocsPerOp, k.BytesPerOp, over(k.AllocsPerOp))
	}
	if fl := a.floor; fl != nil {
		fmt.Fprintf(w, "| codec floor (`BenchmarkCodecFloor`) | %d | %d | | |\n", fl.AllocsPerOp, fl.BytesPerOp)
	}
	for _, f := range res.cfg.frameworks {
		_, ok1 := a.echo[f.Name]
		_, ok2 := a.parallel[f.Name]
		if f.AdapterAllocs != "" && (ok1 || ok2) {
			fmt.Fprintf(w, "\n%s's row includes %s.\n", f.Name, f.AdapterAllocs)
		}
		if f.Program != "" {
			fmt.Fprintf(w, "\n%s: not measured here; its client and server are a program of its own module, which cannot run in this process.\n", f.Name)
		}
	}
}

// inprocText is the content of inproc.txt: go test's output, or the
// error when go test printed nothing.
func (a *allocResults) inprocText() string {
	if a.output != "" {
		return a.output
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s\n", a.command)
	if a.err != nil {
		fmt.Fprintf(&b, "%v\n", a.err)
	}
	return b.String()
}
