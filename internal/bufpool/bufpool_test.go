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
	// The megabyte is reused, and so is the box holding its slice header.
	if allocs > 0 {
		t.Errorf("Get+Put of a pooled size: %.1f allocations, want none", allocs)
	}
}

// Outstanding counts the pooled-range buffers handed out and not put back;
// buffers outside the range count neither way.
func TestOutstanding(t *testing.T) {
	start := Outstanding()
	small, huge := Get(Min-1), Get(Max+1)
	a, b := Get(Min), Get(1<<20+1)
	if got := Outstanding() - start; got != 2 {
		t.Fatalf("after Get of two pooled sizes and two others, Outstanding rose by %d, want 2", got)
	}
	Put(small)
	Put(huge)
	Put(a)
	if got := Outstanding() - start; got != 1 {
		t.Fatalf("after one pooled buffer went back, Outstanding is %d over its start, want 1", got)
	}
	Put(b)
	if got := Outstanding() - start; got != 0 {
		t.Fatalf("after every pooled buffer went back, Outstanding is %d over its start, want 0", got)
	}
}
