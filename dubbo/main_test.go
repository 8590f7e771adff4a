package dubbo

import (
	"testing"

	"github.com/dabbrpc/dabb/dubbo/internal/dubbogotest"
	"github.com/dabbrpc/dabb/internal/zktest"
	"go.uber.org/goleak"
)

// TestMain shares one ZooKeeper server among the package's tests (and the
// external test package's), removes the peer programs and the demo they
// built, and then checks for leaked goroutines.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(dubbogotest.WithPeer(cleanup{zktest.WithShared(m)}))
}

// cleanup runs the tests, then removes the peer builds.
type cleanup struct{ m interface{ Run() int } }

func (c cleanup) Run() int {
	defer removePeerBuilds()
	return c.m.Run()
}
