//go:build !linux

// Process attributes where Linux's Pdeathsig is not available.

package proctest

import (
	"os"
	"syscall"
)

// sysProcAttr has no portable way to tie the server's life to the test
// binary outside Linux; tests still stop it in their cleanup.
func sysProcAttr() *syscall.SysProcAttr { return nil }

// killGroup sends sig to the process.
func killGroup(p *os.Process, sig syscall.Signal) {
	_ = p.Signal(sig)
}
