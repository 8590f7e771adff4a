package bufpool

import "testing"

func TestGetSizes(t *testing.T) {
	tests := []struct {
		n       int
		wantCap int
	}{
		{0, 0},
		{Min - 1, Min - 1}, // under Min: a plain allocation
		{Min, Min},
		{Min + 1, 2 * Min},
		{1 << 20, 1 << 20},
		{1<<20 + 100, 2 << 20},
		{Max, Max},
		{Max + 1, Max + 1}, // over Max: a plain allocation
	}
	for _, tt := range tests {
		b := Get(tt.n)
		if len(b) != tt.n || cap(b) != tt.wantCap {
			t.Errorf("Get(%d): len %d cap %d, want len %d cap %d", tt.n, len(b), cap(b), tt.n, tt.wantCap)
		}
	}
}

// A returned buffer serves any later request its capacity covers, and is
// never handed out for a request larger than its capacity.
func TestPutServesSmallerOrEqual(t *testing.T) {
	// Odd capacities go to the class below them.
	odd := make([]byte, 10, 3*Min)
	Put(odd)
	for range 100 {
		b := Get(2 * Min)
		if cap(b) < 2*Min || len(b) != 2*Min {
			t.Fatalf("Get(%d) gave len %d cap %d", 2*Min, len(b), cap(b))
		}
		Put(b)
		c := Get(2*Min + 1)
		if cap(c) < 2*Min+1 {
			t.Fatalf("Get(%d) gave cap %d", 2*Min+1, cap(c))
		}
		Put(c)
	}
}

func TestPutIgnoresOutOfRange(t *testing.T) {
	Put(nil)
	Put(make([]byte, 0, Min-1))
	Put(make([]byte, 0, 2*Max)) // dropped, not kept in the top class
	for range 10 {
		if b := Get(Max); cap(b) != Max {
			t.Fatalf("Get(Max) gave cap %d, want %d", cap(b), Max)
		}
	}
}

func TestReuseAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop buffers at random")
	}
	Put(Get(1 << 20)) // prime the class
	allocs := testing.AllocsPerRun(100, func() {
		b := Get(1<<20 - 5)
		b[0] = 1
		Put(b)
	})
	// Put boxes the slice header (one small allocation); the megabyte
	// itself is reused.
	if allocs > 1 {
		t.Errorf("Get+Put of a pooled size: %.1f allocations, want at most 1", allocs)
	}
}
