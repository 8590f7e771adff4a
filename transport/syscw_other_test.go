//go:build !linux

package transport

// writeSyscalls is not measured here: the benchmark reports no writes/op.
func writeSyscalls() (int64, bool) { return 0, false }
