package scale

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/dabbrpc/dabb/bench/internal/leaktest"
	"github.com/dabbrpc/dabb/internal/etcdtest"
	"github.com/dabbrpc/dabb/internal/zktest"
)

// TestMain makes the test binary the registrar when a test starts it as
// one.
func TestMain(m *testing.M) {
	if os.Getenv(RoleEnv) == "registrar" {
		if err := RegistrarMain(os.Stdin, os.Stdout); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m, leaktest.Ignore()...)
}

// envInts reads a comma-separated list of positive integers from the
// environment, or def.
func envInts(t *testing.T, name string, def []int) []int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	var out []int
	for _, s := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want positive integers", name, v)
		}
		out = append(out, n)
	}
	return out
}

// TestRegistryScale measures every size of SizesEnv (default 10) in etcd
// and in ZooKeeper, real servers on loopback, and writes the points to
// OutEnv when it is set. It checks that every change reached the
// balancer, that the quantiles are in order and that a cache of 1,000
// instances or more weighs something.
func TestRegistryScale(t *testing.T) {
	sizes := envInts(t, SizesEnv, []int{10})
	changes := envInts(t, ChangesEnv, []int{5})[0]
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	backends := []Backend{
		{Name: "etcd", Addr: etcdtest.Start(t).Endpoint()},
		{Name: "zk", Addr: zktest.Start(t).Addr()},
	}
	var pts []Point
	for _, b := range backends {
		reg, err := StartRegistrar(exe, b)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range sizes {
			p, err := Measure(b, reg, n, changes)
			if err != nil {
				reg.Close()
				t.Fatalf("%s, %d instances: %v", b.Name, n, err)
			}
			t.Logf("%s n=%d: register %v, first list %v, cache %d B, change p50 %v p99 %v, cpu/change %v",
				b.Name, n, p.RegisterAll, p.FirstList, p.CacheBytes, p.P50, p.P99, p.CPUPerChange)
			// A few instances weigh less than the noise of the
			// registry client's own allocations: only larger sets must
			// show.
			if n >= 1000 && p.CacheBytes <= 0 {
				t.Errorf("%s, %d instances: cache of %d bytes", b.Name, n, p.CacheBytes)
			}
			if p.P50 <= 0 || p.P99 < p.P50 {
				t.Errorf("%s, %d instances: p50 %v, p99 %v", b.Name, n, p.P50, p.P99)
			}
			pts = append(pts, p)
		}
		if err := reg.Close(); err != nil {
			t.Errorf("%s registrar: %v", b.Name, err)
		}
	}
	if out := os.Getenv(OutEnv); out != "" {
		if err := WriteJSON(out, pts); err != nil {
			t.Fatal(err)
		}
	}
}
