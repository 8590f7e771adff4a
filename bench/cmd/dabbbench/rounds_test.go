package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/bench/frameworks"
	benchpb "github.com/dabbrpc/dabb/bench/proto"
)

func TestRotation(t *testing.T) {
	for _, tc := range []struct {
		r, n int
		want []int
	}{
		{0, 3, []int{0, 1, 2}},
		{1, 3, []int{1, 0, 2}}, // odd rounds backwards from r mod n
		{2, 3, []int{2, 0, 1}},
		{3, 3, []int{0, 2, 1}},
		{4, 2, []int{0, 1}},
		{5, 2, []int{1, 0}},
		{1, 6, []int{1, 0, 5, 4, 3, 2}},
		{7, 1, []int{0}},
		{0, 0, []int{}},
	} {
		t.Run(fmt.Sprintf("round %d of %d", tc.r, tc.n), func(t *testing.T) {
			if got := rotation(tc.r, tc.n); !slices.Equal(got, tc.want) {
				t.Fatalf("rotation(%d, %d) = %v, want %v", tc.r, tc.n, got, tc.want)
			}
		})
	}
}

// TestRotationStartsAtRModN checks the rule bench/README.md states: round
// r starts at framework r mod n, even rounds go on forwards from there and
// odd rounds backwards, and every round visits each framework once.
func TestRotationStartsAtRModN(t *testing.T) {
	for n := 1; n <= 6; n++ {
		for r := range 2*n + 1 {
			order := rotation(r, n)
			if len(order) != n || order[0] != r%n {
				t.Errorf("n=%d round %d (from 0): order %v, want %d entries starting at %d", n, r, order, n, r%n)
				continue
			}
			step := 1
			if r%2 == 1 {
				step = -1
			}
			seen := make([]bool, n)
			for i, f := range order {
				if want := ((r+step*i)%n + n) % n; f != want {
					t.Errorf("n=%d round %d: order %v has %d at %d, want %d", n, r, order, f, i, want)
				}
				seen[f] = true
			}
			if slices.Contains(seen, false) {
				t.Errorf("n=%d round %d: order %v misses a framework", n, r, order)
			}
		}
	}
	// The defaults: 6 frameworks, 3 rounds. Each round opens with another
	// framework (before, dabb opened rounds 1 and 2).
	var firsts []int
	for r := range 3 {
		firsts = append(firsts, rotation(r, 6)[0])
	}
	if !slices.Equal(firsts, []int{0, 1, 2}) {
		t.Errorf("6 frameworks, 3 rounds: first framework per round %v, want [0 1 2]", firsts)
	}
}

// TestRotationTwoFrameworksAlternate: with two frameworks (the README's
// "-frameworks dabb,grpc") the order must change from round to round, or
// framework 0 would always be measured first and framework 1 always right
// after it.
func TestRotationTwoFrameworksAlternate(t *testing.T) {
	for r := range 6 {
		want := []int{0, 1}
		if r%2 == 1 {
			want = []int{1, 0}
		}
		if got := rotation(r, 2); !slices.Equal(got, want) {
			t.Errorf("2 frameworks, round %d (from 0): order %v, want %v", r, got, want)
		}
	}
}

func TestWarmupFor(t *testing.T) {
	for _, tc := range []struct {
		warmup time.Duration
		r      int
		want   time.Duration
		name   string
	}{
		{time.Second, 0, time.Second, "first round: all of -warmup"},
		{time.Second, 1, 500 * time.Millisecond, "later: half"},
		{time.Second, 5, 500 * time.Millisecond, "later: half"},
		{300 * time.Millisecond, 1, 250 * time.Millisecond, "later: at least 250ms"},
		{100 * time.Millisecond, 1, 100 * time.Millisecond, "never more than -warmup"},
		{0, 2, 0, "no warm-up asked for"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config{warmup: tc.warmup}
			if got := cfg.warmupFor(tc.r); got != tc.want {
				t.Fatalf("-warmup %v, round %d: warm-up %v, want %v", tc.warmup, tc.r, got, tc.want)
			}
		})
	}
}

// win is one window of a made-up run: framework, round, calls in a 1 s
// window, errors.
type win struct {
	fw     string
	round  int
	calls  uint64
	errors uint64
}

func made(c int, ws ...win) []point {
	var pts []point
	for _, w := range ws {
		p := point{Framework: w.fw, Round: w.round, Payload: "small", C: c, Calls: w.calls, Window: time.Second,
			P99: time.Duration(w.calls) * time.Microsecond, Errors: w.errors}
		if w.errors > 0 {
			p.FirstErr = fmt.Sprintf("boom in round %d", w.round)
		}
		pts = append(pts, p)
	}
	return pts
}

func TestSelectMedians(t *testing.T) {
	for _, tc := range []struct {
		name string
		pts  []point
		want map[string]int // framework → round reported
	}{
		{"odd: the middle", made(1, win{"a", 1, 10, 0}, win{"a", 2, 30, 0}, win{"a", 3, 20, 0}), map[string]int{"a": 3}},
		{"even: the lower middle", made(1, win{"a", 1, 10, 0}, win{"a", 2, 40, 0}, win{"a", 3, 30, 0}, win{"a", 4, 20, 0}), map[string]int{"a": 4}},
		{"two: the slower", made(1, win{"a", 1, 50, 0}, win{"a", 2, 40, 0}), map[string]int{"a": 2}},
		{"one", made(1, win{"a", 1, 50, 0}), map[string]int{"a": 1}},
		{"ties rank by round", made(1, win{"a", 1, 5, 0}, win{"a", 2, 5, 0}, win{"a", 3, 5, 0}), map[string]int{"a": 2}},
		{"frameworks apart", made(1, win{"a", 1, 10, 0}, win{"b", 1, 99, 0}, win{"a", 2, 30, 0}, win{"b", 2, 1, 0}, win{"a", 3, 20, 0}, win{"b", 3, 50, 0}),
			map[string]int{"a": 3, "b": 3}},
		{"a dropped framework's rounds", made(1, win{"a", 1, 10, 0}, win{"b", 1, 7, 0}, win{"a", 2, 30, 0}, win{"a", 3, 20, 0}),
			map[string]int{"a": 3, "b": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pts := slices.Clone(tc.pts)
			pts[0].Median = true // a stale mark must not survive
			selectMedians(pts)
			got := map[string]int{}
			for _, p := range pts {
				if !p.Median {
					continue
				}
				if r, dup := got[p.Framework]; dup {
					t.Fatalf("%s: rounds %d and %d both marked median", p.Framework, r, p.Round)
				}
				got[p.Framework] = p.Round
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("median rounds %v, want %v", got, tc.want)
			}
		})
	}
}

// TestSweep runs the sweep with a stand-in for the measurement: it checks
// the interleaving and rotation, the shorter warm-up of later rounds, the
// progress lines, that a framework whose window fails is dropped, and that
// a window that stalls ends the sweep.
func TestSweep(t *testing.T) {
	cfg, err := parseFlags([]string{"-frameworks", "dabb,grpc,raw", "-c", "1,2", "-mix=false", "-rounds", "3",
		"-warmup", "1s", "-duration", "2s", "-allocs=false"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		failAt   string // "framework round label" of the failing window, or ""
		stall    bool   // the failing window stalls (errStalled)
		want     []string
		wantLast string // the last progress line's counter
		wantErr  string // grpc's err
		sweepErr string // sweep's error, or ""
	}{
		{
			name: "all measured",
			want: []string{
				"1 c=1 dabb", "1 c=1 grpc", "1 c=1 raw", "1 c=2 dabb", "1 c=2 grpc", "1 c=2 raw",
				"2 c=1 grpc", "2 c=1 dabb", "2 c=1 raw", "2 c=2 grpc", "2 c=2 dabb", "2 c=2 raw",
				"3 c=1 raw", "3 c=1 dabb", "3 c=1 grpc", "3 c=2 raw", "3 c=2 dabb", "3 c=2 grpc",
			},
			wantLast: "[18/18] round 3/3 c=2 grpc",
		},
		{
			name:   "grpc fails in round 2 and is dropped",
			failAt: "grpc 2 c=1",
			want: []string{
				"1 c=1 dabb", "1 c=1 grpc", "1 c=1 raw", "1 c=2 dabb", "1 c=2 grpc", "1 c=2 raw",
				"2 c=1 grpc", "2 c=1 dabb", "2 c=1 raw", "2 c=2 dabb", "2 c=2 raw",
				"3 c=1 raw", "3 c=1 dabb", "3 c=2 raw", "3 c=2 dabb",
			},
			wantLast: "[15/15] round 3/3 c=2 dabb",
			wantErr:  "dropped in round 2/3 at c=1: stand-in failure",
		},
		{
			name:   "grpc stalls in round 2: the sweep stops",
			failAt: "grpc 2 c=1",
			stall:  true,
			want: []string{
				"1 c=1 dabb", "1 c=1 grpc", "1 c=1 raw", "1 c=2 dabb", "1 c=2 grpc", "1 c=2 raw",
				"2 c=1 grpc",
			},
			wantLast: "[7/18] round 2/3 c=1 grpc",
			wantErr:  "stalled in round 2/3 at c=1: dabbbench: no call completed",
			sweepErr: "dabbbench: grpc: stalled in round 2/3 at c=1: dabbbench: no call completed for 30s in the window",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ents []*entrant
			for _, f := range cfg.frameworks {
				ents = append(ents, &entrant{f: frameworks.Framework{Name: f.Name}})
			}
			var stderr bytes.Buffer
			prog := newProgress(&stderr, cfg)
			var got []string
			measure := func(e *entrant, w window) (point, error) {
				got = append(got, fmt.Sprintf("%d %s %s", w.round, w.label, e.f.Name))
				if want := cfg.warmupFor(w.round - 1); w.warmup != want || w.duration != cfg.duration {
					t.Errorf("round %d: warm-up %v and window %v, want %v and %v", w.round, w.warmup, w.duration, want, cfg.duration)
				}
				if fmt.Sprintf("%s %d %s", e.f.Name, w.round, w.label) == tc.failAt {
					if tc.stall {
						return point{}, fmt.Errorf("%w for 30s in the window", errStalled)
					}
					return point{}, errors.New("stand-in failure")
				}
				return point{Payload: w.payload, C: w.c, Calls: 100, Window: time.Second}, nil
			}
			pts, err := sweep(ents, cfg, prog, measure)
			prog.stop()
			if tc.sweepErr == "" && err != nil || tc.sweepErr != "" && (!errors.Is(err, errStalled) || !strings.Contains(err.Error(), tc.sweepErr)) {
				t.Errorf("sweep's error %v, want %q", err, tc.sweepErr)
			}
			for _, e := range ents {
				if e.stalled != (tc.stall && e.f.Name == "grpc") {
					t.Errorf("%s marked stalled = %v", e.f.Name, e.stalled)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("windows\n%q\nwant\n%q", got, tc.want)
			}
			if len(pts) != len(tc.want)-btoi(tc.failAt != "") {
				t.Errorf("%d points, want %d", len(pts), len(tc.want)-btoi(tc.failAt != ""))
			}
			for i, p := range pts {
				if p.Round < 1 || p.Round > cfg.rounds || p.Framework == "" {
					t.Errorf("point %d: framework %q round %d", i, p.Framework, p.Round)
				}
			}
			for _, e := range ents {
				switch {
				case tc.wantErr != "" && e.f.Name == "grpc":
					if e.err == nil || !strings.Contains(e.err.Error(), tc.wantErr) {
						t.Errorf("grpc's err = %v, want %q", e.err, tc.wantErr)
					}
				case e.err != nil:
					t.Errorf("%s dropped: %v", e.f.Name, e.err)
				}
			}
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			var last string
			for _, l := range lines {
				if strings.HasPrefix(l, "dabbbench: [") {
					last = l
				}
			}
			if !strings.Contains(last, tc.wantLast) {
				t.Errorf("last progress line %q, want %q in it:\n%s", last, tc.wantLast, stderr.String())
			}
			if !strings.Contains(stderr.String(), "dabbbench: [1/18] round 1/3 c=1 dabb: 3s, about ") {
				t.Errorf("first progress line wrong:\n%s", stderr.String())
			}
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// madeRun returns the results of a made-up run of dabb and raw at c=1,
// three rounds, measured in the interleaved order, with -mix at c=2.
func madeRun(t *testing.T) *results {
	t.Helper()
	cfg, err := parseFlags([]string{"-frameworks", "dabb,raw", "-c", "1", "-mixc", "2", "-large", "1", "-rounds", "3",
		"-warmup", "1s", "-duration", "4s", "-allocs=false", "-out", t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	var pts []point
	c1 := made(1, win{"dabb", 1, 10, 1}, win{"raw", 1, 40, 0}, win{"raw", 2, 50, 0}, win{"dabb", 2, 30, 2},
		win{"dabb", 3, 20, 0}, win{"raw", 3, 60, 0})
	alone := made(2, win{"dabb", 1, 100, 0}, win{"dabb", 2, 300, 0}, win{"dabb", 3, 200, 0})
	mixed := made(2, win{"dabb", 1, 100, 0}, win{"dabb", 2, 300, 0}, win{"dabb", 3, 200, 0})
	for i := range mixed {
		mixed[i].Large, mixed[i].LargeN = 1, 4
		mixed[i].P99 = time.Duration(i+1) * time.Millisecond // 1, 2, 3 ms: the median round, 3, has 3 ms
	}
	pts = append(pts, c1...)
	pts = append(pts, alone...)
	pts = append(pts, mixed...)
	selectMedians(pts)
	return &results{cfg: cfg, points: pts, start: time.Now(), end: time.Now()}
}

func TestWriteCSVRounds(t *testing.T) {
	res := madeRun(t)
	rows := csvRows(t, res)
	if !slices.Equal(rows[0], csvHeader) || rows[0][len(rows[0])-2] != "round" || rows[0][len(rows[0])-1] != "median" {
		t.Fatalf("header %q, want %q ending in round, median", rows[0], csvHeader)
	}
	var got []string
	for _, r := range rows[1:] {
		if len(r) != len(csvHeader) {
			t.Fatalf("row %q has %d columns, want %d", r, len(r), len(csvHeader))
		}
		// framework, c, large, calls/s, round, median
		got = append(got, strings.Join([]string{r[0], r[2], r[3], r[6], r[len(r)-2], r[len(r)-1]}, " "))
	}
	want := []string{
		"dabb 1 0 10.000 1 false", "dabb 1 0 30.000 2 false", "dabb 1 0 20.000 3 true",
		"dabb 2 0 100.000 1 false", "dabb 2 0 300.000 2 false", "dabb 2 0 200.000 3 true",
		"dabb 2 1 100.000 1 false", "dabb 2 1 300.000 2 false", "dabb 2 1 200.000 3 true",
		"raw 1 0 40.000 1 false", "raw 1 0 50.000 2 true", "raw 1 0 60.000 3 false",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("rows\n%q\nwant\n%q", got, want)
	}
}

func TestWriteMarkdownRounds(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*results)
		want []string
		not  []string
	}{
		{
			name: "three rounds",
			want: []string{
				"Per point: median of 3 rounds; frameworks interleaved per point",
				"1s warm-up (500ms in rounds after the first), 4s measured",
				"| dabb | 20 |\n| raw | 50 |\n", // calls/s pivot: the median rounds
				// dabb c=1: the median round's numbers, (30 − 10) ÷ 20 spread,
				// the errors of every round.
				"| dabb | 1 | 20 | 100 % | - | 20 µs | - | 0.00 | 0.00 | 0.00+0.00 | 3 |\n",
				"| raw | 1 | 50 | 40 % |",
				"- dabb c=1: 3 errors over 3 rounds, first (round 1): boom in round 1",
				// the mix ratio: the median rounds' p99, 3 ms ÷ 200 µs
				"| dabb | 200 µs | 3.00 ms | 15.0× |",
			},
			not: []string{"not measured"},
		},
		{
			name: "one round",
			edit: func(res *results) {
				res.cfg.rounds = 1
				res.points = made(1, win{"dabb", 1, 10, 0}, win{"raw", 1, 40, 0})
				selectMedians(res.points)
			},
			want: []string{"median of 1 round;", "Each window: 1s warm-up, 4s", "| dabb | 1 | 10 | - |"},
			not:  []string{"Errors:", "rounds after the first"},
		},
		{
			name: "a framework dropped",
			edit: func(res *results) {
				res.skipped = []string{"raw: dropped in round 2/3 at c=1: dabbbench: server process not answering",
					"grpc: not measured: dabbbench: first call: refused"}
			},
			want: []string{"\n- raw: dropped in round 2/3 at c=1: dabbbench: server process not answering\n",
				"\n- grpc: not measured: dabbbench: first call: refused\n"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := madeRun(t)
			if tc.edit != nil {
				tc.edit(res)
			}
			var b strings.Builder
			writeMarkdown(&b, res, "bench.svg")
			md := b.String()
			checkText(t, md, tc.want, tc.not)
		})
	}
}

func TestClientProfile(t *testing.T) {
	for _, tc := range []struct {
		frameworks, want string
	}{
		{"dabb", "dabb-client.pprof"},
		{"raw", "raw-client.pprof"},
		{"dabb,raw", "all-client.pprof"},
	} {
		t.Run(tc.frameworks, func(t *testing.T) {
			cfg, err := parseFlags([]string{"-frameworks", tc.frameworks})
			if err != nil {
				t.Fatal(err)
			}
			if got := clientProfile(cfg); got != tc.want {
				t.Fatalf("client profile %q, want %q", got, tc.want)
			}
		})
	}
}

// failingClient is a client whose calls fail.
type failingClient struct{}

func (failingClient) Echo(context.Context, *benchpb.BenchmarkMessage) (*benchpb.BenchmarkMessage, error) {
	return nil, errors.New("stand-in refusal")
}
func (failingClient) Close() error { return nil }

// TestStartEntrant starts real server processes of raw and fails the dial
// or the first call: the entrant is not returned and its server process
// is stopped (the goroutines waiting for it end: goleak checks).
func TestStartEntrant(t *testing.T) {
	raw := frameworks.Raw()
	for _, tc := range []struct {
		name    string
		dial    func(string) (frameworks.Client, error)
		wantErr string
	}{
		{"ok", raw.Dial, ""},
		{"dial fails", func(string) (frameworks.Client, error) { return nil, errors.New("stand-in dial error") }, "dial 127.0.0.1:"},
		{"first call fails", func(string) (frameworks.Client, error) { return failingClient{}, nil }, "first call: stand-in refusal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := raw
			f.Dial = tc.dial
			e, err := startEntrant(f, config{payload: "small"}, io.Discard)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if e.ch == nil || e.client == nil {
					t.Fatalf("entrant %+v lacks its server or client", e)
				}
				e.close()
				e.close() // a second close is harmless
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || e != nil {
				t.Fatalf("startEntrant = %v, %v; want no entrant and an error with %q", e, err, tc.wantErr)
			}
		})
	}
}

// TestRunDropsFailingFramework runs raw and a framework whose server
// process cannot start: raw is measured in every round, the other is
// reported as not measured.
func TestRunDropsFailingFramework(t *testing.T) {
	out := t.TempDir()
	cfg, err := parseFlags([]string{"-frameworks", "raw", "-c", "2", "-mix=false", "-rounds", "2", "-duration", "100ms",
		"-warmup", "20ms", "-allocs=false", "-scale=false", "-out", out})
	if err != nil {
		t.Fatal(err)
	}
	broken := frameworks.Raw()
	broken.Name = "broken" // the server process knows no such framework and exits
	cfg.frameworks = []frameworks.Framework{broken, cfg.frameworks[0]}
	var stdout, stderr bytes.Buffer
	if err := run(cfg, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\nstderr:\n%s", err, stderr.String())
	}
	md, err := os.ReadFile(filepath.Join(out, "bench.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), "- broken: not measured: ") || !strings.Contains(string(md), "| raw | 2 | ") {
		t.Errorf("bench.md does not report broken as not measured and raw as measured:\n%s", md)
	}
	rows := readCSV(t, filepath.Join(out, "bench.csv"))
	if len(rows) != 3 || rows[1][0] != "raw" || rows[2][0] != "raw" || rows[1][len(rows[1])-2] != "1" || rows[2][len(rows[2])-2] != "2" {
		t.Fatalf("bench.csv rows %q, want raw's rounds 1 and 2", rows)
	}
	if !strings.Contains(stderr.String(), "[2/2] round 2/2 c=2 raw") {
		t.Errorf("the progress did not drop broken's windows:\n%s", stderr.String())
	}
}

// settle waits at least one probe and gives up after settleMax.
func TestSettleBounds(t *testing.T) {
	waited := settle(nil)
	if waited < settleProbe || waited > settleMax+settleProbe {
		t.Fatalf("settle waited %v, want between %v and %v", waited, settleProbe, settleMax+settleProbe)
	}
}
