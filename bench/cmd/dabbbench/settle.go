package main

import (
	"time"

	"github.com/dabbrpc/dabb/bench/scale"
)

// Settling between windows. A framework can leave work running after its
// window ends (Kitex's netpoll and its server process wind down for a
// second or more): measured right after it, raw TCP at c=1024 read
// 126-138k calls/s against 150k measured right before it. So before each
// window the command waits until this process and every server process
// are quiet.
const (
	settleProbe = 100 * time.Millisecond // one measurement of quiet
	settleMax   = 3 * time.Second        // give up waiting after this
	// quietShare is the CPU share of one core under which a process counts
	// as quiet: idle Go runtimes, heartbeats and timers use far less.
	quietShare = 0.05
)

// settle waits, up to settleMax, until one settleProbe passes in which this
// process and the server process of every live entrant each used less
// than quietShare of a core. It reports how long it waited.
func settle(ents []*entrant) time.Duration {
	start := time.Now()
	for time.Since(start) < settleMax {
		if quietFor(ents, settleProbe) {
			break
		}
	}
	return time.Since(start)
}

// quietFor measures the processes over d and reports whether all were
// quiet.
func quietFor(ents []*entrant, d time.Duration) bool {
	before := make([]time.Duration, len(ents))
	for i, e := range ents {
		if e.err != nil {
			continue
		}
		s, err := e.ch.sample()
		if err != nil {
			continue // the window itself will report a dead server
		}
		before[i] = s.cpu
	}
	self := scale.CPUTime()
	t0 := time.Now()
	time.Sleep(d) // the probe is a span of time to measure, not a wait for an event
	elapsed := time.Since(t0)
	limit := time.Duration(float64(elapsed) * quietShare)
	quiet := scale.CPUTime()-self < limit
	for i, e := range ents {
		if e.err != nil {
			continue
		}
		s, err := e.ch.sample()
		if err != nil {
			continue
		}
		if s.cpu-before[i] >= limit {
			quiet = false
		}
	}
	return quiet
}
