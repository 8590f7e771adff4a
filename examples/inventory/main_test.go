package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The embedded etcd leaves these behind briefly after it stops.
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
	)
}

// TestDemo runs the whole demo, embedded etcd included, as
// `go run ./examples/inventory` does, and checks its summary.
func TestDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out strings.Builder
	cfg := config{mode: "demo", instances: 3, calls: 1000, workers: 16}
	if err := runDemo(ctx, &out, cfg); err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out.String())
	}
	for _, want := range []string{
		"registry: embedded etcd at 127.0.0.1:",
		"instances: 3 published as inventory.Inventory",
		"shut down gracefully",
		"(shut down)",
		"0 failed",
		"stock consistent, no failed calls",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, out.String())
		}
	}
}
