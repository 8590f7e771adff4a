package transport

import (
	"bytes"
	"os"
	"strconv"
)

// writeSyscalls returns how many write system calls (write, writev,
// sendmsg...) the process has made, from syscw in /proc/self/io; false
// where it cannot be read.
func writeSyscalls() (int64, bool) {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0, false
	}
	for line := range bytes.Lines(b) {
		if v, ok := bytes.CutPrefix(line, []byte("syscw:")); ok {
			n, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}
