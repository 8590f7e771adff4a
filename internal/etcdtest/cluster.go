// Clusters of etcd server processes, for tests of a registry that loses a member.

package etcdtest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Cluster is n etcd members on loopback that form one cluster.
type Cluster struct {
	Members []*Server
}

// StartCluster starts an n-member cluster on free ports, waits until every
// member is healthy and arranges for all of them to be killed and their
// data removed when the test ends.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	bin := binary(t)
	c := &Cluster{}
	peers := make([]string, 0, n)
	for i := range n {
		s, err := newServer(bin)
		if err != nil {
			t.Fatalf("etcdtest: cluster member %d: %v", i, err)
		}
		t.Cleanup(s.destroy)
		c.Members = append(c.Members, s)
		peers = append(peers, s.name+"=http://127.0.0.1:"+strconv.Itoa(s.peerPort))
	}
	token := "etcdtest-cluster-" + strconv.Itoa(c.Members[0].clientPort)
	for _, s := range c.Members {
		s.cluster, s.token = strings.Join(peers, ","), token
	}
	// A member is healthy only once a quorum runs: start them together.
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, s := range c.Members {
		wg.Go(func() { errs[i] = s.start() })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("etcdtest: cluster member %d: %v", i, err)
		}
	}
	return c
}

// Endpoints returns every member's client address.
func (c *Cluster) Endpoints() []string {
	eps := make([]string, len(c.Members))
	for i, s := range c.Members {
		eps[i] = s.Endpoint()
	}
	return eps
}

// URL returns an etcd:// registry URL over every member, with prefix.
func (c *Cluster) URL(prefix string) string {
	return "etcd://" + strings.Join(c.Endpoints(), ",") + prefix
}

// Leader returns the member that leads the cluster now, asking each
// running member until one knows, within timeout.
func (c *Cluster) Leader(ctx context.Context, timeout time.Duration) (*Server, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for ctx.Err() == nil {
		for _, s := range c.Members {
			if !s.Running() {
				continue
			}
			if lead, ok := leaderOf(ctx, s); ok {
				for _, m := range c.Members {
					if id, ok := memberID(ctx, m); ok && id == lead {
						return m, nil
					}
				}
			}
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	return nil, fmt.Errorf("etcdtest: no member named a leader within %v", timeout)
}

// leaderOf asks s for the id of the member it follows.
func leaderOf(ctx context.Context, s *Server) (uint64, bool) {
	st, ok := status(ctx, s)
	if !ok || st.Leader == 0 {
		return 0, false
	}
	return st.Leader, true
}

// memberID asks s for its own member id.
func memberID(ctx context.Context, s *Server) (uint64, bool) {
	if !s.Running() {
		return 0, false
	}
	st, ok := status(ctx, s)
	if !ok {
		return 0, false
	}
	return st.Header.MemberId, true
}

func status(ctx context.Context, s *Server) (*clientv3.StatusResponse, bool) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint()}, DialTimeout: time.Second, Logger: nopLogger})
	if err != nil {
		return nil, false
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	st, err := cli.Status(ctx, s.Endpoint())
	return st, err == nil
}

// nopLogger keeps the client's own logging out of the tests' output.
var nopLogger = zap.NewNop()
