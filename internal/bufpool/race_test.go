//go:build race

package bufpool

// raceEnabled: the race detector makes sync.Pool drop a share of Puts.
const raceEnabled = true
