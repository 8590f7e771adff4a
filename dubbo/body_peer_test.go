package dubbo

import (
	"bytes"
	"encoding/binary"
	"errors"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/protocol"
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
