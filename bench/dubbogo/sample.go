package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// sample is what this process has used so far: CPU time (getrusage) and
// read and write system calls (/proc/self/io; zero where it does not
// exist), printed as dabbbench reads them: "CPU_NS READS WRITES".
type sample struct {
	cpu        time.Duration
	sysr, sysw uint64
}

func (s sample) String() string { return fmt.Sprintf("%d %d %d", s.cpu.Nanoseconds(), s.sysr, s.sysw) }

func takeSample() sample {
	var s sample
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return s
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "syscr":
			s.sysr = n
		case "syscw":
			s.sysw = n
		}
	}
	return s
}
