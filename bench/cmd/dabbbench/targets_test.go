package main

import (
	"strings"
	"testing"
	"time"
)

// TestWriteTargets: the default path against raw at each concurrency and
// against raw-conn at c=1, the rise from c=128 to c=1024, dabb against the fastest peer at each point
// (Kitex's pooled client included, TLS rows, dabb's own rows and the raw
// references not), CPU
// per call, and the large-payload point against gRPC's.
func TestWriteTargets(t *testing.T) {
	cfg, err := parseFlags([]string{"-frameworks", "dabb,dabb-idem,grpc,kitex,kitex-pool,raw,raw-conn", "-c", "1,128,1024", "-out", t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	res := &results{cfg: cfg}
	add := func(f string, c, large int, calls, largeN uint64, cpu time.Duration) {
		res.points = append(res.points, point{Framework: f, Round: 1, Median: true, Payload: "small", C: c, Large: large,
			Calls: calls, LargeN: largeN, Window: time.Second, ClientCPU: cpu, P99: time.Duration(1000 * (1 + large))})
	}
	for _, p := range []struct {
		f     string
		rates [3]uint64
	}{
		{"dabb", [3]uint64{9000, 90000, 85000}},
		{"dabb-idem", [3]uint64{99000, 99000, 99000}},
		{"grpc", [3]uint64{5000, 40000, 40000}},
		{"kitex", [3]uint64{8000, 50000, 50000}},
		{"kitex-pool", [3]uint64{9500, 30000, 30000}},
		{"raw", [3]uint64{9200, 95000, 100000}},
		{"raw-conn", [3]uint64{12000, 99500, 99500}},
	} {
		for i, c := range []int{1, 128, 1024} {
			add(p.f, c, 0, p.rates[i], 0, time.Duration(p.rates[i])*10*time.Microsecond)
		}
	}
	res.points[2].ClientCPU = 85000 * 14 * time.Microsecond // dabb at c=1024: 1.4× raw's CPU per call
	add("dabb", 16, 0, 50000, 0, time.Second)
	add("dabb", 16, 2, 40000, 200, time.Second)
	add("grpc", 16, 0, 20000, 0, time.Second)
	add("grpc", 16, 2, 4000, 250, time.Second)
	var b strings.Builder
	writeTargets(&b, res)
	md := b.String()
	for _, want := range []string{
		"| c=1 calls/s, dabb ÷ raw | 0.98× | ≥ 0.95× | met |",
		"| c=128 calls/s, dabb ÷ raw | 0.95× | ≥ 0.90× | met |",
		"| c=1024 calls/s, dabb ÷ raw | 0.85× | ≥ 0.85× | met |",
		"| c=1 calls/s, dabb ÷ raw-conn | 0.75× | ≥ 0.80× | NOT met |",
		"| calls/s at c=1024 ÷ at c=128 (dabb) | 0.94× | ≥ 1.00× | NOT met |",
		"| c=1 calls/s, dabb ÷ the fastest peer (kitex-pool) | 0.95× | ≥ 1.00× | NOT met |",
		"| c=128 calls/s, dabb ÷ the fastest peer (kitex) | 1.80× | ≥ 1.00× | met |",
		"| c=1024 CPU per call, dabb ÷ raw | 1.40× | ≤ 1.30× | NOT met |",
		"| small-call p99 with 2×1 MiB calls ÷ without (dabb) | 3.00× | ≤ 3.00× | met |",
		"| 1 MiB calls/s at that point, dabb ÷ gRPC | 0.80× | ≥ 1.00× | NOT met |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("targets lack %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "(dabb-idem)") || strings.Contains(md, "(raw)") || strings.Contains(md, "(raw-conn)") {
		t.Errorf("a dabb row or a raw reference counted as a peer:\n%s", md)
	}
}
