// Package leaktest lists the goroutines the peer frameworks keep for the
// life of the process (package-level pools, tickers, pollers), which a
// bench test's goleak check must ignore:
//
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leaktest.Ignore()...) }
package leaktest

import "go.uber.org/goleak"

// Ignore returns goleak options ignoring the peers' process-wide
// goroutines. dabb's own goroutines are not in it: they must all end.
func Ignore() []goleak.Option {
	var opts []goleak.Option
	for _, f := range []string{
		"github.com/smallnest/rpcx/client.(*Client).heartbeat",
		"github.com/rcrowley/go-metrics.(*meterArbiter).tick",
		"google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run",
		"github.com/cloudwego/kitex/client.(*timeoutPool).createWorker.func1",
		"github.com/cloudwego/kitex/client.(*timeoutPool).createTicker.func1",
		"github.com/cloudwego/kitex/pkg/loadbalance/lbcache.(*BalancerFactory).watcher",
		"github.com/cloudwego/kitex/pkg/utils.(*SharedTicker).Tick",
		"github.com/cloudwego/kitex/pkg/utils.(*sharedTicker).Tick",
		"github.com/cloudwego/netpoll.(*defaultPoll).Wait",
		"github.com/bytedance/gopkg/util/gopool.(*worker).run.func1",
	} {
		opts = append(opts, goleak.IgnoreAnyFunction(f))
	}
	return opts
}
