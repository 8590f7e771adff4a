package etcdembed_test

import (
	"context"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/dabbrpc/dabb/examples/internal/etcdembed"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestStartPutGetStop(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	for round, want := range []string{"", "v1"} { // a restart keeps the data
		endpoint, stop, err := etcdembed.Start(ctx, dir)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(endpoint, "127.0.0.1:") {
			stop()
			t.Fatalf("endpoint %q is not on 127.0.0.1", endpoint)
		}
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, Logger: zap.NewNop()})
		if err != nil {
			stop()
			t.Fatal(err)
		}
		resp, err := cli.Get(ctx, "/etcdembed/k")
		if err == nil {
			got := ""
			if len(resp.Kvs) == 1 {
				got = string(resp.Kvs[0].Value)
			}
			if got != want {
				t.Errorf("round %d: value = %q, want %q", round, got, want)
			}
			_, err = cli.Put(ctx, "/etcdembed/k", "v1")
		}
		cli.Close()
		stop()
		stop() // a second stop is harmless
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
}

func TestStartBadInput(t *testing.T) {
	if _, _, err := etcdembed.Start(context.Background(), ""); err == nil {
		t.Fatal("Start with an empty dir succeeded")
	}
}
