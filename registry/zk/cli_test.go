package zk

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/zktest"
	"github.com/dabbrpc/dabb/registry"
)

// TestLayoutWithZooKeeperShell looks at the tree with ZooKeeper's own
// shell, zkCli.sh, on a fresh server. Run with -v to see its output.
func TestLayoutWithZooKeeperShell(t *testing.T) {
	if _, err := zktest.CLIPath(); err != nil {
		t.Skip(err)
	}
	srv := zktest.Start(t)
	r := newRegistry(t, Config{Servers: []string{srv.Addr()}})
	instances := []registry.Instance{
		{Service: "inventory.Inventory", ID: "10.0.0.7:20880", Addr: "10.0.0.7:20880", Weight: 100,
			Metadata: map[string]string{"version": "1.2.0", "zone": "eu-1"}},
		{Service: "inventory.Inventory", ID: "10.0.0.8:20880", Addr: "10.0.0.8:20880"},
		{Service: "greeter.Greeter", ID: "10.0.0.9:20880", Addr: "10.0.0.9:20880"},
	}
	for _, in := range instances {
		if err := r.Register(ctxFor(t, 5*time.Second), in); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli := func(args ...string) []string {
		t.Helper()
		out, err := srv.CLI(ctx, args...)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("$ zkCli.sh -server %s %s\n%s", srv.Addr(), strings.Join(args, " "), out)
		return strings.Split(out, "\n")
	}
	has := func(lines []string, want string) bool {
		for _, l := range lines {
			if strings.TrimSpace(l) == want {
				return true
			}
		}
		return false
	}

	ls := cli("ls", "-R", "/services")
	for _, want := range []string{
		"/services",
		"/services/greeter.Greeter",
		"/services/inventory.Inventory",
		"/services/greeter.Greeter/10.0.0.9:20880",
		"/services/inventory.Inventory/10.0.0.7:20880",
		"/services/inventory.Inventory/10.0.0.8:20880",
	} {
		if !has(ls, want) {
			t.Errorf("ls -R /services lacks %q", want)
		}
	}

	in := instances[0]
	p := "/services/" + in.Service + "/" + in.ID
	data, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if get := cli("get", p); !has(get, string(data)) {
		t.Errorf("get %s lacks the instance as JSON, %s", p, data)
	}
	owner := fmt.Sprintf("ephemeralOwner = 0x%x", r.sess.conn.SessionID())
	if stat := cli("stat", p); !has(stat, owner) {
		t.Errorf("stat %s lacks %q", p, owner)
	}
	if stat := cli("stat", "/services/"+in.Service); !has(stat, "ephemeralOwner = 0x0") {
		t.Errorf("stat /services/%s: the service node is not persistent", in.Service)
	}
}
