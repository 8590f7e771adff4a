package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/dabbrpc/dabb/bench/frameworks"
)

// roleEnv marks the server process, so that a test binary standing in for
// the command knows to serve.
const roleEnv = "DABBBENCH_ROLE"

// errServerGone reports a server process that stopped answering.
var errServerGone = errors.New("dabbbench: server process not answering")

// child is the server process of one framework.
type child struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string // control lines, prefix removed
	done  chan error  // Wait's result
	addr  string

	drainOnce sync.Once
}

// startChild starts the server process of framework f and waits for its
// address: this program with -server, or, for a framework with a program
// of its own (f.Program), that program, built by programs. With profile
// set, the server writes its CPU profile there. A TLS framework's server
// gets this process's certificates.
func startChild(f frameworks.Framework, profile string, log io.Writer) (*child, error) {
	name := f.Name
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("dabbbench: find own executable: %w", err)
	}
	args := []string{"-server", "-framework", name}
	if f.Program != "" {
		if exe, err = programs.binary(f, log); err != nil {
			return nil, err
		}
		args = []string{"-server"}
	}
	if profile != "" {
		args = append(args, "-cpuprofile", profile)
	}
	env := append(os.Environ(), roleEnv+"=server")
	if f.TLS {
		tlsEnv, err := frameworks.TLSEnviron()
		if err != nil {
			return nil, fmt.Errorf("dabbbench: %s server: %w", name, err)
		}
		env = append(env, tlsEnv)
	}
	c, err := startProcess(name+" server", exe, args, env, ctlPrefix, log)
	if err != nil {
		return nil, err
	}
	line, err := c.next()
	if err != nil {
		c.kill()
		return nil, fmt.Errorf("dabbbench: %s server: %w", name, err)
	}
	addr, ok := strings.CutPrefix(line, "addr ")
	if !ok {
		c.kill()
		return nil, fmt.Errorf("dabbbench: %s server said %q, want its address", name, line)
	}
	c.addr = addr
	return c, nil
}

// startProcess starts exe with args and env, and passes the lines of its
// standard output that start with prefix and a space to the child's
// lines, without the prefix; other lines go to log after name.
func startProcess(name, exe string, args, env []string, prefix string, log io.Writer) (*child, error) {
	cmd := exec.Command(exe, args...)
	cmd.Env = env
	cmd.Stderr = log
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("dabbbench: start %s: %w", name, err)
	}
	c := &child{cmd: cmd, in: in, lines: make(chan string, 4), done: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 1<<20) // a histogram's line
		for sc.Scan() {
			line := sc.Text()
			if rest, ok := strings.CutPrefix(line, prefix+" "); ok {
				c.lines <- rest
			} else {
				fmt.Fprintln(log, name+":", line)
			}
		}
		close(c.lines)
		c.done <- cmd.Wait()
	}()
	return c, nil
}

// next waits up to 10 s for the next control line.
func (c *child) next() (string, error) { return c.nextWithin(10 * time.Second) }

// nextWithin waits up to d for the next control line.
func (c *child) nextWithin(d time.Duration) (string, error) {
	select {
	case line, ok := <-c.lines:
		if !ok {
			return "", errServerGone
		}
		return line, nil
	case <-time.After(d):
		return "", errServerGone
	}
}

// sample asks the server what it has used so far.
func (c *child) sample() (sample, error) {
	if _, err := io.WriteString(c.in, "sample\n"); err != nil {
		return sample{}, fmt.Errorf("%w: %w", errServerGone, err)
	}
	line, err := c.next()
	if err != nil {
		return sample{}, err
	}
	v, ok := strings.CutPrefix(line, "sample ")
	if !ok {
		return sample{}, fmt.Errorf("dabbbench: server answered %q to sample", line)
	}
	return parseSample(v)
}

// stop closes the server's stdin, which makes it exit, and waits up to
// 10 s before killing it.
func (c *child) stop() error {
	c.in.Close()
	c.drain()
	select {
	case err := <-c.done:
		return err
	case <-time.After(10 * time.Second):
		c.kill()
		return fmt.Errorf("dabbbench: server did not exit: %w", errServerGone)
	}
}

func (c *child) kill() {
	c.cmd.Process.Kill()
	c.in.Close()
	c.drain()
}

// drain discards control lines from now on, so the reader goroutine can
// reach Wait.
func (c *child) drain() {
	c.drainOnce.Do(func() {
		go func() {
			for range c.lines {
			}
		}()
	})
}
