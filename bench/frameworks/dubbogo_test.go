package frameworks

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/bench/hist"
	benchpb "github.com/dabbrpc/dabb/bench/proto"
	"github.com/dabbrpc/dabb/internal/proctest"
)

// buildProgram builds f's program for the test. Without the module proxy
// the test is skipped, or fails when $CI is "true".
func buildProgram(t *testing.T, f Framework) string {
	t.Helper()
	bin, err := BuildProgram(context.Background(), f, "..", t.TempDir())
	if errors.Is(err, ErrOffline) {
		proctest.Missing(t, "%s: the Go module proxy is unreachable, so its program cannot be built: %v", f.Name, err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// process is a program started by a test, its control lines read from
// standard output.
type process struct {
	in    io.WriteCloser
	lines chan string
	cmd   *exec.Cmd
}

func startProcess(t *testing.T, bin, prefix string, args ...string) *process {
	t.Helper()
	cmd := exec.Command(bin, args...)
	stderr := proctest.NewTail(8 << 10)
	cmd.Stderr = stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{in: in, lines: make(chan string, 16), cmd: cmd}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), prefix+" "); ok {
				p.lines <- rest
			}
		}
		close(p.lines)
	}()
	t.Cleanup(func() {
		in.Close() // the program exits when its stdin closes
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		if err := cmd.Wait(); err != nil && !t.Failed() {
			t.Errorf("%s %v: %v\n%s", filepath.Base(bin), args, err, stderr)
		}
	})
	return p
}

// next returns the next control line, waiting up to d.
func (p *process) next(t *testing.T, d time.Duration) string {
	t.Helper()
	select {
	case line, ok := <-p.lines:
		if !ok {
			t.Fatal("the program exited")
		}
		return line
	case <-time.After(d):
		t.Fatalf("no line from the program within %v", d)
	}
	return ""
}

// TestProgram builds the dubbo-go program and runs a window the way
// dabbbench does: the server prints its address and answers samples;
// the client, once ready, runs 8 goroutines of standard calls and 2 of
// 1 MiB calls, and reports its samples, its counts with no error, and
// histograms that hist reads, holding every call.
func TestProgram(t *testing.T) {
	f := DubboGo()
	bin := buildProgram(t, f)
	srv := startProcess(t, bin, "dabbbench-server", "-server")
	addr, ok := strings.CutPrefix(srv.next(t, 60*time.Second), "addr ")
	if !ok {
		t.Fatalf("the server did not print its address")
	}
	cli := startProcess(t, bin, "dabbbench-client", "-client", addr)
	if line := cli.next(t, 60*time.Second); line != "ready" {
		t.Fatalf("client said %q, want ready", line)
	}
	fmt.Fprintln(srv.in, "sample")
	if line := srv.next(t, 10*time.Second); len(strings.Fields(line)) != 4 || !strings.HasPrefix(line, "sample ") {
		t.Fatalf("server answered %q to sample", line)
	}
	largePad := len(benchpb.NewMessage(1 << 20).Padding)
	fmt.Fprintf(cli.in, "run 8 2 0 %d %d %d\n", largePad, (100 * time.Millisecond).Nanoseconds(), (2 * time.Second).Nanoseconds())
	var got []string
	for line := cli.next(t, 60*time.Second); line != "done"; line = cli.next(t, 60*time.Second) {
		got = append(got, line)
	}
	if len(got) != 5 {
		t.Fatalf("client answered run with %q, want start, end, result and two histograms", got)
	}
	for i, want := range []string{"start ", "end ", "result ", "hist small ", "hist large "} {
		if !strings.HasPrefix(got[i], want) {
			t.Fatalf("line %d = %q, want %q first", i, got[i], want)
		}
	}
	r := strings.Fields(got[2])
	calls, _ := strconv.ParseUint(r[1], 10, 64)
	errs, _ := strconv.ParseUint(r[2], 10, 64)
	large, _ := strconv.ParseUint(r[3], 10, 64)
	if calls == 0 || errs != 0 || large == 0 {
		t.Fatalf("result %q: want calls, no errors, 1 MiB calls", got[2])
	}
	for i, n := range map[int]uint64{3: calls, 4: large} {
		var h hist.Histogram
		if err := h.UnmarshalText([]byte(strings.SplitN(got[i], " ", 3)[2])); err != nil {
			t.Fatal(err)
		}
		if h.Count() != n || h.Max() <= 0 || h.Quantile(0.5) <= 0 {
			t.Errorf("%s: %d latencies, max %v, p50 %v; want %d", got[i][:10], h.Count(), h.Max(), h.Quantile(0.5), n)
		}
	}
	fmt.Fprintln(cli.in, "bogus")
	if line := cli.next(t, 10*time.Second); !strings.HasPrefix(line, "error unknown command") {
		t.Errorf("client answered %q to a bad command", line)
	}
}
