package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/dabbrpc/dabb/bench/scale"
)

// sample is what a process has used so far: CPU time (getrusage) and read
// and write system calls (/proc/self/io; zero where it does not exist).
type sample struct {
	cpu        time.Duration
	sysr, sysw uint64
}

// sub returns s - o.
func (s sample) sub(o sample) sample {
	return sample{cpu: s.cpu - o.cpu, sysr: s.sysr - o.sysr, sysw: s.sysw - o.sysw}
}

func (s sample) String() string { return fmt.Sprintf("%d %d %d", s.cpu.Nanoseconds(), s.sysr, s.sysw) }

func parseSample(s string) (sample, error) {
	f := strings.Fields(s)
	if len(f) != 3 {
		return sample{}, fmt.Errorf("dabbbench: bad sample %q", s)
	}
	var v [3]uint64
	for i := range f {
		n, err := strconv.ParseUint(f[i], 10, 64)
		if err != nil {
			return sample{}, fmt.Errorf("dabbbench: bad sample %q: %w", s, err)
		}
		v[i] = n
	}
	return sample{cpu: time.Duration(v[0]), sysr: v[1], sysw: v[2]}, nil
}

// takeSample samples this process.
func takeSample() sample {
	s := sample{cpu: scale.CPUTime()}
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
