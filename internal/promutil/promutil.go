// Package promutil holds what dabb's two Prometheus packages share: the
// default histogram buckets and their check, and the registration of a
// set of collectors.
package promutil

import (
	"errors"
	"fmt"
	"math"

	prom "github.com/prometheus/client_golang/prometheus"
)

// ErrBadBuckets is returned, wrapped, for histogram buckets that are
// empty, not strictly increasing, or hold NaN. Both prometheus and
// proxy/prometheus export it as their own ErrBadBuckets.
var ErrBadBuckets = errors.New("prometheus: histogram buckets must be non-empty and strictly increasing")

// DefaultBuckets returns the histogram bounds both packages default to,
// in seconds: from 100 µs, a loopback call, to 10 s, past any sensible
// RPC timeout. Each call returns a new slice.
func DefaultBuckets() []float64 {
	return []float64{
		0.0001, 0.00025, 0.0005,
		0.001, 0.0025, 0.005,
		0.01, 0.025, 0.05,
		0.1, 0.25, 0.5,
		1, 2.5, 5, 10,
	}
}

// CheckBuckets rejects bounds a histogram would panic on later, on the
// call path.
func CheckBuckets(b []float64) error {
	if len(b) == 0 {
		return fmt.Errorf("%w: none given", ErrBadBuckets)
	}
	for i, v := range b {
		if math.IsNaN(v) {
			return fmt.Errorf("%w: bound %d is NaN", ErrBadBuckets, i)
		}
		if i > 0 && v <= b[i-1] {
			return fmt.Errorf("%w: %g follows %g", ErrBadBuckets, v, b[i-1])
		}
	}
	return nil
}

// Register registers every collector with reg, or none: after a failure
// it unregisters those it registered and returns the error, naming what.
func Register(reg prom.Registerer, what string, collectors ...prom.Collector) error {
	for i, c := range collectors {
		if err := reg.Register(c); err != nil {
			for _, done := range collectors[:i] {
				reg.Unregister(done)
			}
			return fmt.Errorf("prometheus: register %s: %w", what, err)
		}
	}
	return nil
}
