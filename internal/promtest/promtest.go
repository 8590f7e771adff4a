// Package promtest reads series back from a Prometheus gatherer, for the
// tests of dabb's Prometheus packages (prometheus and proxy/prometheus).
package promtest

import (
	"math"
	"testing"

	prom "github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Labels is a series' label set, written as name/value pairs.
type Labels map[string]string

// Sample is the value a series should have. Absent says it should not
// exist.
type Sample struct {
	Name   string
	Labels Labels
	Value  float64
	Absent bool
}

// Gather returns the metric families of g by name.
func Gather(t testing.TB, g prom.Gatherer) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := make(map[string]*dto.MetricFamily, len(mfs))
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

// Find returns the series of name with exactly the labels want, or nil.
func Find(mfs map[string]*dto.MetricFamily, name string, want Labels) *dto.Metric {
	for _, m := range mfs[name].GetMetric() {
		if len(m.GetLabel()) != len(want) {
			continue
		}
		match := true
		for _, lp := range m.GetLabel() {
			if v, ok := want[lp.GetName()]; !ok || v != lp.GetValue() {
				match = false
				break
			}
		}
		if match {
			return m
		}
	}
	return nil
}

// Value is a series' counter or gauge value, or a histogram's count. It
// is NaN for other kinds.
func Value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return math.NaN()
}

// Check reports, as errors of t, every series of want that g does not
// have as it should.
func Check(t testing.TB, g prom.Gatherer, want []Sample) {
	t.Helper()
	mfs := Gather(t, g)
	for _, s := range want {
		m := Find(mfs, s.Name, s.Labels)
		switch {
		case s.Absent && m != nil:
			t.Errorf("%s%v exists with value %v, want no such series", s.Name, s.Labels, Value(m))
		case s.Absent:
		case m == nil:
			t.Errorf("%s%v: no such series; want %v", s.Name, s.Labels, s.Value)
		case Value(m) != s.Value:
			t.Errorf("%s%v = %v, want %v", s.Name, s.Labels, Value(m), s.Value)
		}
	}
}
