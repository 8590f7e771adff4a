// Command peer is dubbo-go playing the other side of dabb's Dubbo interop
// tests: a provider of the Java interfaces the tests call, or a consumer
// that calls them and prints what it saw as JSON lines.
//
//	peer provider -zk 127.0.0.1:2181 -port 20880 [-group g] [-version v] [-app name] [-services inventory,greeter]
//	peer consumer -zk 127.0.0.1:2181 -script inventory|greeter [-group g] [-version v]
//	peer consumer -zk 127.0.0.1:2181 -load deduct|stock -n 1000 -k 8
//
// Both register in ZooKeeper in Dubbo's interface-level layout under
// /dubbo, speak the dubbo protocol with hessian2 bodies, and print one
// line {"event":"ready",...} when they are serving or have found a
// provider. SIGTERM ends either cleanly: the provider deregisters, a
// consumer in load mode prints its summary.
//
// It is a module of its own so that dubbo-go's requirements never meet
// dabb's; tests build it with GOWORK=off.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sync"

	"github.com/dubbogo/gost/log/logger"
	"go.uber.org/zap"

	// The plugins the peer uses, instead of dubbo-go's imports package,
	// which links every registry, protocol and filter dubbo-go has.
	_ "dubbo.apache.org/dubbo-go/v3/cluster/cluster/failover"
	_ "dubbo.apache.org/dubbo-go/v3/cluster/loadbalance/random"
	_ "dubbo.apache.org/dubbo-go/v3/filter/echo"
	_ "dubbo.apache.org/dubbo-go/v3/filter/generic"
	_ "dubbo.apache.org/dubbo-go/v3/filter/graceful_shutdown"
	_ "dubbo.apache.org/dubbo-go/v3/protocol/dubbo"
	_ "dubbo.apache.org/dubbo-go/v3/proxy/proxy_factory"
	_ "dubbo.apache.org/dubbo-go/v3/registry/directory"
	_ "dubbo.apache.org/dubbo-go/v3/registry/protocol"
	_ "dubbo.apache.org/dubbo-go/v3/registry/zookeeper"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: peer provider|consumer [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "provider":
		err = runProvider(os.Args[2:])
	case "consumer":
		err = runConsumer(os.Args[2:])
	default:
		err = fmt.Errorf("unknown mode %q: want provider or consumer", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "peer:", err)
		os.Exit(1)
	}
}

// common are the flags both modes take.
type common struct {
	zk      string
	group   string
	version string
	app     string
	log     string
}

func (c *common) register(fs *flag.FlagSet, app string) {
	fs.StringVar(&c.zk, "zk", "127.0.0.1:2181", "ZooKeeper address `host:port`")
	fs.StringVar(&c.group, "group", "", "Dubbo service group")
	fs.StringVar(&c.version, "version", "", "Dubbo service version")
	fs.StringVar(&c.app, "app", app, "application name")
	fs.StringVar(&c.log, "log", "warn", "dubbo-go's log `level` (debug, info, warn, error), written to standard error")
}

// setup sends dubbo-go's log to standard error, which it writes to
// standard output by default, where the JSON lines go.
func (c *common) setup() error {
	level, err := zap.ParseAtomicLevel(c.log)
	if err != nil {
		return fmt.Errorf("-log: %w", err)
	}
	enc := zap.NewDevelopmentEncoderConfig()
	logger.InitLogger(&logger.Config{ZapConfig: &zap.Config{
		Level:            level,
		Encoding:         "console",
		EncoderConfig:    enc,
		OutputPaths:      []string{"stderr"},
		ErrorOutputPaths: []string{"stderr"},
	}})
	return nil
}

var outMu sync.Mutex

// emit prints v as one JSON line on standard output.
func emit(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		b, _ = json.Marshal(map[string]string{"event": "error", "error": err.Error()})
	}
	outMu.Lock()
	defer outMu.Unlock()
	os.Stdout.Write(append(b, '\n'))
}
