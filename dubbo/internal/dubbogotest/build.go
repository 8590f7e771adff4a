// Building the dubbo-go peer program once per test binary.

package dubbogotest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/proctest"
)

// buildTimeout bounds the peer's build, downloads included: a cold
// build fetches dubbo-go's modules from the module proxy.
const buildTimeout = 15 * time.Minute

// peerModule is the peer module's directory relative to the dubbo
// module's root.
var peerModule = filepath.Join("testdata", "dubbogo")

var built struct {
	once sync.Once
	dir  string // holds the binary; removed by WithPeer's wrapper
	bin  string
	skip string // why the build could not download modules
	err  error
}

// Binary returns the path of the peer program, built on first use with
// GOWORK=off and -mod=readonly in its own module, so that dubbo-go's
// requirements never meet dabb's. When the modules cannot be downloaded
// the test is skipped, or fails when $CI is "true"; a failing build
// fails the test.
func Binary(t testing.TB) string {
	t.Helper()
	built.once.Do(func() {
		built.dir, built.bin, built.skip, built.err = build()
	})
	if built.skip != "" {
		proctest.Missing(t, "dubbogotest: %s", built.skip)
	}
	if built.err != nil {
		t.Fatalf("dubbogotest: %v", built.err)
	}
	return built.bin
}

// WithPeer wraps a testing.M so that running it also removes the built
// peer after the tests:
//
//	goleak.VerifyTestMain(dubbogotest.WithPeer(zktest.WithShared(m)))
func WithPeer(m proctest.Runner) proctest.Runner {
	return runFunc(func() int {
		code := m.Run()
		if built.dir != "" {
			os.RemoveAll(built.dir)
		}
		return code
	})
}

type runFunc func() int

func (f runFunc) Run() int { return f() }

// build downloads the peer's modules and builds it into a new temporary
// directory. skip is set when the downloads failed.
func build() (dir, bin, skip string, err error) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		return "", "", "go not found on PATH", nil
	}
	src, err := findModule()
	if err != nil {
		return "", "", "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	// go list loads every package the peer imports, which downloads the
	// modules that hold them and nothing else; its failure before any
	// compiling is a failure to download.
	if out, err := goCmd(ctx, gobin, src, "list", "-mod=readonly", "-deps", "./peer"); err != nil {
		if offline(out) {
			return "", "", fmt.Sprintf("cannot download the dubbo-go peer's modules: %v\n%s", err, tail(out)), nil
		}
		return "", "", "", fmt.Errorf("go list in %s: %w\n%s", src, err, tail(out))
	}
	dir, err = os.MkdirTemp("", "dubbogo-peer-")
	if err != nil {
		return "", "", "", err
	}
	bin = filepath.Join(dir, "peer")
	if out, err := goCmd(ctx, gobin, src, "build", "-mod=readonly", "-buildvcs=false", "-o", bin, "./peer"); err != nil {
		os.RemoveAll(dir)
		return "", "", "", fmt.Errorf("go build in %s: %w\n%s", src, err, tail(out))
	}
	return dir, bin, "", nil
}

// goCmd runs the go command in dir outside any workspace and returns its
// combined output.
func goCmd(ctx context.Context, gobin, dir string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, gobin, args...)
	cmd.Dir = dir
	// The last value of a key wins: these replace the caller's.
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.Bytes(), err
}

// offlineSigns are what the go command prints when it cannot reach the
// module proxy or is not allowed to.
var offlineSigns = []string{
	"dial tcp", "no such host", "connection refused", "i/o timeout",
	"network is unreachable", "TLS handshake", "proxyconnect",
	"GOPROXY=off", "GOFLAGS=-mod=vendor", "module lookup disabled",
	"unexpected EOF", "connection reset",
}

func offline(out []byte) bool {
	for _, s := range offlineSigns {
		if bytes.Contains(out, []byte(s)) {
			return true
		}
	}
	return false
}

// findModule returns the peer module's directory, looked for from the
// working directory (a package directory of the dubbo module) upwards.
func findModule() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; {
		p := filepath.Join(d, peerModule)
		if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
			return p, nil
		}
		up := filepath.Dir(d)
		if up == d {
			return "", errors.New("no " + filepath.Join(peerModule, "go.mod") + " above " + wd)
		}
		d = up
	}
}

// tail returns the last lines of a command's output.
func tail(out []byte) string {
	const max = 4 << 10
	s := strings.TrimSpace(string(out))
	if len(s) > max {
		s = "..." + s[len(s)-max:]
	}
	return s
}
