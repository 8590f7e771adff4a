package dubbo_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/dubbo/internal/dubbogotest"
	"github.com/dabbrpc/dabb/internal/zktest"
)

// ctlRun is one run of the built dabbctl.
type ctlRun struct {
	stdout, stderr string
	code           int
}

// buildDabbctl builds cmd/dabbctl, the module beside this one, into dir.
func buildDabbctl(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "dabbctl")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = filepath.Join("..", "cmd", "dabbctl")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build dabbctl: %v\n%s", err, out)
	}
	return bin
}

// TestDabbctlOnDubbo runs the built dabbctl against dubbo-go providers
// found in ZooKeeper: ls, ls IFACE, ls -health, watch, and call with
// primitives, a POJO, types, a group and version, and an exception.
func TestDabbctlOnDubbo(t *testing.T) {
	srv := zktest.Shared(t)
	bin := buildDabbctl(t, t.TempDir())
	plain := dubbogotest.StartProvider(t, dubbogotest.ProviderConfig{ZooKeeper: srv.Addr()})
	defer stopProvider(t, srv.Addr(), plain)
	blue := dubbogotest.StartProvider(t, dubbogotest.ProviderConfig{ZooKeeper: srv.Addr(), Group: "blue", Version: "2.0.0",
		Services: []string{"greeter"}})
	defer stopProvider(t, srv.Addr(), blue)
	reg := "zookeeper://" + srv.Addr()
	ctl := func(t *testing.T, args ...string) ctlRun {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, append([]string{"-registry", reg}, args...)...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		r := ctlRun{stdout: stdout.String(), stderr: stderr.String()}
		if ee, ok := err.(*exec.ExitError); ok {
			r.code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("dabbctl %q: %v", args, err)
		}
		return r
	}
	ok := func(t *testing.T, args ...string) string {
		t.Helper()
		r := ctl(t, args...)
		if r.code != 0 {
			t.Fatalf("dabbctl %q exited %d: %s", args, r.code, r.stderr)
		}
		return r.stdout
	}
	jsonLines := func(t *testing.T, out string) []map[string]any {
		t.Helper()
		var lines []map[string]any
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatalf("line %q is not a JSON object: %v", l, err)
			}
			lines = append(lines, m)
		}
		return lines
	}

	t.Run("ls", func(t *testing.T) {
		out := ok(t, "ls")
		rows := map[string]bool{}
		for _, l := range strings.Split(out, "\n") {
			rows[strings.Join(strings.Fields(l), " ")] = true
		}
		for _, want := range []string{"INTERFACE GROUP VERSION PROVIDERS", "com.example.Greeter blue 2.0.0 1",
			"com.example.Greeter - - 1", "com.example.inventory.InventoryService - - 1"} {
			if !rows[want] {
				t.Errorf("ls printed\n%s\nwant the row %q", out, want)
			}
		}
		found := map[string]float64{}
		for _, l := range jsonLines(t, ok(t, "-o", "json", "ls")) {
			key, _ := l["interface"].(string)
			if g, _ := l["group"].(string); g != "" {
				key = g + "/" + key + ":" + l["version"].(string)
			}
			found[key], _ = l["providers"].(float64)
		}
		for _, k := range []string{"com.example.Greeter", "blue/com.example.Greeter:2.0.0", "com.example.inventory.InventoryService"} {
			if found[k] != 1 {
				t.Errorf("ls -o json: %s has %v providers; want 1 (all: %v)", k, found[k], found)
			}
		}
	})

	t.Run("ls IFACE", func(t *testing.T) {
		lines := jsonLines(t, ok(t, "-o", "json", "ls", "com.example.Greeter"))
		if len(lines) != 2 {
			t.Fatalf("ls com.example.Greeter listed %d providers; want 2 (both groups)", len(lines))
		}
		addrs := map[string]bool{}
		for _, l := range lines {
			addrs[l["addr"].(string)] = true
			// dubbo-go publishes weight=0, which dabb reads as its least
			// weight, 1.
			if l["weight"] != float64(1) || l["serialization"] != "hessian2" || l["application"] != "dubbogo-peer-provider" ||
				!strings.HasPrefix(l["release"].(string), "dubbo-golang-") {
				t.Errorf("provider %v; want weight 1, serialization hessian2, application dubbogo-peer-provider, release dubbo-golang-*", l)
			}
		}
		if !addrs[plain.Addr()] || !addrs[blue.Addr()] {
			t.Errorf("providers at %v; want %s and %s", addrs, plain.Addr(), blue.Addr())
		}
		out := ok(t, "ls", "blue/com.example.Greeter:2.0.0")
		if !strings.Contains(out, blue.Addr()) || strings.Contains(out, plain.Addr()) {
			t.Errorf("ls of blue/com.example.Greeter:2.0.0 printed\n%s\nwant %s alone", out, blue.Addr())
		}
		if !strings.Contains(out, "ADDRESS") || !strings.Contains(out, "SERIALIZATION") {
			t.Errorf("ls IFACE printed\n%s\nwant a table with ADDRESS ... SERIALIZATION", out)
		}
	})

	t.Run("ls -health", func(t *testing.T) {
		for _, l := range jsonLines(t, ok(t, "-o", "json", "ls", "-health", "com.example.Greeter")) {
			if l["health"] != "serving" {
				t.Errorf("provider %v; want health serving (it answers $echo)", l)
			}
		}
	})

	t.Run("health", func(t *testing.T) {
		lines := jsonLines(t, ok(t, "-o", "json", "health"))
		if len(lines) != 3 {
			t.Errorf("health printed %d lines; want 3 (two Greeter providers, one InventoryService)", len(lines))
		}
		for _, l := range lines {
			if l["status"] != "serving" {
				t.Errorf("health line %v; want serving", l)
			}
		}
		if out := ok(t, "health", "-addr", blue.Addr(), "blue/com.example.Greeter:2.0.0"); !strings.Contains(out, "serving") {
			t.Errorf("health -addr %s printed %q; want serving", blue.Addr(), out)
		}
	})

	t.Run("watch", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, "-registry", reg, "-o", "json", "watch", "com.example.Greeter")
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(stdout)
		listed := 0
		for listed < 2 && sc.Scan() {
			var ev struct{ Event string }
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil || ev.Event != "listed" {
				t.Fatalf("watch printed %q; want listed events", sc.Text())
			}
			listed++
		}
		if listed != 2 {
			t.Fatalf("watch listed %d providers before its output ended; want 2", listed)
		}
		if err := cmd.Process.Signal(os.Interrupt); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Errorf("watch after an interrupt: %v; want exit 0", err)
		}
	})

	t.Run("call", func(t *testing.T) {
		if out := ok(t, "call", "com.example.Greeter.sayHello", `["world"]`); out != "\"hello world\"\n" {
			t.Errorf("call sayHello printed %q; want \"hello world\" as a JSON string", out)
		}
		var reply map[string]any
		out := ok(t, "-o", "json", "call", "com.example.Greeter.greet", `{"class":"com.example.HelloRequest","name":"pojo"}`)
		if err := json.Unmarshal([]byte(out), &reply); err != nil || strings.Count(out, "\n") != 1 {
			t.Fatalf("call greet -o json printed %q; want one JSON object on a line", out)
		}
		if reply["class"] != "com.example.HelloReply" || reply["message"] != "hello pojo" || reply["length"] != float64(10) {
			t.Errorf("call greet printed %v; want a com.example.HelloReply, message hello pojo, length 10", reply)
		}
		var stock int64
		if err := json.Unmarshal([]byte(ok(t, "call", "com.example.inventory.InventoryService.stock", "[10086]")), &stock); err != nil || stock <= 0 {
			t.Errorf("call stock printed no positive number: %v", err)
		}
		if out := ok(t, "call", "-types", "long,int", "com.example.inventory.InventoryService.deduct", "[10086, 1]"); out != "true\n" {
			t.Errorf("call -types long,int deduct printed %q; want true", out)
		}
		if out := ok(t, "call", "-group", "blue", "-version", "2.0.0", "-timeout", "5s", "com.example.Greeter.sayHello", `"blue"`); out != "\"hello blue\"\n" {
			t.Errorf("call -group blue -version 2.0.0 sayHello printed %q; want \"hello blue\"", out)
		}
		r := ctl(t, "call", "com.example.Greeter.fail", `["boom"]`)
		if r.code != 1 || r.stderr != "java.lang.RuntimeException: boom\n" || r.stdout != "" {
			t.Errorf("call fail exited %d, stdout %q, stderr %q; want 1 and \"java.lang.RuntimeException: boom\" on stderr", r.code, r.stdout, r.stderr)
		}
		r = ctl(t, "call", "-types", "long", "com.example.Greeter.sayHello", `["a", "b"]`)
		if r.code != 2 || !strings.Contains(r.stderr, "-types names 1 types for 2 arguments") {
			t.Errorf("call with -types of the wrong length exited %d: %q; want 2 and why", r.code, r.stderr)
		}
	})
}
