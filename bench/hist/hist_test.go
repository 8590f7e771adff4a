package hist

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestIndexValueRoundTrip(t *testing.T) {
	for _, v := range []uint64{0, 1, 127, 128, 129, 255, 256, 1000, 1 << 20, 123456789, 1 << 39} {
		got := value(index(v))
		diff := float64(got) - float64(v)
		if diff < 0 {
			diff = -diff
		}
		if v > 0 && diff/float64(v) > 0.016 {
			t.Errorf("value(index(%d)) = %d: error %.3f", v, got, diff/float64(v))
		}
	}
	if i := index(1 << 62); i != nBuckets-1 {
		t.Errorf("index(2^62) = %d, want the last bucket %d", i, nBuckets-1)
	}
}

func TestQuantileMatchesSorted(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		name string
		gen  func() time.Duration
	}{
		{"uniform", func() time.Duration { return time.Duration(r.IntN(1_000_000)) }},
		{"exponential", func() time.Duration { return time.Duration(r.ExpFloat64() * 50_000) }},
		{"bimodal", func() time.Duration {
			if r.IntN(100) == 0 {
				return 20 * time.Millisecond
			}
			return 80 * time.Microsecond
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var a, b Histogram
			var all []time.Duration
			for i := range 100_000 {
				d := tc.gen()
				all = append(all, d)
				if i%2 == 0 {
					a.Record(d)
				} else {
					b.Record(d)
				}
			}
			a.Merge(&b)
			slices.Sort(all)
			if a.Count() != uint64(len(all)) || a.Max() != all[len(all)-1] {
				t.Fatalf("count %d max %v, want %d %v", a.Count(), a.Max(), len(all), all[len(all)-1])
			}
			for _, q := range []float64{0.5, 0.9, 0.99, 0.999} {
				want := all[int(q*float64(len(all)))-1]
				got := a.Quantile(q)
				if d := float64(got-want) / float64(want); d > 0.02 || d < -0.02 {
					t.Errorf("Quantile(%v) = %v, sorted says %v", q, got, want)
				}
			}
		})
	}
}

func TestEmpty(t *testing.T) {
	var h Histogram
	if h.Quantile(0.99) != 0 || h.Count() != 0 {
		t.Fatal("empty histogram reports values")
	}
	h.Record(-time.Second)
	if h.Quantile(1) != 0 {
		t.Fatalf("negative duration recorded as %v, want 0", h.Quantile(1))
	}
}

// TestText writes a histogram in its text form and reads it back: the
// same counts, quantiles and exact maximum; bad text is refused.
func TestText(t *testing.T) {
	var h Histogram
	r := rand.New(rand.NewPCG(3, 4))
	for range 10000 {
		h.Record(time.Duration(r.ExpFloat64() * float64(200*time.Microsecond)))
	}
	h.Record(3 * time.Nanosecond)
	h.Record(1234567891 * time.Nanosecond)
	text, err := h.MarshalText()
	if err != nil {
		t.Fatal(err)
	}
	var g Histogram
	if err := g.UnmarshalText(text); err != nil {
		t.Fatal(err)
	}
	if g != h {
		t.Fatalf("read back %d latencies, max %v; wrote %d, max %v", g.Count(), g.Max(), h.Count(), h.Max())
	}
	for _, q := range []float64{0, 0.5, 0.99, 1} {
		if g.Quantile(q) != h.Quantile(q) {
			t.Errorf("Quantile(%v) = %v, wrote %v", q, g.Quantile(q), h.Quantile(q))
		}
	}
	// The text bench/dubbogo's program writes for these latencies (its
	// TestHistogramText): the same buckets.
	var want, prog Histogram
	for _, d := range []time.Duration{100, 100, 1000, 1003, 1234567891} {
		want.Record(d)
	}
	if err := prog.UnmarshalText([]byte("1234567891 100:2 1004:2 1233125376:1")); err != nil || prog != want {
		t.Errorf("the program's text read as %d latencies, max %v (%v); want the histogram of its latencies", prog.Count(), prog.Max(), err)
	}
	var empty Histogram
	if text, _ := empty.MarshalText(); string(text) != "0" {
		t.Errorf("empty histogram's text %q, want \"0\"", text)
	}
	for _, bad := range []string{"", "x", "-1", "10 5", "10 5:x", "10 a:1"} {
		if err := g.UnmarshalText([]byte(bad)); err == nil {
			t.Errorf("UnmarshalText(%q) = nil, want an error", bad)
		}
	}
}
