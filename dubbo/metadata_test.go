package dubbo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/wait"
	"github.com/dabbrpc/dabb/internal/zktest"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
	gozk "github.com/go-zookeeper/zk"
)

// syncBuffer is a log destination tests read while the registry writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// loggedRegistry returns a Registry on servers whose debug log goes to
// the returned buffer, closed when the test ends.
func loggedRegistry(t *testing.T, servers ...string) (*Registry, *syncBuffer) {
	t.Helper()
	var buf syncBuffer
	r, err := NewRegistry(RegistryConfig{Servers: servers,
		Logger: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r, &buf
}

// writeDefinition writes data as application app's service definition of
// key, as Java's ZookeeperMetadataReport does, removed when the test
// ends.
func writeDefinition(t *testing.T, conn *gozk.Conn, key serviceKey, app, data string) {
	t.Helper()
	node := (&Registry{cfg: RegistryConfig{Root: DefaultRoot}}).definitionPath(key) + "/" + app
	if err := createOrSet(conn, node, []byte(data)); err != nil {
		t.Fatalf("write %s: %v", node, err)
	}
	t.Cleanup(func() { _ = conn.Delete(node, -1) })
}

// TestDefinitionPath: the node is Java's MetadataIdentifier path, an
// empty version or group without its segment.
func TestDefinitionPath(t *testing.T) {
	r := &Registry{cfg: RegistryConfig{Root: DefaultRoot}}
	for _, tt := range []struct {
		key  serviceKey
		want string
	}{
		{serviceKey{iface: "com.example.Greeter"}, "/dubbo/metadata/com.example.Greeter/provider"},
		{serviceKey{iface: "com.example.Greeter", version: "1.0.0"}, "/dubbo/metadata/com.example.Greeter/1.0.0/provider"},
		{serviceKey{iface: "com.example.Greeter", group: "blue"}, "/dubbo/metadata/com.example.Greeter/blue/provider"},
		{serviceKey{iface: "com.example.Greeter", version: "2", group: "blue"}, "/dubbo/metadata/com.example.Greeter/2/blue/provider"},
	} {
		if got := r.definitionPath(tt.key); got != tt.want {
			t.Errorf("definitionPath(%+v) = %s; want %s", tt.key, got, tt.want)
		}
	}
	if got := (&Registry{cfg: RegistryConfig{Root: "/other"}}).definitionPath(serviceKey{iface: "a.B"}); got != "/other/metadata/a.B/provider" {
		t.Errorf("under root /other: %s; want /other/metadata/a.B/provider", got)
	}
}

// TestMethodTypes: the one method of that name and count gives its types,
// generics erased; none gives nil; overloads of other types are an error
// naming them.
func TestMethodTypes(t *testing.T) {
	defs := []*ServiceDefinition{{Methods: []MethodDefinition{
		{Name: "deduct", ParameterTypes: []string{"long", "int"}},
		{Name: "put", ParameterTypes: []string{"java.util.Map<java.lang.String, java.util.List<java.lang.Long>>", "java.util.List<java.lang.String>[]"}},
		{Name: "stock", ParameterTypes: []string{"long"}},
		{Name: "stock", ParameterTypes: []string{"int"}},
		{Name: "stock", ParameterTypes: []string{}},
	}}, {Methods: []MethodDefinition{
		// A second application publishing the same method is no overload.
		{Name: "deduct", ParameterTypes: []string{"long", "int"}},
	}}}
	for _, tt := range []struct {
		method string
		n      int
		want   []string
	}{
		{"deduct", 2, []string{"long", "int"}},
		{"put", 2, []string{"java.util.Map", "java.util.List[]"}},
		{"stock", 0, []string{}},
		{"deduct", 1, nil},
		{"absent", 1, nil},
	} {
		got, err := methodTypes(defs, tt.method, tt.n)
		if err != nil || !slices.Equal(got, tt.want) || (got == nil) != (tt.want == nil) {
			t.Errorf("methodTypes(%s, %d) = %q, %v; want %q", tt.method, tt.n, got, err, tt.want)
		}
	}
	_, err := methodTypes(defs, "stock", 1)
	if !errors.Is(err, ErrOverloaded) || !strings.Contains(err.Error(), "stock(int), stock(long)") {
		t.Errorf("methodTypes(stock, 1) = %v; want ErrOverloaded naming stock(int), stock(long)", err)
	}
}

// TestParseSignatures: MetaSignatures reads back as written; a malformed
// one is refused.
func TestParseSignatures(t *testing.T) {
	got, err := parseSignatures("reset()void;deduct(long,int)boolean")
	if err != nil {
		t.Fatal(err)
	}
	want := []MethodDefinition{
		{Name: "reset", ParameterTypes: []string{}, ReturnType: "void"},
		{Name: "deduct", ParameterTypes: []string{"long", "int"}, ReturnType: "boolean"},
	}
	if g, w := mustJSON(t, got), mustJSON(t, want); g != w {
		t.Errorf("parseSignatures = %s; want %s", g, w)
	}
	for _, bad := range []string{"reset", "(long)void", "reset()", "reset)(void"} {
		if _, err := parseSignatures(bad); !errors.Is(err, registry.ErrInvalid) {
			t.Errorf("parseSignatures(%q) = %v; want ErrInvalid", bad, err)
		}
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestDefinedTypesFromZooKeeper: the types come from a node Java would
// write; a missing or unreadable definition gives none and a debug line;
// a read is reused within definitionTTL.
func TestDefinedTypesFromZooKeeper(t *testing.T) {
	zs := zktest.Shared(t)
	conn := rawConn(t, zs.Addr())
	r, logs := loggedRegistry(t, zs.Addr())
	ctx := context.Background()

	key := serviceKey{iface: ifaceFor(t), version: "1.0.0"}
	writeDefinition(t, conn, key, "java-app", `{"parameters":{"side":"provider"},"canonicalName":"`+key.iface+`",`+
		`"codeSource":"file:/app/api.jar","methods":[{"name":"deduct","parameterTypes":["long","java.lang.Integer"],`+
		`"returnType":"boolean","annotations":[]}],"types":[{"type":"long"},{"type":"java.lang.Integer"}],"annotations":[]}`)
	got, err := r.definedTypes(ctx, key, "deduct", 2)
	if err != nil || !slices.Equal(got, []string{"long", "java.lang.Integer"}) {
		t.Fatalf("definedTypes(deduct) = %q, %v; want [long java.lang.Integer]", got, err)
	}
	defs, err := r.ServiceDefinitions(ctx, key.iface+":1.0.0")
	if err != nil || len(defs) != 1 || defs[0].CanonicalName != key.iface || defs[0].Parameters["side"] != "provider" {
		t.Errorf("ServiceDefinitions = %+v, %v; want the one definition written", defs, err)
	}
	// The node goes; the definition read is reused until definitionTTL.
	if err := conn.Delete(r.definitionPath(key)+"/java-app", -1); err != nil {
		t.Fatal(err)
	}
	if got, _ := r.definedTypes(ctx, key, "deduct", 2); len(got) != 2 {
		t.Errorf("definedTypes right after the node went = %q; want the cached [long java.lang.Integer]", got)
	}

	// Another version has no definition: none, said at debug level.
	other := serviceKey{iface: key.iface, version: "2.0.0"}
	if got, err := r.definedTypes(ctx, other, "deduct", 2); got != nil || err != nil {
		t.Errorf("definedTypes without a definition = %q, %v; want none", got, err)
	}
	if !strings.Contains(logs.String(), "no service definition of the method") {
		t.Errorf("log %q; want a debug line saying the types are inferred", logs.String())
	}

	// A node that is no JSON: none, and the reason logged.
	bad := serviceKey{iface: key.iface, group: "bad"}
	writeDefinition(t, conn, bad, "java-app", "not json")
	if got, err := r.definedTypes(ctx, bad, "deduct", 2); got != nil || err != nil {
		t.Errorf("definedTypes of an unreadable definition = %q, %v; want none", got, err)
	}
	if !strings.Contains(logs.String(), "could not be read") || !strings.Contains(logs.String(), "is no service definition") {
		t.Errorf("log %q; want a debug line saying why the definition could not be read", logs.String())
	}
}

// TestDefinedTypesUnreachable: with ZooKeeper unreachable a lookup gives
// up within definitionWait and gives no types.
func TestDefinedTypesUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	r, logs := loggedRegistry(t, addr)
	start := time.Now()
	got, err := r.definedTypes(context.Background(), serviceKey{iface: "com.example.Down"}, "m", 1)
	if took := time.Since(start); got != nil || err != nil || took > definitionWait+2*time.Second {
		t.Errorf("definedTypes with ZooKeeper down = %q, %v after %v; want none within %v", got, err, took, definitionWait)
	}
	if !strings.Contains(logs.String(), "could not be read") {
		t.Errorf("log %q; want a debug line saying the definition could not be read", logs.String())
	}
}

// TestServiceDefinitionPublished: a Server with a zookeeper:// registry
// publishes its Service's definition where Java's metadata report puts
// it, in Java's JSON; a generic call without types reads the types there
// and resolves a method inference would miss; an overload is an error
// naming both; the node outlives the export, as Java's does.
func TestServiceDefinitionPublished(t *testing.T) {
	zs := zktest.Shared(t)
	reg := newTestRegistry(t, "zookeeper://"+zs.Addr())
	conn := rawConn(t, zs.Addr())
	iface := ifaceFor(t)
	st := newStore()
	desc, err := Service(iface, st, WithMethod("StockInt", "stock"), WithVersion("1.0"), WithApplication("shop"))
	if err != nil {
		t.Fatal(err)
	}
	s, _ := serveOnRegistry(t, reg, desc, st)
	// Register writes the definition once the provider node is in place.
	node := "/dubbo/metadata/" + iface + "/1.0/provider/shop"
	wait.Until(t, 10*time.Second, 20*time.Millisecond, node+" to be written", func() bool {
		ok, _, err := conn.Exists(node)
		return ok && err == nil
	})
	data, _, err := conn.Get(node)
	if err != nil {
		t.Fatalf("get %s: %v", node, err)
	}
	var def struct {
		CanonicalName string `json:"canonicalName"`
		Methods       []struct {
			Name           string   `json:"name"`
			ParameterTypes []string `json:"parameterTypes"`
			ReturnType     string   `json:"returnType"`
		} `json:"methods"`
		Types      []struct{ Type string } `json:"types"`
		Parameters map[string]string       `json:"parameters"`
	}
	if err := json.Unmarshal(data, &def); err != nil {
		t.Fatalf("%s holds %q: %v", node, data, err)
	}
	var sigs []string
	for _, m := range def.Methods {
		sigs = append(sigs, m.Name+"("+strings.Join(m.ParameterTypes, ",")+")"+m.ReturnType)
	}
	for _, want := range []string{"deduct(long,int)boolean", "stock(long)long", "stock(int)long", "reset()void"} {
		if !slices.Contains(sigs, want) {
			t.Errorf("methods %q; want %s among them", sigs, want)
		}
	}
	if def.CanonicalName != iface || def.Parameters["side"] != "provider" || def.Parameters["version"] != "1.0" ||
		def.Parameters["interface"] != iface || len(def.Types) == 0 {
		t.Errorf("definition %s; want canonicalName %s, the provider URL's parameters and the types", data, iface)
	}

	creg := newTestRegistry(t, "zookeeper://"+zs.Addr())
	c, err := proxy.NewClient(creg, proxy.WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	service := iface + ":1.0"
	// Inferred, deduct(10086, 2) would be deduct(long, long): no such method.
	if _, err := Invoke(ctx, c, service, "deduct", []string{"long", "long"}, []any{10086, 2}); !errors.Is(err, ErrNoSuchMethod) {
		t.Fatalf("deduct(long, long) = %v; want ErrNoSuchMethod", err)
	}
	if got, err := Invoke(ctx, c, service, "deduct", nil, []any{10086, 2}); err != nil || got != true {
		t.Errorf("deduct(10086, 2) without types = %#v, %v; want true, with the defined types long, int", got, err)
	}
	_, err = Invoke(ctx, c, service, "stock", nil, []any{10086})
	if !errors.Is(err, ErrOverloaded) || !errors.Is(err, proxy.ErrNotSent) || !strings.Contains(err.Error(), "stock(int), stock(long)") {
		t.Errorf("stock(10086) without types = %v; want ErrOverloaded naming stock(int), stock(long)", err)
	}

	s.Close()
	waitChildren(t, conn, "/dubbo/"+iface+"/providers", 0, 10*time.Second, "after Close")
	if ok, _, err := conn.Exists(node); err != nil || !ok {
		t.Errorf("after Close, %s exists = %v, %v; want it kept, as Java keeps it", node, ok, err)
	}
	_ = conn.Delete(node, -1)
}
