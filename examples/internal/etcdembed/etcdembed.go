// Package etcdembed runs an etcd server inside the process, so the demo
// has a registry with nothing installed. The demo starts it so:
//
//	endpoint, stop, err := etcdembed.Start(ctx, "/tmp/inventory-etcd")
//	if err != nil { ... }
//	defer stop()
//	reg, err := etcd.New(etcd.Config{Endpoints: []string{endpoint}})
//
// The server listens on free 127.0.0.1 ports, logs only errors (to
// nowhere) and keeps its data in dir, so a restart on the same dir keeps
// what was stored.
package etcdembed

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"sync"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Start starts an etcd server keeping its data in dir and waits, bounded
// by ctx, until it serves. It returns the client endpoint (host:port) and
// a function that stops the server and waits for it to exit.
func Start(ctx context.Context, dir string) (endpoint string, stop func(), err error) {
	if dir == "" {
		return "", nil, fmt.Errorf("etcdembed: empty data directory")
	}
	ports, err := freePorts(2)
	if err != nil {
		return "", nil, err
	}
	client := url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(ports[0])}
	peer := url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(ports[1])}

	cfg := embed.NewConfig()
	cfg.Name = "dabb"
	cfg.Dir = dir
	cfg.ListenClientUrls = []url.URL{client}
	cfg.AdvertiseClientUrls = []url.URL{client}
	cfg.ListenPeerUrls = []url.URL{peer}
	cfg.AdvertisePeerUrls = []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.InitialClusterToken = "dabb-embedded"
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.TickMs = 50
	cfg.ElectionMs = 500

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return "", nil, fmt.Errorf("etcdembed: start in %s: %w", dir, err)
	}
	var once sync.Once
	stop = func() { once.Do(e.Close) }
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		stop()
		return "", nil, fmt.Errorf("etcdembed: server failed: %w", err)
	case <-ctx.Done():
		stop()
		return "", nil, fmt.Errorf("etcdembed: waiting for the server: %w", ctx.Err())
	case <-time.After(time.Minute):
		stop()
		return "", nil, fmt.Errorf("etcdembed: server not ready after a minute")
	}
	return client.Host, stop, nil
}

// freePorts returns n distinct ports free on 127.0.0.1 at the moment.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("etcdembed: free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
