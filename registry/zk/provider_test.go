package zk

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"
)

// The provider is this test binary run again with providerEnv set: it
// registers one instance and prints "session=<id>" each time its node is
// in place on a new session, until its standard input closes.
const (
	providerEnv            = "DABB_ZK_TEST_PROVIDER" // the server's address
	providerServiceEnv     = "DABB_ZK_TEST_PROVIDER_SERVICE"
	providerIDEnv          = "DABB_ZK_TEST_PROVIDER_ID"
	providerSessionTimeout = 2 * time.Second
)

func runProvider() int {
	addr, svc, id := os.Getenv(providerEnv), os.Getenv(providerServiceEnv), os.Getenv(providerIDEnv)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	r, err := New(Config{
		Servers:        []string{addr},
		SessionTimeout: providerSessionTimeout,
		RequestTimeout: 5 * time.Second,
		Logger:         log.With("process", "provider"),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "provider:", err)
		return 1
	}
	in := inst(svc, id)
	p := r.NodePath(svc, id)
	var mu sync.Mutex
	var last int64
	report := func(session int64) {
		mu.Lock()
		defer mu.Unlock()
		if session != 0 && session != last {
			last = session
			fmt.Printf("session=%d\n", session)
		}
	}
	setSessionHook(nil, r, func(session int64) {
		if _, ok := r.owns(p); ok {
			report(session)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Register(ctx, in); err != nil {
		fmt.Fprintln(os.Stderr, "provider:", err)
		return 1
	}
	report(r.sess.conn.SessionID())
	io.Copy(io.Discard, os.Stdin) // until the test is done with us
	r.Close()
	return 0
}
