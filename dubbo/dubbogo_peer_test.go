package dubbo_test

import (
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dabbrpc/dabb/dubbo/internal/dubbogotest"
	"github.com/dabbrpc/dabb/internal/wait"
	"github.com/dabbrpc/dabb/internal/zktest"
)

const inventoryInterface = "com.example.inventory.InventoryService"

// providerURLs returns the decoded URLs under /dubbo/{iface}/providers.
func providerURLs(t *testing.T, conn *zk.Conn, iface string) []string {
	t.Helper()
	children, _, err := conn.Children("/dubbo/" + iface + "/providers")
	if err == zk.ErrNoNode {
		return nil
	}
	if err != nil {
		t.Fatalf("children of /dubbo/%s/providers: %v", iface, err)
	}
	urls := make([]string, 0, len(children))
	for _, c := range children {
		u, err := url.QueryUnescape(c)
		if err != nil {
			t.Fatalf("node %q is not URL-encoded: %v", c, err)
		}
		urls = append(urls, u)
	}
	return urls
}

// TestDubbogoPeer proves the dubbo-go peer and its harness against a real
// ZooKeeper: the consumer finds the provider and calls every method typed
// and generically, errors included, and 1,000 deductions from 8
// goroutines all succeed.
func TestDubbogoPeer(t *testing.T) {
	srv := zktest.Shared(t)
	p := dubbogotest.StartProvider(t, dubbogotest.ProviderConfig{ZooKeeper: srv.Addr()})

	conn := zktest.Client(t, srv.Addr())
	urls := providerURLs(t, conn, inventoryInterface)
	if len(urls) != 1 {
		t.Fatalf("providers of %s = %q, want one", inventoryInterface, urls)
	}
	t.Logf("provider URL: %s", urls[0])
	u, err := url.Parse(urls[0])
	if err != nil {
		t.Fatal(err)
	}
	if want := "127.0.0.1:" + strconv.Itoa(p.Port); u.Scheme != "dubbo" || u.Host != want || u.Path != "/"+inventoryInterface {
		t.Errorf("provider URL = %s, want dubbo://%s/%s?...", urls[0], want, inventoryInterface)
	}
	q := u.Query()
	for k, want := range map[string]string{"interface": inventoryInterface, "side": "provider", "serialization": "hessian2"} {
		if got := q.Get(k); got != want {
			t.Errorf("provider URL %s = %q, want %q", k, got, want)
		}
	}
	for _, m := range []string{"deduct", "stock", "deductOnce"} {
		if !strings.Contains(","+q.Get("methods")+",", ","+m+",") {
			t.Errorf("provider URL methods = %q, want %s among them", q.Get("methods"), m)
		}
	}

	for _, generic := range []bool{false, true} {
		t.Run("inventory generic="+strconv.FormatBool(generic), func(t *testing.T) {
			calls := dubbogotest.RunScript(t, dubbogotest.ConsumerConfig{ZooKeeper: srv.Addr(), Script: "inventory", Generic: generic})
			checkInventory(t, calls, generic, false)
		})
		t.Run("greeter generic="+strconv.FormatBool(generic), func(t *testing.T) {
			calls := dubbogotest.RunScript(t, dubbogotest.ConsumerConfig{ZooKeeper: srv.Addr(), Script: "greeter", Generic: generic})
			checkGreeter(t, calls, generic)
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
	})

	t.Run("load until stopped", func(t *testing.T) {
		l := dubbogotest.StartLoad(t, dubbogotest.ConsumerConfig{ZooKeeper: srv.Addr(), Load: "stock", K: 2})
		s := l.Stop(t)
		if s.Calls == 0 || s.Failures != 0 || s.OK != s.Calls {
			t.Errorf("load = %d calls, %d ok, %d failed (%q), want some, all ok", s.Calls, s.OK, s.Failures, s.Errors)
		}
	})

	// On SIGTERM the provider deregisters before it exits.
	p.Stop()
	wait.Until(t, 10*time.Second, 50*time.Millisecond, "the provider's node to go", func() bool {
		return len(providerURLs(t, conn, inventoryInterface)) == 0
	})
}

// byStep indexes calls by step, failing on a step missing from want.
func byStep(t *testing.T, calls []dubbogotest.Call, want ...string) map[string]dubbogotest.Call {
	t.Helper()
	m := make(map[string]dubbogotest.Call, len(calls))
	for _, c := range calls {
		m[c.Step] = c
	}
	for _, s := range want {
		if _, ok := m[s]; !ok {
			t.Fatalf("no step %s among %d calls", s, len(calls))
		}
	}
	return m
}

func decode[T any](t *testing.T, c dubbogotest.Call) T {
	t.Helper()
	var v T
	if err := c.Decode(&v); err != nil {
		t.Fatalf("%s: %v", c.Step, err)
	}
	return v
}

// wantThrown checks that c failed with a Java exception of class whose
// message holds text.
func wantThrown(t *testing.T, c dubbogotest.Call, class, text string) {
	t.Helper()
	if c.ErrorClass != class || !strings.Contains(c.Error, text) {
		t.Errorf("%s: error %s %q, want %s with %q", c.Step, c.ErrorClass, c.Error, class, text)
	}
}

// wantGenericThrown checks that c failed with an error, not an exception
// dubbo-go could name, whose text holds class and then text.
func wantGenericThrown(t *testing.T, c dubbogotest.Call, class, text string) {
	t.Helper()
	i := strings.Index(c.Error, class+": ")
	if c.ErrorClass != "" || i < 0 || !strings.Contains(c.Error[i:], text) {
		t.Errorf("%s: error %s %q, want an error naming %s with %q", c.Step, c.ErrorClass, c.Error, class, text)
	}
}

// checkInventory checks the calls of the consumer's inventory script. With
// wrapped, the errors of generic calls come as Java 3.3's GenericFilter
// sends them, a GenericException naming the thrown class, which dubbo-go
// gives as an error whose text holds the class and the message.
func checkInventory(t *testing.T, calls []dubbogotest.Call, generic, wrapped bool) {
	t.Helper()
	wantThrown := wantThrown
	if generic && wrapped {
		wantThrown = wantGenericThrown
	}
	m := byStep(t, calls, "stock", "deduct", "stock-after-deduct", "deduct-short", "deduct-zero",
		"deduct-unknown", "stock-unknown", "deduct-once", "deduct-once-again", "deduct-once-zero")
	for _, c := range calls {
		if c.Generic != generic {
			t.Errorf("%s: generic = %v, want %v", c.Step, c.Generic, generic)
		}
	}
	before := decode[int64](t, m["stock"])
	if before <= 0 {
		t.Fatalf("stock = %d, want units left", before)
	}
	if !decode[bool](t, m["deduct"]) {
		t.Error("deduct(10086, 5) = false, want true")
	}
	after := decode[int64](t, m["stock-after-deduct"])
	if after != before-5 {
		t.Errorf("stock after deducting 5 = %d, want %d", after, before-5)
	}
	if decode[bool](t, m["deduct-short"]) {
		t.Error("deduct of more than the stock = true, want false")
	}
	const iae = "java.lang.IllegalArgumentException"
	wantThrown(t, m["deduct-zero"], iae, "count")
	wantThrown(t, m["deduct-unknown"], iae, "99999")
	wantThrown(t, m["stock-unknown"], iae, "99999")
	wantThrown(t, m["deduct-once-zero"], iae, "count")
	type reply struct {
		Class     string `json:"class"`
		Remaining int64  `json:"remaining"`
		Duplicate bool   `json:"duplicate"`
	}
	first, again := decode[reply](t, m["deduct-once"]), decode[reply](t, m["deduct-once-again"])
	if first.Remaining != after-3 || first.Duplicate {
		t.Errorf("deductOnce = %+v, want remaining %d, not a duplicate", first, after-3)
	}
	if again.Remaining != first.Remaining || !again.Duplicate {
		t.Errorf("deductOnce again = %+v, want remaining %d, a duplicate", again, first.Remaining)
	}
	// A generic call answers a POJO as a map naming its Java class.
	wantClass := ""
	if generic {
		wantClass = "com.example.inventory.DeductReply"
	}
	if first.Class != wantClass || again.Class != wantClass {
		t.Errorf("deductOnce class = %q and %q, want %q", first.Class, again.Class, wantClass)
	}
}

func checkGreeter(t *testing.T, calls []dubbogotest.Call, generic bool) {
	t.Helper()
	m := byStep(t, calls, "say-hello", "greet", "fail")
	if got := decode[string](t, m["say-hello"]); got != "hello world" {
		t.Errorf("sayHello(world) = %q, want %q", got, "hello world")
	}
	type helloReply struct {
		Class   string `json:"class"`
		Message string `json:"message"`
		Length  int32  `json:"length"`
	}
	got := decode[helloReply](t, m["greet"])
	want := helloReply{Message: "hello pojo", Length: 10}
	if generic {
		want.Class = "com.example.HelloReply"
	}
	if got != want {
		t.Errorf("greet = %+v, want %+v", got, want)
	}
	wantThrown(t, m["fail"], "java.lang.RuntimeException", "always fails")
}
