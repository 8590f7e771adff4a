package balancer

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/registry"
)

// benchKeys are the hash keys benchmarks rotate through.
var benchKeys = func() []string {
	k := make([]string, 1024)
	for i := range k {
		k[i] = fmt.Sprintf("user-%d", i)
	}
	return k
}()

// BenchmarkPick measures Pick plus Done for every balancer, every instance
// available through a Config.Available callback, as the client runs it.
func BenchmarkPick(b *testing.B) {
	avail := func(*registry.Instance) bool { return true }
	for _, name := range allNames {
		for _, n := range []int{10, 1000} {
			b.Run(fmt.Sprintf("%s/%d", name, n), func(b *testing.B) {
				bal := newDefault(b, name, Config{Available: avail})
				bal.Update(list(n))
				ctx := context.Background()
				b.ReportAllocs()
				k := 0
				for b.Loop() {
					k++
					_, done, err := bal.Pick(ctx, benchKeys[k&1023])
					if err != nil {
						b.Fatal(err)
					}
					done(time.Millisecond, nil)
				}
			})
		}
	}
}

// BenchmarkPickExcept measures a retry's pick, one address excluded.
func BenchmarkPickExcept(b *testing.B) {
	for _, name := range allNames {
		b.Run(name, func(b *testing.B) {
			bal := newDefault(b, name, Config{})
			ins := list(10)
			bal.Update(ins)
			tried := [3]string{ins[0].Addr}
			ctx := context.Background()
			b.ReportAllocs()
			k := 0
			for b.Loop() {
				k++
				_, done, err := bal.PickExcept(ctx, benchKeys[k&1023], tried[:1])
				if err != nil {
					b.Fatal(err)
				}
				done(time.Millisecond, nil)
			}
		})
	}
}

// BenchmarkPickParallel measures Pick plus Done from all procs at once.
func BenchmarkPickParallel(b *testing.B) {
	for _, name := range allNames {
		b.Run(name, func(b *testing.B) {
			bal := newDefault(b, name, Config{})
			bal.Update(list(10))
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				k := 0
				for pb.Next() {
					k++
					_, done, err := bal.Pick(ctx, benchKeys[k&1023])
					if err != nil {
						b.Error(err)
						return
					}
					done(time.Millisecond, nil)
				}
			})
		})
	}
}

// BenchmarkRoundRobinMutexPath measures the smooth round robin fallback
// for cycles too long to precompute.
func BenchmarkRoundRobinMutexPath(b *testing.B) {
	for _, n := range []int{10, 1000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			bal := newDefault(b, RoundRobin, Config{})
			bal.Update(list(n))
			forceMutexPath(bal)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				_, done, err := bal.Pick(ctx, "")
				if err != nil {
					b.Fatal(err)
				}
				done(time.Millisecond, nil)
			}
		})
	}
}

// BenchmarkUpdate measures building a picker.
func BenchmarkUpdate(b *testing.B) {
	for _, name := range allNames {
		b.Run(name, func(b *testing.B) {
			bal := newDefault(b, name, Config{})
			ins := list(1000)
			b.ReportAllocs()
			for b.Loop() {
				bal.Update(ins)
			}
		})
	}
}

// BenchmarkUpdateOneChange measures an Update of a list of 5,000 sorted
// instances in which one instance came or went since the last one, as
// registry watches deliver them.
func BenchmarkUpdateOneChange(b *testing.B) {
	for _, name := range []string{P2C, LeastActive, RoundRobin} {
		b.Run(name, func(b *testing.B) {
			bal := newDefault(b, name, Config{})
			full := registry.SortedCopy(list(5001))
			fewer := slices.Delete(slices.Clone(full), 2500, 2501)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if i++; i%2 == 0 {
					bal.Update(full)
				} else {
					bal.Update(fewer)
				}
			}
		})
	}
}
