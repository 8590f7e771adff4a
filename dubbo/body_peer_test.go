package dubbo

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
)

// frame wraps a body in a Dubbo header with serialization id 2: a two-way
// request, or a response of status.
func frame(request bool, status byte, id uint64, body []byte) []byte {
	h := make([]byte, 16, 16+len(body))
	h[0], h[1] = 0xda, 0xbb
	h[2] = 2
	if request {
		h[2] |= 0x80 | 0x40
	} else {
		h[3] = status
	}
	binary.BigEndian.PutUint64(h[4:], id)
	binary.BigEndian.PutUint32(h[12:], uint32(len(body)))
	return append(h, body...)
}

var (
	dubbogoOnce sync.Once
	dubbogoDir  string
	dubbogoBin  string
	dubbogoErr  error
)

// TestMain removes what the peers' builds left in temporary directories.
// clientRequest returns the body of a request as a proxy.Client sends
// it to a Dubbo provider: the format writes it from the message, with a
// budget of 1500 ms and the interface as Invoke and Client.Call set it.
func clientRequest(t *testing.T, method string, payload []byte, att map[string]string) []byte {
	t.Helper()
	m := &protocol.Message{Service: inventory, Method: method, Timeout: 1500 * time.Millisecond, Payload: payload,
		Attachments: map[string]string{AttachInterface: inventory}}
	maps.Copy(m.Attachments, att)
	m.Header.Init(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, Hessian2ID), 0, 1)
	return Format{}.AppendBody(&m.Header, nil, m)
}

// invokeArgsBytes is the payload Invoke sends.
func invokeArgsBytes(method string, types []string, args []any) ([]byte, error) {
	a, _, err := invokeArgs(method, types, args)
	if err != nil {
		return nil, err
	}
	return Codec{}.Marshal(nil, a)
}

// removePeerBuilds removes the peer programs built by this test binary.
func removePeerBuilds() {
	for _, dir := range []string{dubbogoDir, javaDir} {
		if dir != "" {
			_ = os.RemoveAll(dir)
		}
	}
}

// dubbogoGolden builds testdata/dubbogo's golden program (dubbo-go v3.3.1,
// a module of its own) once per test binary.
func dubbogoGolden(t *testing.T) string {
	t.Helper()
	dubbogoOnce.Do(func() {
		dir, err := os.MkdirTemp("", "dabb-dubbogo-golden")
		if err != nil {
			dubbogoErr = err
			return
		}
		dubbogoDir = dir
		dubbogoBin = filepath.Join(dir, "golden")
		cmd := exec.Command("go", "build", "-o", dubbogoBin, "./golden")
		cmd.Dir = filepath.Join("testdata", "dubbogo")
		cmd.Env = append(os.Environ(), "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			dubbogoErr = errors.New("building testdata/dubbogo/golden: " + err.Error() + "\n" + string(out))
		}
	})
	if dubbogoErr != nil {
		t.Fatal(dubbogoErr)
	}
	return dubbogoBin
}

// mustOf returns a function that passes on an Append's body and fails t
// on its error.
func mustOf(t *testing.T) func([]byte, error) []byte {
	return func(b []byte, err error) []byte {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
}

func TestDubbogoDecodesDabb(t *testing.T) {
	bin := dubbogoGolden(t)
	dir := t.TempDir()
	must := mustOf(t)
	att := func() map[string]any { return map[string]any{"timeout": "1500", "group": "g"} }
	frames := []struct {
		name string
		b    []byte
		want string
	}{
		{"request_deduct", frame(true, 0, 1, must(AppendRequest(nil, &Request{
			Path: inventory, Method: "deduct", Args: []any{int64(10086), int32(3)}, Attachments: att(),
		}))), "request path=" + inventory + " version= method=deduct types=JI args=[int64(10086) int32(3)] attachments=map[dubbo:2.0.2 group:g timeout:1500]"},
		{"request_deduct_once", frame(true, 0, 2, must(AppendRequest(nil, &Request{
			Path: inventory, Version: "1.0.0", Method: "deductOnce",
			Args: []any{&DeductRequest{Sku: "10086", Count: 2, RequestId: "r-9"}}, Attachments: att(),
		}))), "request path=" + inventory + " version=1.0.0 method=deductOnce types=Lcom/example/inventory/DeductRequest; args=[*main.DeductRequest(&{Sku:10086 Count:2 RequestId:r-9})] attachments=map[dubbo:2.0.2 group:g timeout:1500]"},
		{"request_invoke", frame(true, 0, 3, must(AppendRequest(nil, &Request{
			Path: inventory, Method: "$invoke", ParamTypes: "Ljava/lang/String;[Ljava/lang/String;[Ljava/lang/Object;",
			Args: []any{"stock", []string{"long"}, []any{int64(10086)}},
		}))), "request path=" + inventory + " version= method=$invoke types=Ljava/lang/String;[Ljava/lang/String;[Ljava/lang/Object; args=[string(stock) []string([long]) [int64(10086)]] attachments=map[dubbo:2.0.2]"},
		// The requests a client writes: Invoke's and Client.Call's, through
		// the format, as the proxy sends them.
		{"request_client_invoke", frame(true, 0, 4, clientRequest(t, "$invoke", must(invokeArgsBytes("stock", nil, []any{10086})),
			map[string]string{AttachGeneric: "true", AttachVersion: "1.0.0", AttachGroup: "g"})),
			"request path=" + inventory + " version=1.0.0 method=$invoke types=Ljava/lang/String;[Ljava/lang/String;[Ljava/lang/Object; args=[string(stock) []string([long]) []hessian.Object([10086])] attachments=map[dubbo:2.0.2 generic:true group:g interface:" + inventory + " path:" + inventory + " timeout:1500 version:1.0.0]"},
		{"request_client_typed", frame(true, 0, 5, clientRequest(t, "deduct", must(Codec{}.Marshal(nil, &Args{Types: "JI", Values: []any{int64(10086), int32(3)}})), nil)),
			"request path=" + inventory + " version= method=deduct types=JI args=[int64(10086) int32(3)] attachments=map[dubbo:2.0.2 interface:" + inventory + " path:" + inventory + " timeout:1500]"},
		{"response_value", frame(false, 20, 1, must(AppendResponse(nil, &Response{
			Value: true, Attachments: map[string]any{"dubbo": DubboVersion},
		}))), "response value=bool(true) attachments=map[dubbo:2.0.2]"},
		{"response_pojo", frame(false, 20, 2, must(AppendResponse(nil, &Response{
			Value: &DeductReply{Remaining: 999998, Duplicate: true}, Attachments: map[string]any{},
		}))), "response value=*main.DeductReply(&{Remaining:999998 Duplicate:true}) attachments=map[]"},
		{"response_plain", frame(false, 20, 3, must(AppendResponse(nil, &Response{
			Value: int64(7),
		}))), "response value=int64(7) attachments=map[]"},
		{"response_null", frame(false, 20, 4, must(AppendResponse(nil, &Response{
			Attachments: map[string]any{},
		}))), "response value=nil attachments=map[]"},
		{"response_exception", frame(false, 20, 5, must(AppendResponse(nil, &Response{
			Exception: &Exception{Class: IllegalArgumentException, Message: "unknown sku 42"}, Attachments: map[string]any{},
		}))), "response exception=java.lang.IllegalArgumentException message=unknown sku 42 attachments=map[]"},
		{"response_generic_exception", frame(false, 20, 6, must(AppendResponse(nil, &Response{
			Exception: NewGenericException(RuntimeException, "boom"), Attachments: map[string]any{},
			// dubbo-go's hessian2 decodes a Throwable class it has not
			// registered into a type that loses the class name.
		}))), "response exception= message=java.lang.RuntimeException: boom attachments=map[]"},
		{"response_error_status", frame(false, 70, 7, AppendErrorMessage(nil, "No such method stock2")),
			"response status=70 message=No such method stock2"},
	}
	args := []string{"decode"}
	var want []string
	for _, f := range frames {
		file := filepath.Join(dir, f.name+".bin")
		if err := os.WriteFile(file, f.b, 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, file)
		want = append(want, f.name+".bin: "+f.want)
	}
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("dubbo-go's decoder: %v\n%s", err, out)
	}
	got := strings.Split(strings.TrimSpace(string(out)), "\n")
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("dubbo-go decoded\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

var (
	javaOnce sync.Once
	javaDir  string
	javaErr  error
	// javaSkip is why the Java test cannot run here, when it cannot.
	javaSkip string
)

const hessianJar = "/usr/share/java/hessian.jar"

// javaPeer compiles testdata/java's Peer once per test binary; it skips
// the test when java, javac or Caucho Hessian (Debian's libhessian-java)
// are missing, unless CI=true.
func javaPeer(t *testing.T) (classpath string) {
	t.Helper()
	javaOnce.Do(func() {
		for _, tool := range []string{"java", "javac"} {
			if _, err := exec.LookPath(tool); err != nil {
				javaSkip = tool + " is not installed (apt-get install default-jdk-headless)"
				return
			}
		}
		if _, err := os.Stat(hessianJar); err != nil {
			javaSkip = hessianJar + " is missing (apt-get install libhessian-java)"
			return
		}
		dir, err := os.MkdirTemp("", "dabb-java-peer")
		if err != nil {
			javaErr = err
			return
		}
		javaDir = dir
		src := filepath.Join("testdata", "java")
		var files []string
		_ = filepath.Walk(src, func(p string, info os.FileInfo, err error) error {
			if err == nil && strings.HasSuffix(p, ".java") {
				files = append(files, p)
			}
			return err
		})
		cmd := exec.Command("javac", append([]string{"-d", dir, "-cp", hessianJar}, files...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			javaErr = errors.New("javac: " + err.Error() + "\n" + string(out))
		}
	})
	if javaSkip != "" {
		if os.Getenv("CI") == "true" {
			t.Fatal(javaSkip)
		}
		t.Skip(javaSkip)
	}
	if javaErr != nil {
		t.Fatal(javaErr)
	}
	return javaDir + string(os.PathListSeparator) + hessianJar
}

// java runs Peer; JDK 17 lets Hessian set Throwable's fields only with
// java.lang opened.
func java(t *testing.T, classpath string, args ...string) string {
	t.Helper()
	cmd := exec.Command("java", append([]string{"--add-opens", "java.base/java.lang=ALL-UNNAMED", "-cp", classpath, "Peer"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("java Peer %v: %v\n%s%s", args, err, out, stderr.Bytes())
	}
	return strings.TrimSpace(string(out))
}

func TestJavaDecodesDabb(t *testing.T) {
	cp := javaPeer(t)
	dir := t.TempDir()
	must := mustOf(t)
	cases := []struct {
		mode, name string
		body       []byte
		want       string
	}{
		{"request", "deduct", must(AppendRequest(nil, &Request{
			Path: inventory, Method: "deduct", Args: []any{int64(10086), int32(3)},
			Attachments: map[string]any{"timeout": "1500", "path": inventory},
		})), "request dubbo=2.0.2 path=" + inventory + " version= method=deduct types=JI\n" +
			"arg java.lang.Long 10086\narg java.lang.Integer 3\n" +
			"attachments {path=" + inventory + ", timeout=1500}"},
		{"request", "deduct_once", must(AppendRequest(nil, &Request{
			Path: inventory, Version: "1.0.0", Method: "deductOnce",
			Args: []any{&DeductRequest{Sku: "10086", Count: 2, RequestId: "r-1"}},
		})), "request dubbo=2.0.2 path=" + inventory + " version=1.0.0 method=deductOnce types=Lcom/example/inventory/DeductRequest;\n" +
			"arg com.example.inventory.DeductRequest DeductRequest{sku=10086,count=2,requestId=r-1}\n" +
			"attachments {}"},
		{"response", "pojo", must(AppendResponse(nil, &Response{
			Value: &DeductReply{Remaining: 999998, Duplicate: true}, Attachments: map[string]any{"dubbo": DubboVersion},
		})), "response flag=4\nvalue com.example.inventory.DeductReply DeductReply{remaining=999998,duplicate=true}\n" +
			"attachments {dubbo=2.0.2}"},
		{"response", "bool", must(AppendResponse(nil, &Response{Value: false})),
			"response flag=1\nvalue java.lang.Boolean false"},
		{"response", "null", must(AppendResponse(nil, &Response{Attachments: map[string]any{}})),
			"response flag=5\nattachments {}"},
		{"response", "exception", must(AppendResponse(nil, &Response{
			Exception: &Exception{Class: IllegalArgumentException, Message: "count must be positive: 0"}, Attachments: map[string]any{},
		})), "response flag=3\nexception java.lang.IllegalArgumentException count must be positive: 0\nattachments {}"},
		{"response", "runtime_exception", must(AppendResponse(nil, &Response{
			Exception: &Exception{Class: RuntimeException, Message: "unknown sku 7"},
		})), "response flag=0\nexception java.lang.RuntimeException unknown sku 7"},
		{"response", "generic_exception", must(AppendResponse(nil, &Response{
			Exception: NewGenericException(IllegalArgumentException, "count 0"), Attachments: map[string]any{},
		})), "response flag=3\nexception " + GenericException + " java.lang.IllegalArgumentException: count 0\n" +
			"wrapped java.lang.IllegalArgumentException count 0\nattachments {}"},
		{"error", "status", AppendErrorMessage(nil, "Not found exported service"), "error Not found exported service"},
	}
	// One JVM reads every body; its output has a section per file.
	var args, want []string
	for _, c := range cases {
		file := filepath.Join(dir, c.mode+"_"+c.name+".bin")
		if err := os.WriteFile(file, c.body, 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, c.mode, file)
		want = append(want, "== "+filepath.Base(file)+"\n"+c.want)
	}
	got := strings.Split(java(t, cp, args...), "\n== ")
	for i := range got {
		if i > 0 {
			got[i] = "== " + got[i]
		}
	}
	if len(got) != len(want) {
		t.Fatalf("Java printed %d sections for %d bodies:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("Java read\n%s\nwant\n%s", got[i], want[i])
		}
	}
}

func TestDabbDecodesJava(t *testing.T) {
	cp := javaPeer(t)
	dir := t.TempDir()
	java(t, cp, "write", dir)
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(dir, name+".bin"))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	javaAtt := map[string]any{"timeout": "1500", "interface": inventory, "path": inventory}
	requests := map[string]*Request{
		"request_deduct_once": {DubboVersion: "2.0.2", Path: inventory, Version: "1.0.0", Method: "deductOnce",
			ParamTypes: "Lcom/example/inventory/DeductRequest;",
			Args:       []any{&DeductRequest{Sku: "10086", Count: 5, RequestId: "java-1"}}, Attachments: javaAtt},
		"request_deduct": {DubboVersion: "2.0.2", Path: inventory, Method: "deduct", ParamTypes: "JI",
			Args: []any{int64(10086), int32(4)}, Attachments: javaAtt},
	}
	for name, want := range requests {
		got, err := DecodeRequest(read(name), Limits{})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: decoded\n%#v\nwant\n%#v", name, got, want)
		}
	}
	ratt := map[string]any{"dubbo": "2.0.2"}
	responses := map[string]*Response{
		"response_pojo": {Value: &DeductReply{Remaining: 999995}, Attachments: ratt},
		"response_exception": {Exception: &Exception{Class: IllegalArgumentException, Message: "count must be positive: 0"},
			Attachments: ratt},
		"response_generic_exception": {Exception: &Exception{Class: GenericException,
			Message:      "java.lang.RuntimeException: unknown sku 7",
			WrappedClass: RuntimeException, WrappedMessage: "unknown sku 7"}, Attachments: ratt},
		"response_null": {},
	}
	for name, want := range responses {
		got, err := DecodeResponse(read(name), Limits{})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: decoded\n%#v %+v\nwant\n%#v %+v", name, got, got.Exception, want, want.Exception)
		}
	}
}

// captureProvider is a Dubbo provider on a loopback port that answers
// every two-way request with reply, a hessian2 response body, and hands
// on each request it reads: what a client writes, as the provider gets it.
type captureProvider struct {
	addr     string
	requests chan capturedRequest
	done     chan struct{} // closed when the test ends
}

type capturedRequest struct {
	flags protocol.Flags
	body  []byte
}

func startCapture(t *testing.T, reply []byte) *captureProvider {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &captureProvider{addr: l.Addr().String(), requests: make(chan capturedRequest, 16), done: make(chan struct{})}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
			wg.Go(func() { p.serve(conn, reply) })
		}
	})
	t.Cleanup(func() {
		close(p.done)
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return p
}

// serve reads frames until the connection ends. An event (a heartbeat)
// that wants an answer gets a null one.
func (p *captureProvider) serve(conn net.Conn, reply []byte) {
	for {
		var h protocol.Header
		if _, err := io.ReadFull(conn, h[:]); err != nil {
			return
		}
		body := make([]byte, h.BodyLen())
		if _, err := io.ReadFull(conn, body); err != nil {
			return
		}
		f := h.Flags()
		if !f.IsRequest() || !f.IsTwoWay() {
			continue
		}
		out := reply
		if f.IsEvent() {
			out = []byte{'N'}
		} else {
			select {
			case p.requests <- capturedRequest{f, body}:
			case <-p.done:
				return
			}
		}
		var rh protocol.Header
		rh.Init(protocol.MakeFlags(f&protocol.FlagEvent, Hessian2ID), protocol.StatusOK, h.ID())
		rh.SetMagic()
		rh.SetBodyLen(uint32(len(out)))
		if _, err := conn.Write(append(rh[:], out...)); err != nil {
			return
		}
	}
}

// next returns the next request the provider read.
func (p *captureProvider) next(t *testing.T) capturedRequest {
	t.Helper()
	select {
	case r := <-p.requests:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("the provider got no request within 10s")
		return capturedRequest{}
	}
}

// inventoryDecl declares two methods of the demo's InventoryService.
type inventoryDecl interface {
	Deduct(ctx context.Context, sku int64, count int32) (bool, error)
	DeductOnce(ctx context.Context, req *DeductRequest) (bool, error)
}

// TestJavaDecodesClientRequests: the requests a dabb client writes, typed
// (Client.Call) and generic (Invoke), captured as a provider reads them
// off the connection, are read by Java (Caucho Hessian) field by field as
// Dubbo's DecodeableRpcInvocation reads them: the dubbo version, path,
// version, method name and descriptor, each argument by the descriptor's
// class (String[] and Object[] for $invoke), and the attachments, with
// path, interface, version, group and the budget left as timeout.
func TestJavaDecodesClientRequests(t *testing.T) {
	cp := javaPeer(t)
	reply, err := AppendResponse(nil, &Response{Value: true, Attachments: map[string]any{}})
	if err != nil {
		t.Fatal(err)
	}
	p := startCapture(t, reply)
	const key = inventory + ":1.0.0:g1"
	reg := static.New(
		registry.Instance{Service: key, ID: "p", Addr: p.addr},
		registry.Instance{Service: inventory, ID: "p", Addr: p.addr})
	defer reg.Close()
	c, err := proxy.NewClient(reg, proxy.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	typed, err := NewClient(c, inventory, (*inventoryDecl)(nil), WithVersion("1.0.0"), WithGroup("g1"), WithIdempotent("Deduct"))
	if err != nil {
		t.Fatal(err)
	}
	bare, err := NewClient(c, inventory, (*inventoryDecl)(nil))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	budget := proxy.Timeout(1500 * time.Millisecond)
	const (
		head  = "request dubbo=2.0.2 path=" + inventory + " version=1.0.0 method="
		keyed = "group=g1, interface=" + inventory + ", path=" + inventory + ", timeout=T, version=1.0.0"
		// A call not marked idempotent carries the key the client made
		// for it, for a dabb server to drop a duplicate.
		once    = "group=g1, idempotency-key=K, interface=" + inventory + ", path=" + inventory + ", timeout=T"
		generic = "generic=true, " + once + ", version=1.0.0"
		pojo    = "com.example.inventory.DeductRequest DeductRequest{sku=10086,count=2,requestId=r-1}"
		invoke  = "$invoke types=Ljava/lang/String;[Ljava/lang/String;[Ljava/lang/Object;\narg java.lang.String "
	)
	cases := []struct {
		name string
		call func() error
		want string
	}{
		{"typed_primitives", func() error {
			return typed.Call(ctx, "Deduct", []any{10086, 3}, nil, budget)
		}, head + "deduct types=JI\narg java.lang.Long 10086\narg java.lang.Integer 3\nattachments {" + keyed + "}"},
		{"typed_pojo", func() error {
			return typed.Call(ctx, "DeductOnce", []any{&DeductRequest{Sku: "10086", Count: 2, RequestId: "r-1"}}, nil, budget,
				proxy.Attachment("trace-id", "t-1"))
		}, head + "deductOnce types=Lcom/example/inventory/DeductRequest;\narg " + pojo +
			"\nattachments {" + once + ", trace-id=t-1, version=1.0.0}"},
		{"typed_no_key", func() error {
			return bare.Call(ctx, "Deduct", []any{7, 1}, nil, budget)
		}, "request dubbo=2.0.2 path=" + inventory + " version= method=deduct types=JI\narg java.lang.Long 7\narg java.lang.Integer 1\n" +
			"attachments {idempotency-key=K, interface=" + inventory + ", path=" + inventory + ", timeout=T}"},
		{"invoke_primitives", func() error {
			_, err := Invoke(ctx, c, "g1/"+inventory+":1.0.0", "deduct", []string{"long", "int"}, []any{10086, 3}, budget)
			return err
		}, head + invoke + "deduct\narg java.lang.String[] [java.lang.String long, java.lang.String int]\n" +
			"arg java.lang.Object[] [java.lang.Long 10086, java.lang.Integer 3]\nattachments {" + generic + "}\n" +
			"realized java.lang.Long 10086\nrealized java.lang.Integer 3"},
		{"invoke_pojo_map", func() error {
			_, err := Invoke(ctx, c, "g1/"+inventory+":1.0.0", "deductOnce", nil,
				[]any{map[string]any{"class": "com.example.inventory.DeductRequest", "sku": "10086", "count": 2, "requestId": "r-1"}}, budget)
			return err
		}, head + invoke + "deductOnce\narg java.lang.String[] [java.lang.String com.example.inventory.DeductRequest]\n" +
			"arg java.lang.Object[] [java.util.HashMap {class=java.lang.String com.example.inventory.DeductRequest, count=java.lang.Long 2, requestId=java.lang.String r-1, sku=java.lang.String 10086}]\n" +
			"attachments {" + generic + "}\nrealized " + pojo},
		{"invoke_pojo_struct", func() error {
			_, err := Invoke(ctx, c, "g1/"+inventory+":1.0.0", "deductOnce", []string{"com.example.inventory.DeductRequest"},
				[]any{&DeductRequest{Sku: "10086", Count: 2, RequestId: "r-1"}}, budget)
			return err
		}, head + invoke + "deductOnce\narg java.lang.String[] [java.lang.String com.example.inventory.DeductRequest]\n" +
			"arg java.lang.Object[] [java.util.HashMap {class=java.lang.String com.example.inventory.DeductRequest, count=java.lang.Integer 2, requestId=java.lang.String r-1, sku=java.lang.String 10086}]\n" +
			"attachments {" + generic + "}\nrealized " + pojo},
	}
	dir := t.TempDir()
	var args, want []string
	for _, tc := range cases {
		if err := tc.call(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		r := p.next(t)
		if r.flags.Serialization() != Hessian2ID || !r.flags.IsTwoWay() || r.flags.IsEvent() {
			t.Fatalf("%s: flags %#x, want a two-way request in hessian2 (2)", tc.name, r.flags)
		}
		file := filepath.Join(dir, "client_"+tc.name+".bin")
		if err := os.WriteFile(file, r.body, 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, "request", file)
		want = append(want, "== "+filepath.Base(file)+"\n"+tc.want)
	}
	// The timeout attachment is the budget left when the request went
	// out: at most 1500 ms, and more than 1000 here. The idempotency key
	// differs from run to run.
	timeout := regexp.MustCompile(`timeout=(\d+)`)
	out := timeout.ReplaceAllStringFunc(java(t, cp, args...), func(s string) string {
		ms, _ := strconv.Atoi(timeout.FindStringSubmatch(s)[1])
		if ms > 1500 || ms <= 1000 {
			t.Errorf("Java read the timeout attachment %d ms; want the budget left of 1500 ms", ms)
		}
		return "timeout=T"
	})
	out = regexp.MustCompile(`idempotency-key=[0-9a-z]+-[0-9]+`).ReplaceAllString(out, "idempotency-key=K")
	got := strings.Split(out, "\n== ")
	for i := range got {
		if i > 0 {
			got[i] = "== " + got[i]
		}
	}
	if len(got) != len(want) {
		t.Fatalf("Java printed %d sections for %d requests:\n%s", len(got), len(want), out)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("Java read\n%s\nwant\n%s", got[i], want[i])
		}
	}
}
