package main

import (
	"bufio"
	"encoding/csv"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// writeResults writes the Markdown table to stdout and the table, CSV and
// chart to the output directory.
func writeResults(res *results, stdout io.Writer) error {
	if err := os.MkdirAll(res.cfg.out, 0o755); err != nil {
		return fmt.Errorf("dabbbench: results: %w", err)
	}
	base := "bench"
	if res.cfg.payload != "small" {
		base += "-" + res.cfg.payload
	}
	var md strings.Builder
	writeMarkdown(&md, res, base+".svg")
	if _, err := io.WriteString(stdout, md.String()); err != nil {
		return err
	}
	files := map[string]func(io.Writer) error{
		base + ".md":  func(w io.Writer) error { _, err := io.WriteString(w, md.String()); return err },
		base + ".csv": func(w io.Writer) error { return writeCSV(w, res) },
		base + ".svg": func(w io.Writer) error { return writeSVG(w, res) },
	}
	written := filepath.Join(res.cfg.out, base+".{md,csv,svg}")
	if a := res.allocs; a != nil {
		files[inprocFile] = func(w io.Writer) error { _, err := io.WriteString(w, a.inprocText()); return err }
		written += ", " + filepath.Join(res.cfg.out, inprocFile)
	}
	if sc := res.scale; sc != nil {
		files[scaleFile] = func(w io.Writer) error {
			js, err := sc.scaleJSON()
			if err != nil {
				return err
			}
			_, err = w.Write(js)
			return err
		}
		written += ", " + filepath.Join(res.cfg.out, scaleFile)
	}
	for name, write := range files {
		if err := writeFile(filepath.Join(res.cfg.out, name), write); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "\nwritten: %s\n", written)
	if res.cfg.readme != "" {
		from, err := filepath.Abs(filepath.Dir(res.cfg.readme))
		if err != nil {
			return fmt.Errorf("dabbbench: -readme: %w", err)
		}
		to, err := filepath.Abs(res.cfg.out)
		if err != nil {
			return fmt.Errorf("dabbbench: -readme: %w", err)
		}
		rel, err := filepath.Rel(from, to)
		if err != nil {
			return fmt.Errorf("dabbbench: -readme: %w", err)
		}
		var block strings.Builder
		writeMarkdown(&block, res, filepath.ToSlash(filepath.Join(rel, base+".svg")))
		if err := updateReadme(res.cfg.readme, block.String()); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "updated: %s\n", res.cfg.readme)
	}
	return nil
}

// inprocFile is the file in the output directory that gets go test's
// output of the allocation benchmarks.
const inprocFile = "inproc.txt"

// The markers around the block of a Markdown file that -readme rewrites.
const (
	readmeStart = "<!-- dabbbench:start -->"
	readmeEnd   = "<!-- dabbbench:end -->"
)

// updateReadme replaces what stands between the markers in path with
// block, so the numbers there always come from a run, never from a hand.
func updateReadme(path, block string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("dabbbench: -readme: %w", err)
	}
	out, err := replaceBlock(string(data), block)
	if err != nil {
		return fmt.Errorf("dabbbench: -readme %s: %w", path, err)
	}
	return writeFile(path, func(w io.Writer) error { _, err := io.WriteString(w, out); return err })
}

func replaceBlock(doc, block string) (string, error) {
	i := strings.Index(doc, readmeStart)
	j := strings.Index(doc, readmeEnd)
	if i < 0 || j < i {
		return "", fmt.Errorf("no %s ... %s block", readmeStart, readmeEnd)
	}
	return doc[:i+len(readmeStart)] + "\n" + strings.TrimSpace(block) + "\n" + doc[j:], nil
}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("dabbbench: results: %w", err)
	}
	bw := bufio.NewWriter(f)
	err = write(bw)
	if ferr := bw.Flush(); err == nil {
		err = ferr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("dabbbench: write %s: %w", path, err)
	}
	return nil
}

// mainPoints returns the reported (median) windows of the concurrency
// sweep, in table order.
func (res *results) mainPoints() []point {
	var pts []point
	for _, p := range res.medians() {
		if p.Large == 0 && p.Payload == res.cfg.payload {
			pts = append(pts, p)
		}
	}
	return pts
}

// find returns the sweep point of framework at concurrency c.
func (res *results) find(framework string, c int) (point, bool) {
	for _, p := range res.mainPoints() {
		if p.Framework == framework && p.C == c {
			return p, true
		}
	}
	return point{}, false
}

// mixPair returns a framework's reported (median) small-only and mixed
// windows at -mixc.
func (res *results) mixPair(framework string) (alone, mixed point, ok bool) {
	var a, m bool
	for _, p := range res.medians() {
		if p.Framework != framework || p.C != res.cfg.mixC || p.Payload != "small" {
			continue
		}
		if p.Large == 0 {
			alone, a = p, true
		} else {
			mixed, m = p, true
		}
	}
	return alone, mixed, a && m
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

func payloadDesc(p string) string {
	switch p {
	case "16k":
		return "16 KiB BenchmarkMessage (padded)"
	case "1m":
		return "1 MiB BenchmarkMessage (padded)"
	}
	return "581-byte BenchmarkMessage"
}

func fmtDur(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2f ms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.0f µs", float64(d)/1e3)
}

func writeMarkdown(w io.Writer, res *results, chart string) {
	cfg := res.cfg
	fmt.Fprintf(w, "## dabbbench: %s echo, closed loop, one shared client\n\n", payloadDesc(cfg.payload))
	fmt.Fprintf(w, "Command: `cd bench && go run ./cmd/dabbbench %s`  \n", strings.Join(cfg.args, " "))
	fmt.Fprintf(w, "Run %s, %v; %s, %d CPUs, %s/%s, %s; load average %s before, %s after.  \n",
		res.start.Format("2006-01-02 15:04 MST"), res.end.Sub(res.start).Round(time.Second), cpuModel(),
		runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version(), res.loadFrom, res.loadTo)
	fmt.Fprintf(w, "Per point: median of %d %s; frameworks interleaved per point (every framework in turn, the order rotated each round and reversed in odd rounds, after a wait for quiet processes). "+
		"Each window: %s, %v measured. Servers in their own processes on 127.0.0.1; CPU from getrusage of each process, system calls from /proc/self/io.\n\n",
		cfg.rounds, plural(cfg.rounds, "round", "rounds"), warmupDesc(cfg), cfg.duration)

	fmt.Fprintln(w, "calls/s:")
	fmt.Fprintln(w)
	pivot(w, res, func(p point) string { return fmt.Sprintf("%.0f", p.rate()) })
	fmt.Fprintln(w, "\np99 latency:")
	fmt.Fprintln(w)
	pivot(w, res, func(p point) string { return fmtDur(p.P99) })
	fmt.Fprintln(w, "\nCPU µs per call, client + server:")
	fmt.Fprintln(w)
	pivot(w, res, func(p point) string { return fmt.Sprintf("%.1f", p.usPerCall()) })

	fmt.Fprintf(w, "\nEvery point ([chart](%s)):\n\n", chart)
	fmt.Fprintln(w, "| framework | c | calls/s | spread | p50 | p99 | p99.9 | client CPU s/100k | server CPU s/100k | read+write syscalls/call | errors |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	var uncounted []string // frameworks whose write system calls show as n/a
	for _, p := range res.mainPoints() {
		r, wr := p.syscallsPerCall()
		sys := fmt.Sprintf("%.2f+%.2f", r, wr)
		if !res.writesCounted(p.Framework) {
			sys = fmt.Sprintf("%.2f+n/a", r)
			if !slices.Contains(uncounted, p.Framework) {
				uncounted = append(uncounted, p.Framework)
			}
		}
		errs, _, _ := res.roundErrors(p)
		fmt.Fprintf(w, "| %s | %d | %.0f | %s | %s | %s | %s | %.2f | %.2f | %s | %d |\n", p.Framework, p.C, p.rate(),
			fmtSpread(res, p), fmtDur(p.P50), fmtDur(p.P99), fmtDur(p.P999), p.per100k(p.ClientCPU), p.per100k(p.ServerCPU), sys, errs)
	}
	if cfg.rounds > 1 {
		fmt.Fprintln(w, "\nEach row is the round with the median calls/s, whole; spread is (max − min) ÷ median of the rounds' calls/s; errors count every round, warm-ups included.")
	}
	if len(uncounted) > 0 {
		fmt.Fprintf(w, "\nWrites n/a: %s %s with sendmsg, which /proc/self/io does not count (it counts read, readv, write and writev).\n",
			strings.Join(uncounted, ", "), plural(len(uncounted), "writes", "write"))
	}
	if cfg.mix {
		fmt.Fprintf(w, "\nSmall calls (c=%d) alone, and with %d goroutines making 1 MiB calls on the same client:\n\n", cfg.mixC, cfg.large)
		fmt.Fprintln(w, "| framework | small p99 alone | small p99 with 1 MiB calls | ratio | small calls/s alone | with | 1 MiB calls/s | 1 MiB p99 |")
		fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|")
		for _, f := range cfg.frameworks {
			a, m, ok := res.mixPair(f.Name)
			if !ok {
				continue
			}
			ratio := 0.0
			if a.P99 > 0 {
				ratio = float64(m.P99) / float64(a.P99)
			}
			fmt.Fprintf(w, "| %s | %s | %s | %.1f× | %.0f | %.0f | %.0f | %s |\n", f.Name, fmtDur(a.P99), fmtDur(m.P99),
				ratio, a.rate(), m.rate(), float64(m.LargeN)/m.Window.Seconds(), fmtDur(m.LargeP99))
		}
	}
	writeAllocs(w, res, path.Join(path.Dir(chart), inprocFile))
	writeTargets(w, res)
	writeTLS(w, res)
	writeScale(w, res.scale)
	var errs []string
	for _, p := range res.medians() {
		if n, first, r := res.roundErrors(p); first != "" {
			errs = append(errs, fmt.Sprintf("- %s %s: %d errors over %d %s, first (round %d): %s",
				p.Framework, pointLabel(p), n, len(res.rounds(p)), plural(len(res.rounds(p)), "round", "rounds"), r, first))
		}
	}
	errs = append(errs, prefixAll("- ", res.skipped)...)
	if len(errs) > 0 {
		fmt.Fprintln(w, "\nErrors:")
		fmt.Fprintln(w)
		fmt.Fprintln(w, strings.Join(errs, "\n"))
	}
	fmt.Fprintln(w, "\nSetups:")
	fmt.Fprintln(w)
	for _, f := range cfg.frameworks {
		fmt.Fprintf(w, "- %s: %s\n", f.Name, f.Setup)
	}
}

// writesCounted reports whether /proc/self/io counts the write system
// calls of the framework called name (see frameworks.Framework's
// UncountedWrites).
func (res *results) writesCounted(name string) bool {
	for _, f := range res.cfg.frameworks {
		if f.Name == name {
			return !f.UncountedWrites
		}
	}
	return true
}

// pointLabel names p's point: c=16, or c=16 +2×1MiB for the mixed one.
func pointLabel(p point) string {
	l := fmt.Sprintf("c=%d", p.C)
	if p.Large > 0 {
		l += fmt.Sprintf(" +%d×1MiB", p.Large)
	}
	if p.Payload != "small" {
		l += " " + p.Payload
	}
	return l
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// warmupDesc describes the warm-up of each window.
func warmupDesc(cfg config) string {
	if cfg.rounds == 1 || cfg.warmupFor(1) == cfg.warmup {
		return fmt.Sprintf("%v warm-up", cfg.warmup)
	}
	return fmt.Sprintf("%v warm-up (%v in rounds after the first)", cfg.warmup, cfg.warmupFor(1))
}

// fmtSpread formats the spread of p's rounds, or "-" with one round.
func fmtSpread(res *results, p point) string {
	if len(res.rounds(p)) < 2 {
		return "-"
	}
	return fmt.Sprintf("%.0f %%", 100*res.spread(p))
}

func prefixAll(prefix string, s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = prefix + v
	}
	return out
}

// pivot writes a framework × concurrency table of cell(point).
func pivot(w io.Writer, res *results, cell func(point) string) {
	fmt.Fprint(w, "| framework |")
	for _, c := range res.cfg.conc {
		fmt.Fprintf(w, " c=%d |", c)
	}
	fmt.Fprint(w, "\n|---|")
	for range res.cfg.conc {
		fmt.Fprint(w, "---:|")
	}
	fmt.Fprintln(w)
	for _, f := range res.cfg.frameworks {
		fmt.Fprintf(w, "| %s |", f.Name)
		for _, c := range res.cfg.conc {
			v := "-"
			if p, ok := res.find(f.Name, c); ok {
				v = cell(p)
			}
			fmt.Fprintf(w, " %s |", v)
		}
		fmt.Fprintln(w)
	}
}

// csvHeader is the first row of the CSV: one row per window, every round,
// the reported one marked by median = true. calls, calls_per_s and the
// latencies are of the calls of payload (the small ones at the -mix
// point); large_calls and large_p99_us of the 1 MiB ones. The CPU and
// system call columns are per call of all calls of the window, calls +
// large_calls: the processes' CPU and system calls cannot be split
// between the two. errors counts the failed calls of the window and of
// its warm-up; first_error says when the first was outside the window.
var csvHeader = []string{"framework", "payload", "c", "large", "calls", "window_s", "calls_per_s",
	"p50_us", "p99_us", "p999_us", "max_us", "client_cpu_s_per_100k", "server_cpu_s_per_100k",
	"cpu_us_per_call", "client_reads_per_call", "client_writes_per_call",
	"server_reads_per_call", "server_writes_per_call", "errors", "first_error", "large_calls", "large_p99_us",
	"round", "median"}

// writeCSV writes every window of every round, by framework, point and
// round.
func writeCSV(w io.Writer, res *results) error {
	cw := csv.NewWriter(w)
	cw.Write(csvHeader)
	us := func(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e3, 'f', 1, 64) }
	f2 := func(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }
	for _, p := range res.sorted() {
		per := func(n uint64) string {
			if p.allCalls() == 0 {
				return "0"
			}
			return f2(float64(n) / float64(p.allCalls()))
		}
		cliW, srvW := per(p.Client.sysw), per(p.Server.sysw)
		if !res.writesCounted(p.Framework) {
			cliW, srvW = "", "" // not counted: see writesCounted
		}
		cw.Write([]string{p.Framework, p.Payload, strconv.Itoa(p.C), strconv.Itoa(p.Large),
			strconv.FormatUint(p.Calls, 10), f2(p.Window.Seconds()), f2(p.rate()),
			us(p.P50), us(p.P99), us(p.P999), us(p.Max), f2(p.per100k(p.ClientCPU)), f2(p.per100k(p.ServerCPU)),
			f2(p.usPerCall()), per(p.Client.sysr), cliW, per(p.Server.sysr), srvW,
			strconv.FormatUint(p.Errors, 10), p.FirstErr,
			strconv.FormatUint(p.LargeN, 10), us(p.LargeP99),
			strconv.Itoa(p.Round), strconv.FormatBool(p.Median)})
	}
	cw.Flush()
	return cw.Error()
}
