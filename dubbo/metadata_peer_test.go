package dubbo_test

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/dubbo"
	"github.com/dabbrpc/dabb/dubbo/internal/dubbogotest"
	"github.com/dabbrpc/dabb/internal/zktest"
	gozk "github.com/go-zookeeper/zk"
)

// javaInventoryDefinition is InventoryService's service definition as
// Java Dubbo's ZookeeperMetadataReport stores it: a FullServiceDefinition
// written by JsonUtils (fastjson2 by default, fields in name order, nulls
// left out), its parameters the provider URL's. deduct and restock take
// (long, int); the types inferred from two JSON integers would be (long,
// long). The dubbo-go provider has no restock.
const javaInventoryDefinition = `{"annotations":[],"canonicalName":"com.example.inventory.InventoryService",` +
	`"codeSource":"file:/app/lib/inventory-api-1.0.0.jar","methods":[` +
	`{"annotations":[],"name":"deduct","parameterTypes":["long","int"],"returnType":"boolean"},` +
	`{"annotations":[],"name":"stock","parameterTypes":["long"],"returnType":"long"},` +
	`{"annotations":[],"name":"restock","parameterTypes":["long","int"],"returnType":"void"},` +
	`{"annotations":[],"name":"deductOnce","parameterTypes":["com.example.inventory.DeductRequest"],"returnType":"com.example.inventory.DeductReply"}],` +
	`"parameters":{"anyhost":"true","application":"inventory-java","deprecated":"false","dubbo":"2.0.2","dynamic":"true",` +
	`"generic":"false","interface":"com.example.inventory.InventoryService","methods":"deduct,deductOnce,restock,stock",` +
	`"pid":"4242","release":"3.3.2","service-name-mapping":"true","side":"provider","timestamp":"1764752400000"},` +
	`"types":[{"type":"boolean"},{"type":"int"},{"type":"long"},` +
	`{"properties":{"count":"int","requestId":"java.lang.String","sku":"long"},"type":"com.example.inventory.DeductRequest"},` +
	`{"properties":{"deducted":"boolean","remaining":"long"},"type":"com.example.inventory.DeductReply"}]}`

// writeJavaDefinition writes data at Java's path of an interface's
// provider definition for application app (no version, no group), its
// parents persistent and empty, removed when the test ends.
func writeJavaDefinition(t *testing.T, conn *gozk.Conn, iface, app, data string) {
	t.Helper()
	dir := "/dubbo/metadata/" + iface + "/provider"
	p := ""
	for _, seg := range strings.Split(strings.TrimPrefix(dir, "/"), "/") {
		p += "/" + seg
		if _, err := conn.Create(p, nil, 0, gozk.WorldACL(gozk.PermAll)); err != nil && !errors.Is(err, gozk.ErrNodeExists) {
			t.Fatalf("create %s: %v", p, err)
		}
	}
	node := dir + "/" + app
	if _, err := conn.Create(node, []byte(data), 0, gozk.WorldACL(gozk.PermAll)); err != nil {
		t.Fatalf("create %s: %v", node, err)
	}
	t.Cleanup(func() { _ = conn.Delete(node, -1) })
}

// TestGenericTypesFromJavaMetadataReport: dubbo-go v3.3 publishes no
// service definition (only the application-level MetadataInfo, which
// names no parameter types), so a node in the form Java writes stands in
// for one. With it, a generic call to the dubbo-go provider without types
// sends (long, int), from Go and from the built dabbctl; a
// second application defining another deduct of two parameters makes
// dabbctl ask for -types.
func TestGenericTypesFromJavaMetadataReport(t *testing.T) {
	srv := zktest.Shared(t)
	p := dubbogotest.StartProvider(t, dubbogotest.ProviderConfig{ZooKeeper: srv.Addr(), Services: []string{"inventory"}})
	defer stopProvider(t, srv.Addr(), p)
	conn := zktest.Client(t, srv.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// dubbo-go resolves a generic call by the method name alone, so the
	// types that reach it show in its answer about a method it lacks:
	// restock, which the definition declares as (long, int).
	c := newDubboClient(t, srv.Addr())
	_, err := dubbo.Invoke(ctx, c, inventoryInterface, "restock", nil, []any{10086, 1})
	if !errors.Is(err, dubbo.ErrNoSuchMethod) || !strings.Contains(err.Error(), "restock(long, long) (types inferred)") {
		t.Fatalf("restock(10086, 1) before the definition = %v; want ErrNoSuchMethod with the types inferred", err)
	}

	writeJavaDefinition(t, conn, inventoryInterface, "inventory-java", javaInventoryDefinition)
	// A new client: the first one keeps "no definition" for a while.
	c = newDubboClient(t, srv.Addr())
	_, err = dubbo.Invoke(ctx, c, inventoryInterface, "restock", nil, []any{10086, 1})
	if !errors.Is(err, dubbo.ErrNoSuchMethod) || !strings.Contains(err.Error(), "restock(long, int) (types from the provider's service definition)") {
		t.Fatalf("restock(10086, 1) with the definition = %v; want ErrNoSuchMethod with the types from the definition", err)
	}
	got, err := dubbo.Invoke(ctx, c, inventoryInterface, "deduct", nil, []any{10086, 1})
	if err != nil || got != true {
		t.Fatalf("deduct(10086, 1) without types = %#v, %v; want true, with (long, int) from the definition", got, err)
	}

	bin := buildDabbctl(t, t.TempDir())
	ctl := func(args ...string) (stdout, stderr string, code int) {
		cmd := exec.CommandContext(ctx, bin, append([]string{"-registry", "zookeeper://" + srv.Addr()}, args...)...)
		var out, errOut strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("dabbctl %q: %v", args, err)
		}
		return out.String(), errOut.String(), code
	}
	if out, errOut, code := ctl("call", inventoryInterface+".deduct", "[10086, 1]"); code != 0 || out != "true\n" {
		t.Errorf("dabbctl call deduct without -types: exit %d, stdout %q, stderr %q; want true", code, out, errOut)
	}

	_, errOut, code := ctl("call", inventoryInterface+".restock", "[10086, 1]")
	if code != 1 || !strings.Contains(errOut, "restock(long, int) (types from the provider's service definition)") {
		t.Errorf("dabbctl call restock without -types: exit %d, stderr %q; want 1, the types from the definition named", code, errOut)
	}

	writeJavaDefinition(t, conn, inventoryInterface, "inventory-java-next",
		strings.Replace(javaInventoryDefinition, `"parameterTypes":["long","int"]`, `"parameterTypes":["long","long"]`, 1))
	_, errOut, code = ctl("call", inventoryInterface+".deduct", "[10086, 1]")
	if code != 1 || !strings.Contains(errOut, "deduct(long, int), deduct(long, long)") || !strings.Contains(errOut, "-types") {
		t.Errorf("dabbctl call of an overloaded deduct: exit %d, stderr %q; want 1, both overloads named and -types asked for", code, errOut)
	}
	if out, errOut, code := ctl("call", "-types", "long,int", inventoryInterface+".deduct", "[10086, 1]"); code != 0 || out != "true\n" {
		t.Errorf("dabbctl call -types long,int deduct: exit %d, stdout %q, stderr %q; want true", code, out, errOut)
	}
}
