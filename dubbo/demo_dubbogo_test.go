package dubbo_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dabbrpc/dabb/dubbo/internal/dubbogotest"
	"github.com/dabbrpc/dabb/internal/proctest"
	"github.com/dabbrpc/dabb/internal/zktest"
)

// These tests run the inventory demo (examples/inventory) as Dubbo
// consumers meet it: a process serving com.example.inventory.InventoryService
// and published in ZooKeeper's interface-level layout, called by the
// dubbo-go peer.

// Bounds of the demo's waits, generous for a busy two-core machine.
const (
	// demoBuildTimeout bounds the demo's build.
	demoBuildTimeout = 10 * time.Minute
	// demoReadyTimeout bounds a demo's start and its node's appearance.
	demoReadyTimeout = 30 * time.Second
	// demoSession is the ZooKeeper session timeout the demo asks for.
	demoSession = 2 * time.Second
)

// buildDemo builds examples/inventory in the repository's workspace into
// a directory removed when the test ends, and returns the binary's path.
func buildDemo(t *testing.T) string {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "inventory")
	ctx, cancel := context.WithTimeout(context.Background(), demoBuildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./examples/inventory")
	cmd.Dir = root
	// An empty GOWORK finds the repository's go.work: the demo is built
	// with the dubbo module as it is here.
	cmd.Env = append(os.Environ(), "GOWORK=")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the demo in %s: %v\n%s", root, err, out)
	}
	return bin
}

// repoRoot returns the directory holding go.work, looked for from the
// working directory upwards.
func repoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; {
		if _, err := os.Stat(filepath.Join(d, "go.work")); err == nil {
			return d, nil
		}
		up := filepath.Dir(d)
		if up == d {
			return "", errors.New("no go.work above " + wd)
		}
		d = up
	}
}

// demo is a running inventory demo in server mode.
type demo struct {
	addr string
	proc *proctest.Process
	out  *proctest.Tail // standard output and error
}

// startDemo starts the demo in server mode on a free port, published
// through zookeeper://zkAddr, and waits until its provider node is in
// ZooKeeper. It is killed when the test ends.
func startDemo(t *testing.T, bin, zkAddr string, conn *zk.Conn) (*demo, string) {
	t.Helper()
	ports, err := proctest.FreePorts(1, 20880)
	if err != nil {
		t.Fatal(err)
	}
	d := &demo{addr: "127.0.0.1:" + strconv.Itoa(ports[0]), proc: new(proctest.Process), out: proctest.NewTail(16 << 10)}
	reg := fmt.Sprintf("zookeeper://%s?session=%d", zkAddr, demoSession.Milliseconds())
	cmd := exec.Command(bin, "-mode", "server", "-addr", d.addr, "-registry", reg)
	cmd.Stdout, cmd.Stderr = d.out, d.out
	t.Cleanup(d.proc.Kill)
	serving := func(context.Context) error {
		if strings.Contains(d.out.String(), "serving ") {
			return nil
		}
		return errors.New(`no "serving" line yet`)
	}
	if err := d.proc.Start(cmd, demoReadyTimeout, serving); err != nil {
		t.Fatalf("start the demo: %v\noutput:\n%s", err, d.out.String())
	}
	node := awaitProvider(t, conn, d.addr, true)
	return d, node
}

// stop sends SIGTERM and returns what the demo printed as it stopped: the
// calls it served and the units it deducted.
func (d *demo) stop(t *testing.T) (calls, deducted int64) {
	t.Helper()
	d.proc.Stop()
	m := regexp.MustCompile(`stopped: served (\d+) calls, deducted (\d+) units`).FindStringSubmatch(d.out.String())
	if m == nil {
		t.Fatalf("the demo did not say what it served as it stopped:\n%s", d.out.String())
	}
	calls, _ = strconv.ParseInt(m[1], 10, 64)
	deducted, _ = strconv.ParseInt(m[2], 10, 64)
	return calls, deducted
}

// providersPath is the node under which Dubbo providers of the demo's
// interface are published.
const providersPath = "/dubbo/" + inventoryInterface + "/providers"

// awaitProvider waits, by ZooKeeper watches, until a provider node for
// addr is present (or, with present false, gone) and returns its name.
func awaitProvider(t *testing.T, conn *zk.Conn, addr string, present bool) string {
	t.Helper()
	deadline := time.NewTimer(demoReadyTimeout)
	defer deadline.Stop()
	for {
		children, _, ch, err := conn.ChildrenW(providersPath)
		switch {
		case errors.Is(err, zk.ErrNoNode) && !present:
			return ""
		case errors.Is(err, zk.ErrNoNode):
			var ok bool
			ok, _, ch, err = conn.ExistsW(providersPath)
			if err == nil && ok {
				continue // created since: list it
			}
		case err == nil:
			node := providerOf(children, addr)
			if (node != "") == present {
				return node
			}
		}
		if err != nil {
			t.Fatalf("watch %s: %v", providersPath, err)
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("no provider node for %s %s within %v", addr, map[bool]string{true: "appeared", false: "went"}[present], demoReadyTimeout)
		}
	}
}

// awaitNode waits for node to exist, up to demoReadyTimeout.
func awaitNode(t *testing.T, conn *zk.Conn, node string) {
	t.Helper()
	deadline := time.NewTimer(demoReadyTimeout)
	defer deadline.Stop()
	for {
		ok, _, ch, err := conn.ExistsW(node)
		if err != nil {
			t.Fatalf("watch %s: %v", node, err)
		}
		if ok {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("no node %s within %v", node, demoReadyTimeout)
		}
	}
}

// sameSet reports whether a and b hold the same strings, in any order.
func sameSet(a, b []string) bool {
	return len(a) == len(b) && !slices.ContainsFunc(a, func(s string) bool { return !slices.Contains(b, s) })
}

// providerOf returns the node among children whose URL names addr.
func providerOf(children []string, addr string) string {
	for _, c := range children {
		raw, err := url.QueryUnescape(c)
		if err != nil {
			continue
		}
		if u, err := url.Parse(raw); err == nil && u.Host == addr {
			return c
		}
	}
	return ""
}

// TestDemoDubbogoConsumer proves that the demo joins a Dubbo estate: it
// publishes com.example.inventory.InventoryService with exactly deduct,
// deductOnce and stock in Dubbo's layout, and a dubbo-go v3.3.1 consumer
// that knows only the ZooKeeper address finds it and calls every method
// typed and with $invoke, errors included; 1,000 deducts from 8
// goroutines all succeed, stock falls by exactly 1,000, and the demo
// deducted exactly what the consumer was answered.
func TestDemoDubbogoConsumer(t *testing.T) {
	bin := buildDemo(t)
	dubbogotest.Binary(t) // built before the clock of any wait starts
	srv := zktest.Start(t)
	conn := zktest.Client(t, srv.Addr())
	d, node := startDemo(t, bin, srv.Addr(), conn)

	raw, err := url.QueryUnescape(node)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("provider URL: %s", raw)
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	if u.Scheme != "dubbo" || u.Path != "/"+inventoryInterface {
		t.Errorf("provider URL = %s, want dubbo://%s/%s?...", raw, d.addr, inventoryInterface)
	}
	q := u.Query()
	for k, want := range map[string]string{
		"interface": inventoryInterface, "methods": "deduct,deductOnce,stock", "side": "provider",
		"serialization": "hessian2", "application": "dabb-inventory",
	} {
		if got := q.Get(k); got != want {
			t.Errorf("provider URL %s = %q, want %q", k, got, want)
		}
	}
	// The demo publishes the service definition after the provider node.
	awaitNode(t, conn, "/dubbo/metadata/"+inventoryInterface+"/provider/dabb-inventory")
	// dabb's own service is served on the same port but not listed in
	// Dubbo's layout: /dubbo holds the interface and the metadata report.
	if ifaces, _, err := conn.Children("/dubbo"); err != nil || !sameSet(ifaces, []string{"metadata", inventoryInterface}) {
		t.Errorf("children of /dubbo = %q, %v; want only metadata and %s", ifaces, err, inventoryInterface)
	}

	for _, generic := range []bool{false, true} {
		t.Run("generic="+strconv.FormatBool(generic), func(t *testing.T) {
			calls := dubbogotest.RunScript(t, dubbogotest.ConsumerConfig{ZooKeeper: srv.Addr(), Script: "inventory", Generic: generic})
			checkInventory(t, calls, generic, true)
			if !generic { // the first calls: the catalogue's stock of 10086
				if got := decode[int64](t, byStep(t, calls, "stock")["stock"]); got != 1_000_000 {
					t.Errorf("stock(10086) of a new demo = %d, want 1000000", got)
				}
			}
		})
	}

	t.Run("load", func(t *testing.T) {
		s := dubbogotest.RunLoad(t, dubbogotest.ConsumerConfig{ZooKeeper: srv.Addr(), Load: "deduct", N: 1000, K: 8})
		if s.Calls != 1000 || s.OK != 1000 || s.False != 0 || s.Failures != 0 {
			t.Errorf("load = %d calls, %d ok, %d false, %d failed (%q), want 1000 ok", s.Calls, s.OK, s.False, s.Failures, s.Errors)
		}
		if s.StockBefore < 0 || s.StockBefore-s.StockAfter != 1000 {
			t.Errorf("stock went from %d to %d, want a fall of exactly 1000", s.StockBefore, s.StockAfter)
		}
		t.Logf("1,000 deducts from 8 goroutines in %.2fs", s.Seconds)
	})

	// Each script deducted 5 with deduct and 3 with deductOnce, whose
	// repeat deducted nothing; the load deducted 1,000.
	_, deducted := d.stop(t)
	if want := int64(2*(5+3) + 1000); deducted != want && !t.Failed() {
		t.Errorf("the demo deducted %d units, want %d", deducted, want)
	}
	// On SIGTERM the demo deregisters before it exits.
	awaitProvider(t, conn, d.addr, false)
}

// consTimeout returns the negotiated timeout of the session sid, as the
// server's cons command reports it.
func consTimeout(t *testing.T, srv *zktest.Server, sid int64) time.Duration {
	t.Helper()
	cons, err := zktest.FourLetter(srv.Addr(), "cons", 5*time.Second)
	if err != nil {
		t.Fatalf("cons: %v", err)
	}
	re := regexp.MustCompile(`sid=0x` + strconv.FormatInt(sid, 16) + `,[^)]*\bto=(\d+)`)
	m := re.FindStringSubmatch(cons)
	if m == nil {
		t.Fatalf("cons lists no session 0x%x with a timeout:\n%s", sid, cons)
	}
	ms, _ := strconv.Atoi(m[1])
	return time.Duration(ms) * time.Millisecond
}

// TestDemoKill9UnderDubbogoLoad proves what a Dubbo consumer sees when a
// dabb provider process dies without deregistering: of two demo
// processes under a dubbo-go consumer's load of stock calls, the one
// killed with SIGKILL has its node removed by ZooKeeper within the
// negotiated session timeout plus one tick, and the consumer's calls move
// to the other with none failing.
func TestDemoKill9UnderDubbogoLoad(t *testing.T) {
	bin := buildDemo(t)
	dubbogotest.Binary(t)
	srv := zktest.Start(t)
	conn := zktest.Client(t, srv.Addr())
	victim, victimNode := startDemo(t, bin, srv.Addr(), conn)
	survivor, _ := startDemo(t, bin, srv.Addr(), conn)

	load := dubbogotest.StartLoad(t, dubbogotest.ConsumerConfig{ZooKeeper: srv.Addr(), Load: "stock"})
	load.WaitProgress(t, "200 calls answered", func(p dubbogotest.LoadProgress) bool { return p.OK >= 200 })

	path := providersPath + "/" + victimNode
	_, stat, err := conn.Get(path)
	if err != nil {
		t.Fatalf("get %s: %v", path, err)
	}
	if stat.EphemeralOwner == 0 {
		t.Fatalf("%s is not ephemeral", path)
	}
	timeout := consTimeout(t, srv, stat.EphemeralOwner)
	// ZooKeeper ends the session within its timeout plus one tick (it
	// expires sessions in buckets of a tick). The allowance is for what
	// follows on a loaded machine: the expiry thread's delete, and the
	// watch event's way to this test.
	const allowance = 500 * time.Millisecond
	bound := timeout + zktest.TickTime
	exists, _, gone, err := conn.ExistsW(path)
	if err != nil || !exists {
		t.Fatalf("watch %s: exists %v, %v", path, exists, err)
	}

	killed := time.Now()
	victim.proc.Kill()
	select {
	case ev := <-gone:
		if ev.Type != zk.EventNodeDeleted {
			t.Fatalf("watch of %s: %v, want its deletion", path, ev)
		}
	case <-time.After(bound + 30*time.Second):
		t.Fatalf("%s still there %v after kill -9 (session timeout %v)", path, time.Since(killed), timeout)
	}
	took := time.Since(killed)
	t.Logf("node gone %v after kill -9; negotiated session timeout %v, tick %v", took.Round(time.Millisecond), timeout, zktest.TickTime)
	if took > bound+allowance {
		t.Errorf("node gone %v after kill -9, want within %v (session timeout %v plus one tick) and %v for the delete's delivery", took, bound, timeout, allowance)
	}

	// From the kill on only the survivor answers: the load goes on.
	atGone := load.WaitProgress(t, "a progress line", func(dubbogotest.LoadProgress) bool { return true })
	load.WaitProgress(t, "200 calls answered after the node went", func(p dubbogotest.LoadProgress) bool {
		return p.OK >= atGone.OK+200
	})
	s := load.Stop(t)
	if s.Failures != 0 || s.OK != s.Calls || s.OK == 0 {
		t.Errorf("load = %d calls, %d ok, %d failed (%q); want every call answered", s.Calls, s.OK, s.Failures, s.Errors)
	}
	served, _ := survivor.stop(t)
	if after := s.OK - atGone.OK; served < after {
		t.Errorf("the survivor served %d calls, fewer than the %d answered after the victim's node went", served, after)
	}
	t.Logf("load: %d stock calls, %d failed; the survivor served %d", s.Calls, s.Failures, served)
}
