package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/dabbrpc/dabb/bench/frameworks"
	"github.com/dabbrpc/dabb/bench/internal/leaktest"
	"github.com/dabbrpc/dabb/internal/proctest"
)

// TestMain makes the test binary stand in for the command: started as a
// server process by a test, it serves.
func TestMain(m *testing.M) {
	if os.Getenv(roleEnv) == "server" {
		if err := serverMain(os.Args[1:], os.Stdin, os.Stdout); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m, leaktest.Ignore()...)
}

// TestRun runs a short benchmark of every framework with server processes,
// two rounds, and checks the table, CSV and chart it writes.
// Its windows are 250 ms: in 100 ms, on a loaded machine with the race
// detector, a 1 MiB call of the -mix point could hold a single-connection
// framework's small calls for the whole window.
func TestRun(t *testing.T) {
	out := t.TempDir()
	cfg, err := parseFlags([]string{"-c", "1,4", "-duration", "250ms", "-warmup", "50ms", "-rounds", "2", "-mixc", "2", "-large", "1", "-allocs=false", "-out", out})
	if err != nil {
		t.Fatal(err)
	}
	cfg.scaleCfg = tinyScale()
	var stdout, stderr bytes.Buffer
	if err := run(cfg, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\nstderr:\n%s", err, stderr.String())
	}
	md, err := os.ReadFile(filepath.Join(out, "bench.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| dabb |", "| dabb-idem |", "| grpc |", "| rpcx |", "| netrpc |", "| kitex |", "| kitex-pool |", "| raw |", "| raw-conn |", "c=4", "1 MiB calls",
		"median of 2 rounds; frameworks interleaved per point"} {
		if !bytes.Contains(md, []byte(want)) {
			t.Errorf("bench.md lacks %q:\n%s", want, md)
		}
	}
	if !bytes.Contains(md, []byte("### Scale: what each resource costs")) || bytes.Contains(md, []byte("Scale errors")) {
		t.Errorf("bench.md lacks the scale section, or it has errors:\n%s", md)
	}
	if _, err := os.Stat(filepath.Join(out, scaleFile)); err != nil {
		t.Errorf("no %s: %v", scaleFile, err)
	}
	if !bytes.Contains(md, []byte("| c=1 calls/s, dabb ÷ raw |")) {
		t.Errorf("bench.md lacks the targets table:\n%s", md)
	}
	if strings.Contains(string(md), "Errors:") {
		t.Errorf("the run reported errors:\n%s", md)
	}
	rows := readCSV(t, filepath.Join(out, "bench.csv"))
	// Every framework × (2 concurrency points + alone and mixed at c=2) × 2
	// rounds, and a header.
	n := len(frameworks.All())
	if len(rows) != 1+n*4*2 {
		t.Fatalf("bench.csv has %d rows, want %d", len(rows), 1+n*4*2)
	}
	// dabb's rows make calls in every round. A peer's point may stall
	// for one 250 ms window on a loaded machine under the race detector
	// (kitex-pool did, once, with no error), but not in every round.
	medians := map[string]int{}
	called := map[string]bool{}
	for _, r := range rows[1:] {
		point := strings.Join(r[:4], " ")
		if r[4] == "0" && strings.HasPrefix(r[0], "dabb") {
			t.Errorf("point %v made no calls", r[:4])
		}
		if r[4] != "0" {
			called[point] = true
		}
		if r[len(r)-1] == "true" {
			medians[point]++
		}
	}
	for point := range medians {
		if !called[point] {
			t.Errorf("point %s made no calls in any round", point)
		}
	}
	if len(medians) != n*4 {
		t.Errorf("bench.csv marks %d points' medians, want %d: %v", len(medians), n*4, medians)
	}
	for k, n := range medians {
		if n != 1 {
			t.Errorf("point %s has %d median rounds, want 1", k, n)
		}
	}
	svg, err := os.ReadFile(filepath.Join(out, "bench.svg"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(svg, []byte("<svg")) || bytes.Count(svg, []byte("<polyline")) != 2*n {
		t.Errorf("bench.svg: want an <svg> with %d lines (%d frameworks × 2 panels):\n%.400s", 2*n, n, svg)
	}
	windows := n * 4 * 2
	if !strings.Contains(stderr.String(), fmt.Sprintf("[1/%d] round 1/2 c=1 dabb", windows)) ||
		!strings.Contains(stderr.String(), fmt.Sprintf("[%d/%d] round 2/2 c=2 +1×1MiB ", windows, windows)) {
		t.Errorf("no progress line on stderr:\n%s", stderr.String())
	}
}

// TestRunTLS runs the TLS frameworks beside their plaintext selves, one
// short window each, with server processes: the servers take the run's
// certificates from the environment, every call passes the reply check,
// and the table has their rows and the TLS section.
func TestRunTLS(t *testing.T) {
	out := t.TempDir()
	cfg, err := parseFlags([]string{"-frameworks", "dabb,grpc,dabb-tls,grpc-tls", "-c", "1", "-duration", "100ms", "-warmup", "50ms",
		"-rounds", "1", "-mix=false", "-allocs=false", "-scale=false", "-out", out})
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if err := run(cfg, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\nstderr:\n%s", err, stderr.String())
	}
	md, err := os.ReadFile(filepath.Join(out, "bench.md"))
	if err != nil {
		t.Fatal(err)
	}
	checkText(t, string(md), []string{"| dabb-tls | 1 |", "| grpc-tls | 1 |", "\nOver TLS 1.3 (this run;", "| c=1 | ",
		"- dabb-tls: dabb's setup over TLS 1.3"}, []string{"Errors:"})
	calls, errs := slices.Index(csvHeader, "calls"), slices.Index(csvHeader, "errors")
	for _, r := range readCSV(t, filepath.Join(out, "bench.csv"))[1:] {
		if r[calls] == "0" || r[errs] != "0" {
			t.Errorf("point %v: %s calls, %s errors; want calls and no errors", r[:4], r[calls], r[errs])
		}
	}
}

// TestRunDubbo runs the Dubbo rows, one short window each with its
// 1 MiB point: dabb-hessian2 with its server process, dubbo-go as its
// built program's server and client processes. Every call passes the
// reply check, and both processes' CPU and system calls are counted.
func TestRunDubbo(t *testing.T) {
	out := t.TempDir()
	cfg, err := parseFlags([]string{"-frameworks", "dubbo", "-c", "2", "-duration", "1s", "-warmup", "100ms",
		"-rounds", "1", "-mixc", "2", "-large", "1", "-allocs=false", "-scale=false", "-out", out})
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	err = run(cfg, &stdout, &stderr)
	if errors.Is(err, frameworks.ErrOffline) || strings.Contains(stderr.String(), frameworks.ErrOffline.Error()) {
		proctest.Missing(t, "dubbo-go: the Go module proxy is unreachable, so its program cannot be built:\n%s", stderr.String())
	}
	if err != nil {
		t.Fatalf("run: %v\nstderr:\n%s", err, stderr.String())
	}
	md, err := os.ReadFile(filepath.Join(out, "bench.md"))
	if err != nil {
		t.Fatal(err)
	}
	checkText(t, string(md), []string{"| dabb-hessian2 | 2 |", "| dubbo-go | 2 |", "- dubbo-go: dubbo.apache.org/dubbo-go/v3 v3.3.1"},
		[]string{"Errors:", "not measured"})
	h := func(name string) int { return slices.Index(csvHeader, name) }
	rows := readCSV(t, filepath.Join(out, "bench.csv"))[1:]
	if len(rows) != 2*2 {
		t.Fatalf("bench.csv has %d points, want 4 (2 frameworks × c=2 alone and with 1 MiB calls)", len(rows))
	}
	for _, r := range rows {
		if r[h("calls")] == "0" || r[h("errors")] != "0" {
			t.Errorf("point %v: %s calls, %s errors; want calls and no errors", r[:4], r[h("calls")], r[h("errors")])
		}
		for _, col := range []string{"client_cpu_s_per_100k", "server_cpu_s_per_100k", "client_reads_per_call", "client_writes_per_call", "server_reads_per_call", "server_writes_per_call"} {
			if i := h(col); i < 0 {
				t.Fatalf("bench.csv has no column %s: %v", col, csvHeader)
			} else if v, err := strconv.ParseFloat(r[i], 64); err != nil || v <= 0 {
				t.Errorf("point %v: %s = %q, want > 0", r[:4], col, r[i])
			}
		}
	}
}

func TestParseFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		ok   bool
	}{
		{"defaults", nil, true},
		{"subset", []string{"-frameworks", "dabb,raw", "-c", "1,2"}, true},
		{"TLS frameworks", []string{"-frameworks", "dabb,grpc,dabb-tls,grpc-tls", "-c", "1,128"}, true},
		{"no allocations", []string{"-allocs=false"}, true},
		{"groups", []string{"-frameworks", "default,dubbo"}, true},
		{"Dubbo frameworks", []string{"-frameworks", "dabb-hessian2,dubbo-go"}, true},
		{"group twice", []string{"-frameworks", "dubbo,dubbo-go"}, false},
		{"unknown framework", []string{"-frameworks", "dabb,thrift"}, false},
		{"bad concurrency", []string{"-c", "1,x"}, false},
		{"zero concurrency", []string{"-c", "0"}, false},
		{"bad payload", []string{"-payload", "2m"}, false},
		{"zero duration", []string{"-duration", "0s"}, false},
		{"one round", []string{"-rounds", "1"}, true},
		{"zero rounds", []string{"-rounds", "0"}, false},
		{"concurrency twice", []string{"-c", "1,16,1"}, false},
		{"framework twice", []string{"-frameworks", "dabb,raw,dabb"}, false},
		{"stray argument", []string{"extra"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseFlags(tc.args)
			if tc.ok && err != nil {
				t.Fatalf("parseFlags(%q): %v", tc.args, err)
			}
			if !tc.ok && !errors.Is(err, ErrUsage) {
				t.Fatalf("parseFlags(%q) = %v, want ErrUsage", tc.args, err)
			}
		})
	}
}

func TestServerProtocol(t *testing.T) {
	for _, tc := range []struct {
		name, framework, input string
		wantErr                bool
		want                   []string
	}{
		{"samples", "raw", "sample\nsample\n", false, []string{"addr 127.0.0.1:", "sample ", "sample "}},
		{"unknown command", "dabb", "what\n", false, []string{"addr ", "error unknown command"}},
		{"unknown framework", "thrift", "", true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := serverMain([]string{"-server", "-framework", tc.framework}, strings.NewReader(tc.input), &out)
			if tc.wantErr {
				if err == nil {
					t.Fatal("serverMain succeeded, want an error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSpace(out.String()), "\n")
			if len(lines) != len(tc.want) {
				t.Fatalf("server said %q, want %d lines", lines, len(tc.want))
			}
			for i, w := range tc.want {
				if !strings.HasPrefix(lines[i], ctlPrefix+" "+w) {
					t.Errorf("line %d = %q, want prefix %q", i, lines[i], ctlPrefix+" "+w)
				}
				if strings.HasPrefix(w, "sample") {
					if _, err := parseSample(strings.TrimPrefix(lines[i], ctlPrefix+" sample ")); err != nil {
						t.Error(err)
					}
				}
			}
		})
	}
}

func TestReplaceBlock(t *testing.T) {
	doc := "# T\n\n" + readmeStart + "\nold\n" + readmeEnd + "\ntail\n"
	got, err := replaceBlock(doc, "new table\n")
	if err != nil {
		t.Fatal(err)
	}
	want := "# T\n\n" + readmeStart + "\nnew table\n" + readmeEnd + "\ntail\n"
	if got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	if _, err := replaceBlock("no markers", "x"); err == nil {
		t.Fatal("a document without markers was accepted")
	}
}
