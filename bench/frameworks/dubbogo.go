package frameworks

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// ErrOffline reports a program whose modules could not be downloaded:
// the Go module proxy was unreachable or not allowed.
var ErrOffline = errors.New("frameworks: cannot download the program's modules")

// buildTimeout bounds a program's build, downloads included: a cold build
// fetches dubbo-go's modules from the module proxy.
const buildTimeout = 15 * time.Minute

// DubboGo is dubbo-go v3.3.1 on both sides, over the dubbo protocol with
// hessian2 bodies: the program in dubbogo/ (a module of its own), its
// client dialing the server's URL directly, no registry.
func DubboGo() Framework {
	return Framework{
		Name:    "dubbo-go",
		Setup:   "dubbo.apache.org/dubbo-go/v3 v3.3.1 client and server (a program of its own module, bench/dubbogo), the dubbo protocol, hessian2, the same POJO, a direct URL (no registry), one client.Connection over getty's default client (up to 16 TCP connections to the address, ConnectionNum), a 30 s request timeout, getty's MaxMsgLen raised to 4 MiB for the 1 MiB calls",
		Program: "dubbogo",
	}
}

// BuildProgram builds f's program (f.Program) into dir and returns the
// binary's path. benchDir is the bench module's directory. The build runs
// outside any workspace (GOWORK=off) with -mod=readonly, so the program's
// requirements are its go.mod's alone. An error wrapping ErrOffline says
// the modules could not be downloaded.
func BuildProgram(ctx context.Context, f Framework, benchDir, dir string) (string, error) {
	if f.Program == "" {
		return "", fmt.Errorf("frameworks: %s has no program", f.Name)
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("frameworks: build %s: %w", f.Name, err)
	}
	src := filepath.Join(benchDir, f.Program)
	ctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	// go list loads every package the program imports, which downloads
	// the modules that hold them and nothing else; its failure before
	// any compiling is a failure to download.
	if out, err := goCmd(ctx, gobin, src, "list", "-deps", "."); err != nil {
		if offline(out) {
			return "", fmt.Errorf("%w (%s): %v\n%s", ErrOffline, src, err, tail(out))
		}
		return "", fmt.Errorf("frameworks: go list in %s: %w\n%s", src, err, tail(out))
	}
	bin := filepath.Join(dir, f.Name)
	if out, err := goCmd(ctx, gobin, src, "build", "-buildvcs=false", "-o", bin, "."); err != nil {
		return "", fmt.Errorf("frameworks: go build in %s: %w\n%s", src, err, tail(out))
	}
	return bin, nil
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
	"GOPROXY=off", "module lookup disabled", "unexpected EOF", "connection reset",
}

func offline(out []byte) bool {
	for _, s := range offlineSigns {
		if bytes.Contains(out, []byte(s)) {
			return true
		}
	}
	return false
}

// tail returns the last 4 KiB of a command's output.
func tail(out []byte) string {
	const max = 4 << 10
	s := strings.TrimSpace(string(out))
	if len(s) > max {
		s = "..." + s[len(s)-max:]
	}
	return s
}
