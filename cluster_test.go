// End-to-end tests against registry clusters that lose a member: etcd and ZooKeeper.

package dabb_test

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/internal/etcdtest"
	"github.com/dabbrpc/dabb/internal/zktest"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/go-zookeeper/zk"
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

	l := startLoad(ctx, c, 8)
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
	calls, failed, firstErr := l.end()
	if n := failed; n != 0 {
		t.Fatalf("%d of %d calls failed across the leader's death; first: %v", n, calls, firstErr)
	}
	if calls < 100 {
		t.Fatalf("only %d calls across the failover", calls)
	}
	leasesAfter := leases(ctx, t, etcd)
	for key, lease := range leasesBefore {
		if leasesAfter[key] != lease {
			t.Errorf("%s: lease %x before the failover, %x after: the provider lost its lease", key, lease, leasesAfter[key])
		}
	}
	t.Logf("%d calls, none failed, across the leader's kill -9", calls)
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

// TestZooKeeperNodeKilled: a 3-node ZooKeeper ensemble loses, to kill -9,
// the node that holds the providers' session, while a client calls them.
// No call fails, the session survives (the ephemeral nodes keep their
// owner past the session timeout), and a provider registered after the
// failover reaches the running client within 2 s.
func TestZooKeeperNodeKilled(t *testing.T) {
	e := zktest.StartEnsemble(t, 3)
	url := e.URL("/services?session_timeout=2s")
	before := e.Connections()
	serverReg := openRegistry(t, url)
	p := newProbe()
	startServer(t, p, dabb.WithRegistry(serverReg))
	startServer(t, p, dabb.WithRegistry(serverReg))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	held := -1
	for held < 0 {
		for i, n := range e.Connections() {
			if n > before[i] {
				held = i
			}
		}
		if held < 0 {
			select {
			case <-ctx.Done():
				t.Fatalf("no node reports the providers' connection: before %v, now %v", before, e.Connections())
			case <-time.After(20 * time.Millisecond): // srvr has no change event
			}
		}
	}
	c, err := proxy.NewClient(openRegistry(t, url), proxy.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitInstances(ctx, t, c, 2)

	conn, _, err := zk.Connect(e.Addrs(), 2*time.Second, zk.WithLogInfo(false), zk.WithLogger(quietZK{}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ownersBefore := ephemeralOwners(t, conn, "/services/"+probeDesc.Name)
	if len(ownersBefore) != 2 {
		t.Fatalf("ZooKeeper holds %d instance nodes, want 2: %v", len(ownersBefore), ownersBefore)
	}

	l := startLoad(ctx, c, 8)
	e.Members[held].Kill()
	// Past the 2 s session timeout: a session the failover lost would
	// have expired by now, and its nodes been made again by a new one.
	time.Sleep(3 * time.Second) // the span under test, not a synchronisation
	startServer(t, p, dabb.WithRegistry(serverReg))
	seen := time.Now()
	waitInstancesWithin(ctx, t, c, 3, 2*time.Second)
	t.Logf("the third provider reached the client %v after it registered", time.Since(seen).Round(time.Millisecond))
	calls, failed, firstErr := l.end()
	if n := failed; n != 0 {
		t.Fatalf("%d of %d calls failed across the node's death; first: %v", n, calls, firstErr)
	}
	if calls < 100 {
		t.Fatalf("only %d calls across the failover", calls)
	}
	ownersAfter := ephemeralOwners(t, conn, "/services/"+probeDesc.Name)
	for node, owner := range ownersBefore {
		if ownersAfter[node] != owner {
			t.Errorf("%s: owned by session %x before the failover, %x after: the provider lost its session", node, owner, ownersAfter[node])
		}
	}
	t.Logf("%d calls, none failed, across the kill -9 of node %d", calls, held+1)
}

// ephemeralOwners returns the session that owns each child of parent.
func ephemeralOwners(t *testing.T, conn *zk.Conn, parent string) map[string]int64 {
	t.Helper()
	children, _, err := conn.Children(parent)
	if err != nil {
		t.Fatalf("children of %s: %v", parent, err)
	}
	out := make(map[string]int64, len(children))
	for _, ch := range children {
		_, st, err := conn.Get(parent + "/" + ch)
		if err != nil {
			t.Fatalf("get %s/%s: %v", parent, ch, err)
		}
		out[ch] = st.EphemeralOwner
	}
	return out
}

// quietZK drops go-zookeeper's own log lines.
type quietZK struct{}

func (quietZK) Printf(string, ...any) {}
