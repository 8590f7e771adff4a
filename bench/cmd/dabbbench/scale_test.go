package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	benchpb "github.com/dabbrpc/dabb/bench/proto"
	"github.com/dabbrpc/dabb/bench/scale"
)

// tinyScale is the scale section on sizes a test can afford.
func tinyScale() scaleConfig {
	return scaleConfig{conns: []int{1, 10}, dialers: 4, payloads: []int{64, 16 << 10}, payloadC: 2,
		warmup: 50 * time.Millisecond, duration: 100 * time.Millisecond, instances: []int{10}, changes: 3}
}

// TestScaleAlone runs the scale section alone (-sweep=false) on tiny sizes,
// with server processes, etcd and ZooKeeper, and checks its tables and
// its JSON.
func TestScaleAlone(t *testing.T) {
	out := t.TempDir()
	cfg, err := parseFlags([]string{"-sweep=false", "-out", out})
	if err != nil {
		t.Fatal(err)
	}
	cfg.scaleCfg = tinyScale()
	var stdout, stderr bytes.Buffer
	if err := run(cfg, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\nstderr:\n%s", err, stderr.String())
	}
	md, err := os.ReadFile(filepath.Join(out, "scale.md"))
	if err != nil {
		t.Fatal(err)
	}
	checkText(t, string(md), []string{"| dabb |", "| grpc |", "RSS, 10 conns", "| etcd | 10 |", "| zk | 10 |", "| 64 B |", "| 16 KiB |", "dabb ÷ gRPC-Go:"},
		[]string{"Scale errors"})
	js, err := os.ReadFile(filepath.Join(out, scaleFile))
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Conns   []connPoint
		Storms  []stormPoint
		Payload []struct {
			Framework string  `json:"framework"`
			CallsPerS float64 `json:"calls_per_s"`
		}
		Registry []json.RawMessage
	}
	if err := json.Unmarshal(js, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Conns) != 4 || len(got.Storms) != 2 || len(got.Payload) != 6 || len(got.Registry) != 2 {
		t.Fatalf("scale.json has %d connection points, %d storms, %d payload points, %d registry points; want 4, 2, 6, 2:\n%s",
			len(got.Conns), len(got.Storms), len(got.Payload), len(got.Registry), js)
	}
	for _, s := range got.Storms {
		if s.Failed != 0 || s.Took <= 0 {
			t.Errorf("storm %+v", s)
		}
	}
	for _, c := range got.Conns {
		if c.RSSKiB <= 0 || c.Goroutines <= 0 {
			t.Errorf("connection point %+v", c)
		}
	}
	for _, p := range got.Payload {
		if p.CallsPerS <= 0 {
			t.Errorf("payload point %+v made no calls", p)
		}
	}
}

// TestNewRequest checks the sizes of the payload part's requests.
func TestNewRequest(t *testing.T) {
	for _, size := range []int{64, 1 << 10, 16 << 10} {
		if got := benchpb.Size(newRequest(size)); got != size {
			t.Errorf("newRequest(%d) marshals to %d bytes", size, got)
		}
	}
	if got := benchpb.Size(newRequest(0)); got != benchpb.StandardSize {
		t.Errorf("newRequest(0) marshals to %d bytes, want the standard %d", got, benchpb.StandardSize)
	}
}

// The instances' points are read back from the file the test wrote; when
// the test skipped and wrote none, the error says which servers it needs
// and shows the test's own line.
func TestReadRegistryPoints(t *testing.T) {
	out := filepath.Join(t.TempDir(), "registry.json")
	skipped := []byte("=== RUN   TestRegistryScale\n    etcd not installed\n--- SKIP: TestRegistryScale\n")
	_, err := readRegistryPoints(out, skipped)
	if err == nil || !strings.Contains(err.Error(), "etcd and ZooKeeper must be installed") || !strings.Contains(err.Error(), "etcd not installed") {
		t.Fatalf("no points written: err = %v, want one naming the servers and the skip line", err)
	}
	want := []scale.Point{{Backend: "etcd", Instances: 10}}
	if err := scale.WriteJSON(out, want); err != nil {
		t.Fatal(err)
	}
	pts, err := readRegistryPoints(out, nil)
	if err != nil || len(pts) != 1 || pts[0].Backend != "etcd" || pts[0].Instances != 10 {
		t.Fatalf("points written: got %+v, %v; want %+v", pts, err, want)
	}
}
