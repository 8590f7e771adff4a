//go:build !windows

// Tests of dabbctl run the built binary against real etcd and ZooKeeper
// servers and real dabb servers, each in a process of its own: the test
// binary itself, run as a server (runServerProcess).

package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/internal/etcdtest"
	"github.com/dabbrpc/dabb/internal/inventory"
	"github.com/dabbrpc/dabb/internal/tlstest"
	"github.com/dabbrpc/dabb/internal/zktest"
	"github.com/dabbrpc/dabb/registry"
)

// bin is the dabbctl binary TestMain built.
var bin string

type runFunc func() int

func (f runFunc) Run() int { return f() }

func TestMain(m *testing.M) {
	if os.Getenv(serverEnv) != "" {
		os.Exit(runServerProcess())
	}
	dir, err := os.MkdirTemp("", "dabbctl-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "dabbctl")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build dabbctl: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	shared := etcdtest.WithShared(zktest.WithShared(m))
	goleak.VerifyTestMain(runFunc(func() int {
		defer os.RemoveAll(dir)
		return shared.Run()
	}))
}

// backends are the registries every test runs against: one shared server
// of each per package run, a prefix of its own per test.
var backends = []struct {
	name string
	url  func(t *testing.T) string
}{
	{"etcd", func(t *testing.T) string { return "etcd://" + etcdtest.Shared(t).Endpoint() + testPrefix(t) }},
	{"zk", func(t *testing.T) string { return "zk://" + zktest.Shared(t).Addr() + testPrefix(t) }},
}

func testPrefix(t *testing.T) string {
	return fmt.Sprintf("/dabbctl-%s-%d", strings.ReplaceAll(t.Name(), "/", "-"), time.Now().UnixNano())
}

// result is what one run of dabbctl did.
type result struct {
	stdout, stderr string
	code           int
}

func (r result) String() string {
	return fmt.Sprintf("exit status %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// runTimeout bounds one run of dabbctl.
const runTimeout = 30 * time.Second

// ctl runs dabbctl with args, $DABB_REGISTRY unset, and returns what it did.
func ctl(t *testing.T, args ...string) result {
	t.Helper()
	return ctlWith(t, "", nil, args...)
}

// ctlWith runs dabbctl with stdin and extra environment variables.
func ctlWith(t *testing.T, stdin string, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(append(os.Environ(), registryEnv+"="), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("dabbctl %s: %v", strings.Join(args, " "), err)
	}
	if ctx.Err() != nil {
		t.Fatalf("dabbctl %s did not finish within %v", strings.Join(args, " "), runTimeout)
	}
	return r
}

// wantCode fails the test unless r exited with code.
func wantCode(t *testing.T, r result, code int, what string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("%s: want exit status %d, got %s", what, code, r)
	}
}

// lines delivers the lines a process writes, as they come.
type lines struct {
	ch   chan string
	mu   sync.Mutex // guards seen
	seen []string
}

func readLines(r io.Reader) *lines {
	l := &lines{ch: make(chan string, 1024)}
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			l.mu.Lock()
			l.seen = append(l.seen, sc.Text())
			l.mu.Unlock()
			l.ch <- sc.Text()
		}
		close(l.ch)
	}()
	return l
}

// await returns the first line to come that match accepts, failing the
// test when none does within d.
func (l *lines) await(t *testing.T, d time.Duration, what string, match func(string) bool) string {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case line, ok := <-l.ch:
			if !ok {
				t.Fatalf("waiting for %s: the output ended; it was:\n%s", what, l.all())
			}
			if match(line) {
				return line
			}
		case <-timer.C:
			t.Fatalf("no %s within %v; the output was:\n%s", what, d, l.all())
		}
	}
}

func (l *lines) all() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.seen, "\n")
}

// The server process: the environment that makes the test binary one, and
// what it serves.
const (
	serverEnv         = "DABBCTL_TEST_SERVER" // the registry URL, or "none"
	serverWeightEnv   = "DABBCTL_TEST_WEIGHT"
	serverMetaEnv     = "DABBCTL_TEST_META" // k=v
	serverHoldEnv     = "DABBCTL_TEST_HOLD" // "1": Deregister waits for SIGUSR1
	serverNoReflect   = "DABBCTL_TEST_NOREFLECT"
	serverDrainEnv    = "DABBCTL_TEST_DRAIN" // a duration: dabb.WithDrainDelay
	serverTLSEnv      = "DABBCTL_TEST_TLS"   // a directory with ca.pem, server.pem and server-key.pem: mTLS
	serverTokenEnv    = "DABBCTL_TEST_TOKEN" // a bearer token: dabb.RequireToken
	echoService       = "dabbctl.test.Echo"
	inventoryService  = inventory.InventoryServiceName
	serverReadyPrefix = "listening "
)

// server is a dabb server in a child process.
type server struct {
	addr string
	cmd  *exec.Cmd
	out  *lines
	done chan struct{} // closed when the process has exited
}

// serverOpts are the settings of a server process.
type serverOpts struct {
	weight    int
	meta      string // k=v
	hold      bool   // Deregister waits for SIGUSR1, printing "withdrawing" first
	noReflect bool
	tlsDir    string        // serve mTLS with the files there (see serverTLSEnv)
	drain     time.Duration // dabb.WithDrainDelay
	token     string        // dabb.RequireToken(token)
}

// startServer starts a server process that publishes to regURL ("" for
// none) and returns once the registry lists it.
func startServer(t *testing.T, regURL string, o serverOpts) *server {
	t.Helper()
	if regURL == "" {
		regURL = "none"
	}
	s := &server{cmd: exec.Command(os.Args[0], "-test.run=^$"), done: make(chan struct{})}
	s.cmd.Env = append(os.Environ(), serverEnv+"="+regURL, fmt.Sprintf("%s=%d", serverWeightEnv, o.weight), serverMetaEnv+"="+o.meta)
	if o.hold {
		s.cmd.Env = append(s.cmd.Env, serverHoldEnv+"=1")
	}
	if o.noReflect {
		s.cmd.Env = append(s.cmd.Env, serverNoReflect+"=1")
	}
	if o.tlsDir != "" {
		s.cmd.Env = append(s.cmd.Env, serverTLSEnv+"="+o.tlsDir)
	}
	if o.drain > 0 {
		s.cmd.Env = append(s.cmd.Env, serverDrainEnv+"="+o.drain.String())
	}
	if o.token != "" {
		s.cmd.Env = append(s.cmd.Env, serverTokenEnv+"="+o.token)
	}
	s.cmd.Stderr = os.Stderr
	stdout, err := s.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.cmd.Wait(); close(s.done) }()
	t.Cleanup(func() {
		s.cmd.Process.Kill()
		<-s.done
	})
	s.out = readLines(stdout)
	line := s.out.await(t, 30*time.Second, "the server's address", func(l string) bool { return strings.HasPrefix(l, serverReadyPrefix) })
	s.addr = strings.TrimPrefix(line, serverReadyPrefix)
	return s
}

// signal sends sig to the server process.
func (s *server) signal(t *testing.T, sig os.Signal) {
	t.Helper()
	if err := s.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v to the server at %s: %v", sig, s.addr, err)
	}
}

func (s *server) wait(t *testing.T) {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("the server at %s did not exit within 20 s", s.addr)
	}
}

// echoRequest and echoReply are the messages of the echo service's
// Attachment method, which answers the value of one attachment.
type echoRequest struct {
	Key string `json:"key"`
}

type echoReply struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// echoDesc is the echo service: JSON messages, one method.
var echoDesc = dabb.ServiceDesc{
	Name: echoService,
	Methods: []dabb.MethodDesc{{
		Name:     "Attachment",
		Request:  (*echoRequest)(nil),
		Response: (*echoReply)(nil),
		Handler: func(_ any, ctx context.Context, dec func(any) error) (any, error) {
			req := new(echoRequest)
			if err := dec(req); err != nil {
				return nil, err
			}
			return &echoReply{Key: req.Key, Value: dabb.Attachments(ctx)[req.Key]}, nil
		},
	}},
}

// holdRegistry makes Deregister print "withdrawing" and wait for SIGUSR1:
// it holds a Shutdown at its start, while the health service already says
// not serving.
type holdRegistry struct {
	registry.Registry
	released chan struct{} // closed at the first SIGUSR1
}

func newHoldRegistry(r registry.Registry) *holdRegistry {
	h := &holdRegistry{Registry: r, released: make(chan struct{})}
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	go func() {
		<-usr1
		close(h.released)
	}()
	return h
}

func (h *holdRegistry) Deregister(ctx context.Context, in registry.Instance) error {
	fmt.Println("withdrawing " + in.Service)
	select {
	case <-h.released:
	case <-ctx.Done():
	}
	return h.Registry.Deregister(ctx, in)
}

// runServerProcess serves the inventory and echo services on a loopback
// port until SIGTERM, which shuts it down gracefully. Once the registry
// lists both it prints "listening ADDR".
func runServerProcess() int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "server:", err); return 1 }
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var reg registry.Registry
	opts := []dabb.Option{dabb.WithLogger(quietLogger())}
	if url := os.Getenv(serverEnv); url != "none" {
		r, err := registry.Open(ctx, url, registry.WithLogger(quietLogger()))
		if err != nil {
			return fail(err)
		}
		defer r.Close()
		reg = r
		if os.Getenv(serverHoldEnv) == "1" {
			reg = newHoldRegistry(r)
		}
		opts = append(opts, dabb.WithRegistry(reg))
	}
	var weight int
	fmt.Sscan(os.Getenv(serverWeightEnv), &weight)
	var md map[string]string
	if k, v, ok := strings.Cut(os.Getenv(serverMetaEnv), "="); ok {
		md = map[string]string{k: v}
	}
	opts = append(opts, dabb.WithInstance(weight, md))
	more, err := serverOptions()
	if err != nil {
		return fail(err)
	}
	s := dabb.NewServer(append(opts, more...)...)
	if err := inventory.RegisterInventoryServer(s, inventory.NewStore(map[string]int64{"sku-1": 100, "sku-2": 5})); err != nil {
		return fail(err)
	}
	if err := s.RegisterService(&echoDesc, struct{}{}); err != nil {
		return fail(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fail(err)
	}
	addr := l.Addr().String()
	served := make(chan error, 1)
	go func() { served <- s.Serve(l) }()
	if reg != nil {
		for _, svc := range []string{inventoryService, echoService} {
			if err := awaitListed(ctx, reg, svc, addr); err != nil {
				return fail(err)
			}
		}
	}
	fmt.Println(serverReadyPrefix + addr)
	select {
	case err := <-served:
		return fail(err)
	case <-term:
	}
	sctx, scancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer scancel()
	if err := s.Shutdown(sctx); err != nil {
		return fail(err)
	}
	<-served
	return 0
}

// awaitListed waits until r lists service at addr.
func awaitListed(ctx context.Context, r registry.Registry, service, addr string) error {
	w, err := r.Watch(ctx, service)
	if err != nil {
		return err
	}
	defer w.Stop()
	for {
		set, err := w.Next(ctx)
		if ctx.Err() != nil {
			return fmt.Errorf("%s at %s not listed: %w", service, addr, ctx.Err())
		}
		for _, in := range set {
			if err == nil && in.Addr == addr {
				return nil
			}
		}
	}
}

// TestUsage: bad usage exits 2 with a message naming the fault; -h exits
// 0 with the usage, for dabbctl and each command.
func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string // in stderr
	}{
		{"no command", nil, "no command given"},
		{"unknown command", []string{"lsx"}, `unknown command "lsx"`},
		{"bad output", []string{"-o", "xml", "ls"}, `-o "xml": want table or json`},
		{"unknown global flag", []string{"-bogus", "ls"}, "flag provided but not defined: -bogus"},
		{"unknown command flag", []string{"-registry", "static://127.0.0.1:1", "ls", "-bogus"}, "flag provided but not defined: -bogus"},
		{"no registry", []string{"ls"}, "no registry: give -registry URL"},
		{"unknown scheme", []string{"-registry", "nosuch://127.0.0.1:1", "ls"}, `unknown scheme "nosuch"`},
		{"cert without key", []string{"-cert", "client.pem", "ls"}, "-cert and -key go together"},
		{"missing cacert", []string{"-cacert", "/nonexistent.pem", "ls"}, "-cacert: open /nonexistent.pem"},
		{"ls two services", []string{"-registry", "static://127.0.0.1:1", "ls", "a.A", "b.B"}, "want at most one SERVICE"},
		{"ls -health without service", []string{"-registry", "static://127.0.0.1:1", "ls", "-health"}, "-health needs a SERVICE"},
		{"ls bad service name", []string{"-registry", "static://127.0.0.1:1", "ls", "a/b"}, `service name "a/b"`},
		{"watch without service", []string{"-registry", "static://127.0.0.1:1", "watch"}, "want one SERVICE, got 0"},
		{"health two services", []string{"health", "-addr", "127.0.0.1:1", "a.A", "b.B"}, "want at most one SERVICE"},
		{"health bad addr", []string{"health", "-addr", "nohost"}, `-addr "nohost": want host:port`},
		{"bad timeout", []string{"health", "-addr", "127.0.0.1:1", "-timeout", "-1s"}, "-timeout -1s: want a positive duration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := ctl(t, tc.args...)
			wantCode(t, r, exitUsage, "dabbctl "+strings.Join(tc.args, " "))
			if !strings.Contains(r.stderr, tc.want) {
				t.Errorf("stderr does not say %q:\n%s", tc.want, r.stderr)
			}
			if n := strings.Count(strings.TrimSpace(r.stderr), "\n"); n > 1 {
				t.Errorf("stderr has %d lines, want the error and where to find usage:\n%s", n+1, r.stderr)
			}
		})
	}
	t.Run("help", func(t *testing.T) {
		r := ctl(t, "-h")
		wantCode(t, r, exitOK, "dabbctl -h")
		if n := strings.Count(r.stdout, "usage: dabbctl"); n != 1 {
			t.Errorf("dabbctl -h prints the usage %d times:\n%s", n, r.stdout)
		}
		for _, want := range []string{"usage: dabbctl [global flags] COMMAND", "-registry URL", "-servername", "-H key=value", "-o format"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("dabbctl -h does not say %q:\n%s", want, r.stdout)
			}
		}
		for _, c := range commands {
			r := ctl(t, c.name, "-h")
			wantCode(t, r, exitOK, "dabbctl "+c.name+" -h")
			if n := strings.Count(r.stdout, "usage: dabbctl"); n != 1 {
				t.Errorf("dabbctl %s -h prints the usage %d times:\n%s", c.name, n, r.stdout)
			}
			if want := "usage: dabbctl [global flags] " + c.name + " [flags] " + c.args; !strings.Contains(r.stdout, want) {
				t.Errorf("dabbctl %s -h does not say %q:\n%s", c.name, want, r.stdout)
			}
			if !strings.Contains(r.stdout, c.summary) {
				t.Errorf("dabbctl %s -h does not give the summary %q", c.name, c.summary)
			}
		}
	})
}

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// serverOptions returns the server process's options its environment asks for.
func serverOptions() ([]dabb.Option, error) {
	var opts []dabb.Option
	if os.Getenv(serverNoReflect) == "1" {
		opts = append(opts, dabb.WithoutReflection())
	}
	if v := os.Getenv(serverDrainEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return nil, err
		}
		opts = append(opts, dabb.WithDrainDelay(d))
	}
	if tok := os.Getenv(serverTokenEnv); tok != "" {
		opts = append(opts, dabb.WithInterceptor(dabb.RequireToken(tok)))
	}
	if dir := os.Getenv(serverTLSEnv); dir != "" {
		cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem"))
		if err != nil {
			return nil, err
		}
		ca, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(ca)
		opts = append(opts, dabb.WithTLS(&tls.Config{
			Certificates: []tls.Certificate{cert},
			ClientCAs:    pool,
			ClientAuth:   tls.RequireAndVerifyClientCert,
		}))
	}
	return opts, nil
}

// writePEM writes cert and its key as PEM files dir/name.pem and
// dir/name-key.pem.
func writePEM(t *testing.T, dir, name string, cert tls.Certificate) {
	t.Helper()
	key, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	for file, block := range map[string]*pem.Block{
		name + ".pem":     {Type: "CERTIFICATE", Bytes: cert.Certificate[0]},
		name + "-key.pem": {Type: "PRIVATE KEY", Bytes: key},
	} {
		if err := os.WriteFile(filepath.Join(dir, file), pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestTLS: with -cacert, -cert and -key dabbctl speaks mTLS to a server
// that requires it, and -servername names the certificate's name; without
// them, or with a wrong name or no client certificate, the call fails with
// exit status 1 and says why.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "dabbctl test CA")
	writePEM(t, dir, "server", ca.Issue(t, tlstest.Spec{CommonName: "server", DNSNames: []string{"dabb.test"}, IPs: tlstest.Loopback}))
	writePEM(t, dir, "client", ca.Issue(t, tlstest.Spec{CommonName: "client", Client: true}))
	if err := os.WriteFile(filepath.Join(dir, "ca.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, "", serverOpts{tlsDir: dir})
	mtls := []string{"-cacert", filepath.Join(dir, "ca.pem"), "-cert", filepath.Join(dir, "client.pem"), "-key", filepath.Join(dir, "client-key.pem")}
	with := func(extra ...string) []string { return append(append([]string(nil), mtls...), extra...) }

	r := ctl(t, with("health", "-addr", s.addr)...)
	wantCode(t, r, exitOK, "health over mTLS")
	r = ctl(t, with("-servername", "dabb.test", "-o", "json", "call", "-addr", s.addr, inventoryService+".Stock", `{"sku":"sku-2"}`)...)
	wantCode(t, r, exitOK, "call over mTLS with -servername")
	if want := `{"sku":"sku-2","count":"5"}` + "\n"; r.stdout != want {
		t.Errorf("call over mTLS printed %q, want %q", r.stdout, want)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"plaintext", []string{"health", "-addr", s.addr}, "expects TLS, and this client speaks plaintext dabb"},
		{"wrong server name", with("-servername", "other.test", "health", "-addr", s.addr), "not valid for other.test"},
		{"no client certificate", []string{"-cacert", filepath.Join(dir, "ca.pem"), "call", "-addr", s.addr, inventoryService + ".Stock"}, "the server requires a client certificate and none was sent"},
		{"unknown authority", []string{"-tls", "health", "-addr", s.addr}, "signed by an unknown authority"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := ctl(t, append(tc.args, "-timeout", "2s")...)
			wantCode(t, r, exitFail, strings.Join(tc.args, " "))
			if !strings.Contains(r.stdout+r.stderr, tc.want) {
				t.Errorf("the failure does not mention %q:\n%s", tc.want, r)
			}
		})
	}
}

// TestToken: against a server with RequireToken on, health answers
// without the token; ls -health, describe and call answer with the global
// -H, and call with -H after the command too; global and command -H
// values both reach the handler; a wrong or missing token exits 1 saying
// unauthenticated.
func TestToken(t *testing.T) {
	url := backends[0].url(t)
	s := startServer(t, url, serverOpts{token: "s3cret"})
	env := []string{"TOKEN=s3cret"}
	bearer := "authorization=Bearer ${TOKEN}"
	ok := func(what string, args ...string) result {
		t.Helper()
		r := ctlWith(t, "", env, append([]string{"-registry", url}, args...)...)
		wantCode(t, r, exitOK, what)
		return r
	}

	r := ok("health without a token", "health", inventoryService)
	if re := `(?m)^inventory\.Inventory\s+` + regexp.QuoteMeta(s.addr) + `\s+serving$`; !regexp.MustCompile(re).MatchString(r.stdout) {
		t.Errorf("health without a token: no line matching %s in\n%s", re, r.stdout)
	}
	ok("health -addr without a token", "health", "-addr", s.addr)
	r = ok("ls -health with -H", "-H", bearer, "ls", "-health", inventoryService)
	if re := `(?m)^` + regexp.QuoteMeta(s.addr) + `\s+100\s+-\s+serving$`; !regexp.MustCompile(re).MatchString(r.stdout) {
		t.Errorf("ls -health with -H: no line matching %s in\n%s", re, r.stdout)
	}
	r = ok("describe with -H", "-H", bearer, "describe", inventoryService+".Stock")
	if !strings.Contains(r.stdout, "Stock  idempotent") {
		t.Errorf("describe with -H does not describe Stock:\n%s", r.stdout)
	}
	want := "{\n  \"sku\": \"sku-1\",\n  \"count\": \"100\"\n}\n"
	for _, args := range [][]string{
		{"-H", bearer, "call", inventoryService + ".Stock", `{"sku":"sku-1"}`},
		{"call", "-H", bearer, inventoryService + ".Stock", `{"sku":"sku-1"}`},
		{"call", inventoryService + ".Stock", `{"sku":"sku-1"}`, "-H", bearer},
	} {
		if r := ok(strings.Join(args, " "), args...); r.stdout != want {
			t.Errorf("%s printed %q, want %q", strings.Join(args, " "), r.stdout, want)
		}
	}
	for key, value := range map[string]string{"authorization": "Bearer s3cret", "x-global": "1", "x-command": "2"} {
		r := ok("call with global and command -H", "-H", bearer, "-H", "x-global=1", "-o", "json",
			"call", "-H", "x-command=2", echoService+".Attachment", `{"key":"`+key+`"}`)
		var echo echoReply
		if err := json.Unmarshal([]byte(r.stdout), &echo); err != nil || echo.Value != value {
			t.Errorf("global and command -H: the handler saw %+v (%v) for %s, want %q", echo, err, key, value)
		}
	}

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"call with a wrong token", []string{"-H", "authorization=Bearer wrong", "call", inventoryService + ".Stock"}, "code unauthenticated: invalid bearer token"},
		{"call without a token", []string{"call", inventoryService + ".Stock"}, "code unauthenticated: missing credentials"},
		{"describe with a wrong token", []string{"-H", "authorization=Bearer wrong", "describe", inventoryService}, "code unauthenticated: invalid bearer token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := ctlWith(t, "", env, append([]string{"-registry", url}, tc.args...)...)
			wantCode(t, r, exitFail, tc.name)
			if lines := nonEmpty(r.stderr); len(lines) != 1 || !strings.Contains(lines[0], tc.want) {
				t.Errorf("%s: stderr is not one line saying %q:\n%s", tc.name, tc.want, r.stderr)
			}
		})
	}
	r = ctl(t, "-H", bearer, "health", "-addr", s.addr)
	wantCode(t, r, exitUsage, "-H naming an unset variable")
	if !strings.Contains(r.stderr, "-H authorization: the environment variable TOKEN is not set") {
		t.Errorf("-H naming an unset variable: stderr does not say so:\n%s", r.stderr)
	}
}

// deadAddr returns a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
