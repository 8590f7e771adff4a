// Tests of the lease: expiry, revocation and recovery.

package etcd

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/etcdtest"
	"github.com/dabbrpc/dabb/registry"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestKilledProviderDisappears runs a provider process, kills it with
// SIGKILL and expects its instance gone within TTL + 2 s.
func TestKilledProviderDisappears(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	const ttl = 2 * time.Second
	svc := service(t)
	watcher := newRegistry(t, srv, Config{})
	w, err := watcher.Watch(ctxFor(t, 5*time.Second), svc)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	waitSet(t, w, time.Second, "before the provider starts")

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s|%s|p1|%s", providerEnv, srv.Endpoint(), svc, ttl))
	dieWithTest(cmd)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- s
	}()
	select {
	case s := <-line:
		if strings.TrimSpace(s) != "registered" {
			t.Fatalf("provider said %q, stderr: %s", s, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("provider did not register within 10s; stderr: %s", stderr.String())
	}
	waitSet(t, w, time.Second, "provider registered", "p1")

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	waitSet(t, w, ttl+2*time.Second, "provider killed")
	t.Logf("killed provider gone after %v (TTL %v)", time.Since(killed).Round(10*time.Millisecond), ttl)
}

// TestRevokedLeaseReRegisters revokes the registry's lease behind its back
// and expects the instance back within 5 s with no call from the user.
func TestRevokedLeaseReRegisters(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	r := newRegistry(t, srv, Config{TTL: 2 * time.Second})
	consumer := newRegistry(t, srv, Config{})
	svc := service(t)
	ctx := ctxFor(t, 20*time.Second)
	if err := r.Register(ctx, registry.Instance{Service: svc, ID: "a", Addr: "127.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	w, err := consumer.Watch(ctx, svc)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	waitSet(t, w, time.Second, "registered", "a")

	old := r.leaseID()
	if _, err := newClient(t, srv).Revoke(ctx, old); err != nil {
		t.Fatal(err)
	}
	waitSet(t, w, time.Second, "lease revoked")
	took := waitSet(t, w, 5*time.Second, "re-registered after the revoke", "a")
	if id := r.leaseID(); id == old || id == 0 {
		t.Errorf("lease after recovery = %x, want a new one (old %x)", int64(id), int64(old))
	}
	t.Logf("re-registered %v after the revoke was seen", took.Round(10*time.Millisecond))
}

// TestOutageLongerThanTTL stops etcd for longer than the lease TTL and
// expects the instance registered again within 5 s of etcd being back.
func TestOutageLongerThanTTL(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	r := newRegistry(t, srv, Config{TTL: 2 * time.Second, RequestTimeout: time.Second})
	svc := service(t)
	ctx := ctxFor(t, 30*time.Second)
	in := registry.Instance{Service: svc, ID: "a", Addr: "127.0.0.1:1"}
	if err := r.Register(ctx, in); err != nil {
		t.Fatal(err)
	}
	old := r.leaseID()

	srv.Stop()
	// The lease is lost once the TTL passes without a keep-alive answer;
	// the registry then drops it and starts granting a new one.
	waitFor(t, 2*time.Second+3*time.Second, "the registry to notice the lost lease", func() bool { return r.leaseID() != old })

	srv.Start(t)
	back := time.Now()
	cli := newClient(t, srv)
	waitFor(t, 5*time.Second, "the instance on a new live lease", func() bool {
		gctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		resp, err := cli.Get(gctx, r.key(in))
		if err != nil || len(resp.Kvs) != 1 {
			return false
		}
		lease := clientv3.LeaseID(resp.Kvs[0].Lease)
		if lease == old || lease == 0 {
			return false
		}
		ttl, err := cli.TimeToLive(gctx, lease)
		return err == nil && ttl.TTL > 0
	})
	t.Logf("re-registered %v after etcd was back", time.Since(back).Round(10*time.Millisecond))
}
