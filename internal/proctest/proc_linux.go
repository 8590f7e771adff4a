//go:build linux

// Tying a server process's life to the test binary on Linux.

package proctest

import (
	"os"
	"syscall"
)

// sysProcAttr puts the server in its own process group, so that it can be
// signalled as a whole, and has the kernel kill it when the test binary
// dies. (Strictly, Pdeathsig fires when the thread that started the server
// exits; the Go runtime keeps its threads for the life of the process
// unless a goroutine exits while locked to one, which tests do not do.)
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// killGroup sends sig to the process group p leads, or to p alone when
// that fails.
func killGroup(p *os.Process, sig syscall.Signal) {
	if err := syscall.Kill(-p.Pid, sig); err != nil {
		_ = p.Signal(sig)
	}
}
