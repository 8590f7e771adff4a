//go:build linux

package etcd

import (
	"os/exec"
	"syscall"
)

// dieWithTest has the kernel kill cmd when the test binary dies.
func dieWithTest(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
