// Ensembles of ZooKeeper server processes, for tests of a registry that loses a node.

package zktest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/proctest"
)

// Ensemble is n ZooKeeper servers on loopback that form one quorum.
type Ensemble struct {
	Members []*Server
}

// StartEnsemble starts an n-node ensemble on free ports, waits until every
// node serves, and arranges for all of them to be killed and their data
// removed when the test ends.
func StartEnsemble(t testing.TB, n int) *Ensemble {
	t.Helper()
	java, cp := install(t)
	ports, err := proctest.FreePorts(3*n, 2181, 2888, 3888)
	if err != nil {
		t.Fatalf("zktest: ensemble: %v", err)
	}
	// server.N=host:quorum port:election port, the same in every zoo.cfg.
	servers := make([]string, n)
	for i := range n {
		servers[i] = fmt.Sprintf("server.%d=127.0.0.1:%d:%d", i+1, ports[n+2*i], ports[n+2*i+1])
	}
	extra := append([]string{"initLimit=10", "syncLimit=5"}, servers...)
	e := &Ensemble{}
	for i := range n {
		s, err := newConfigured(java, cp, ports[i], extra)
		if err != nil {
			t.Fatalf("zktest: ensemble node %d: %v", i+1, err)
		}
		t.Cleanup(s.destroy)
		s.main = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
		data := filepath.Join(s.dir, "data")
		if err := os.MkdirAll(data, 0o755); err != nil {
			t.Fatalf("zktest: ensemble node %d: %v", i+1, err)
		}
		if err := os.WriteFile(filepath.Join(data, "myid"), []byte(strconv.Itoa(i+1)+"\n"), 0o644); err != nil {
			t.Fatalf("zktest: ensemble node %d: %v", i+1, err)
		}
		e.Members = append(e.Members, s)
	}
	// A node serves only once a quorum has elected a leader: start them
	// together.
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, s := range e.Members {
		wg.Go(func() { errs[i] = s.start() })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("zktest: ensemble node %d: %v", i+1, err)
		}
	}
	return e
}

// Addrs returns every node's client address.
func (e *Ensemble) Addrs() []string {
	addrs := make([]string, len(e.Members))
	for i, s := range e.Members {
		addrs[i] = s.Addr()
	}
	return addrs
}

// URL returns a zk:// registry URL over every node, with prefix.
func (e *Ensemble) URL(prefix string) string {
	return "zk://" + strings.Join(e.Addrs(), ",") + prefix
}

// Connections returns how many client connections each running node
// holds, by srvr; a node that does not answer counts -1.
func (e *Ensemble) Connections() []int {
	out := make([]int, len(e.Members))
	for i, s := range e.Members {
		out[i] = -1
		if !s.Running() {
			continue
		}
		stat, err := FourLetter(s.Addr(), "srvr", time.Second)
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(stat, "\n") {
			if v, ok := strings.CutPrefix(line, "Connections: "); ok {
				if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
					out[i] = n
				}
			}
		}
	}
	return out
}
