// End-to-end tests against a registry cluster that loses a member.

package dabb_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/internal/etcdtest"
	"github.com/dabbrpc/dabb/proxy"
)

// TestEtcdLeaderKilled: a 3-member etcd cluster loses its leader to
// kill -9 while a client calls two providers found through it. No call
// fails, the providers keep their leases (a quorum remains, so nothing
// re-registers), and a provider registered after the failover reaches
// the running client within 2 s.
func TestEtcdLeaderKilled(t *testing.T) {
	cl := etcdtest.StartCluster(t, 3)
	url := cl.URL("/services?ttl=2s")
	serverReg := openRegistry(t, url)
	p := newProbe()
	startServer(t, p, dabb.WithRegistry(serverReg))
	startServer(t, p, dabb.WithRegistry(serverReg))
	c, err := proxy.NewClient(openRegistry(t, url), proxy.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	waitInstances(ctx, t, c, 2)

	etcd, err := clientv3.New(clientv3.Config{Endpoints: cl.Endpoints(), DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	leasesBefore := leases(ctx, t, etcd)
	if len(leasesBefore) != 2 {
		t.Fatalf("etcd holds %d instance keys, want 2: %v", len(leasesBefore), leasesBefore)
	}

	var calls, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				calls.Add(1)
				if _, err := call(ctx, c, "echo"); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}
		})
	}
	leader, err := cl.Leader(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	leader.Kill()
	next, err := cl.Leader(ctx, 10*time.Second)
	if err != nil {
		t.Fatalf("after killing the leader: %v", err)
	}
	if next == leader {
		t.Fatal("the killed member still leads")
	}
	// Past the lease's 2 s TTL: a lease the failover lost would have
	// expired by now, and its provider re-registered under a new one.
	time.Sleep(3 * time.Second) // the span under test, not a synchronisation
	startServer(t, p, dabb.WithRegistry(serverReg))
	seen := time.Now()
	waitInstancesWithin(ctx, t, c, 3, 2*time.Second)
	t.Logf("the third provider reached the client %v after it registered", time.Since(seen).Round(time.Millisecond))
	close(stop)
	wg.Wait()
	if n := failed.Load(); n != 0 {
		t.Fatalf("%d of %d calls failed across the leader's death; first: %v", n, calls.Load(), firstErr.Load())
	}
	if calls.Load() < 100 {
		t.Fatalf("only %d calls across the failover", calls.Load())
	}
	leasesAfter := leases(ctx, t, etcd)
	for key, lease := range leasesBefore {
		if leasesAfter[key] != lease {
			t.Errorf("%s: lease %x before the failover, %x after: the provider lost its lease", key, lease, leasesAfter[key])
		}
	}
	t.Logf("%d calls, none failed, across the leader's kill -9", calls.Load())
}

// leases returns every instance key under /services with its lease.
func leases(ctx context.Context, t *testing.T, cli *clientv3.Client) map[string]clientv3.LeaseID {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, "/services/", clientv3.WithPrefix())
	if err != nil {
		t.Fatalf("list /services/: %v", err)
	}
	out := make(map[string]clientv3.LeaseID, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = clientv3.LeaseID(kv.Lease)
	}
	return out
}

// waitInstancesWithin is waitInstances bounded by d.
func waitInstancesWithin(ctx context.Context, t *testing.T, c *proxy.Client, n int, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	waitInstances(ctx, t, c, n)
}
