//go:build !windows

// Tests of watch: joins and leaves as they happen, and the end at an interrupt.

package main

import (
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// visibleWithin bounds how long a join or a leave may take to reach watch.
const visibleWithin = 2 * time.Second

// TestWatch: watch lists the instances there are, then prints an instance
// starting (join) and one shutting down (leave) within 2 s, and exits 0
// when interrupted; in table and JSON output.
func TestWatch(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			url := b.url(t)
			first := startServer(t, url, serverOpts{})
			for _, format := range []string{"json", "table"} {
				t.Run(format, func(t *testing.T) {
					ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
					defer cancel()
					cmd := exec.CommandContext(ctx, bin, "-registry", url, "-o", format, "watch", inventoryService)
					stdout, err := cmd.StdoutPipe()
					if err != nil {
						t.Fatal(err)
					}
					var stderr strings.Builder
					cmd.Stderr = &stderr
					if err := cmd.Start(); err != nil {
						t.Fatal(err)
					}
					exited := make(chan error, 1)
					go func() { exited <- cmd.Wait() }()
					defer func() {
						cmd.Process.Kill()
						<-exited
					}()
					out := readLines(stdout)
					match := func(event, addr string) func(string) bool {
						if format == "table" {
							return func(l string) bool {
								f := strings.Fields(l)
								return len(f) >= 3 && f[1] == event && f[2] == addr
							}
						}
						return func(l string) bool {
							var ev watchEvent
							return json.Unmarshal([]byte(l), &ev) == nil && ev.Event == event && ev.Instance != nil &&
								ev.Instance.Addr == addr && ev.Instance.Service == inventoryService
						}
					}
					out.await(t, 10*time.Second, "the listed instance", match("listed", first.addr))

					second := startServer(t, url, serverOpts{})
					out.await(t, visibleWithin, "the join of "+second.addr, match("join", second.addr))
					second.signal(t, syscall.SIGTERM)
					out.await(t, visibleWithin, "the leave of "+second.addr, match("leave", second.addr))
					second.wait(t)

					if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
						t.Fatal(err)
					}
					select {
					case err := <-exited:
						exited <- err // for the deferred wait
						if err != nil {
							t.Fatalf("watch exited with %v after an interrupt, want status 0; stderr:\n%s", err, stderr.String())
						}
					case <-time.After(5 * time.Second):
						t.Fatal("watch did not exit within 5 s of an interrupt")
					}
				})
			}
		})
	}
}
