// Dabbctl lists, watches, describes, calls and health-checks dabb services.
//
// It reads the registry the servers publish to (ZooKeeper, etcd, or a
// static list) and talks to the instances themselves, through their
// built-in health and reflection services:
//
//	dabbctl -registry etcd://127.0.0.1:2379/services ls
//	dabbctl ls inventory.Inventory                  # instances; -health adds their health
//	dabbctl watch inventory.Inventory               # joins and leaves, until interrupted
//	dabbctl describe inventory.Inventory.Deduct     # methods, directives, fields; -template
//	dabbctl call inventory.Inventory.Stock '{"sku":"sku-42"}'
//	dabbctl -H 'authorization=Bearer ${TOKEN}' call -d @order.json inventory.Inventory.Deduct
//	dabbctl call -addr 127.0.0.1:20880 inventory.Inventory.Stock '{"sku":"sku-42"}'
//	dabbctl health                                  # every service of every instance
//
// On a Dubbo registry (zookeeper://), ls lists the Dubbo interfaces and
// their providers, ls -health asks each with Dubbo's $echo, and call
// makes Dubbo's generic call:
//
//	dabbctl -registry zookeeper://127.0.0.1:2181 ls
//	dabbctl -registry zookeeper://127.0.0.1:2181 call com.example.Greeter.sayHello '["world"]'
//
// It is a module of its own. Install it at the root of a clone of dabb with
//
//	go install ./cmd/dabbctl
//
// or, once the module has a release tag, from anywhere with
//
//	go install github.com/dabbrpc/dabb/cmd/dabbctl@latest
//
// # Global flags
//
// Global flags come before the command:
//
//	-registry URL  the registry (zk://, etcd://, static://, or zookeeper:// for
//	               Dubbo's layout); default $DABB_REGISTRY
//	-tls           speak TLS to the instances (on when any flag below is given)
//	-cacert FILE   PEM certificates of the CAs that sign the servers' certificates;
//	               default the system's
//	-cert FILE     PEM client certificate, for mTLS (with -key)
//	-key FILE      PEM key of -cert
//	-servername N  the name every server's certificate is verified against; default
//	               the instance's tls_server_name metadata, or the host of its address
//	-H key=value   an attachment every call to an instance carries (call, describe,
//	               health, ls -health), repeatable; ${NAME} in the value expands the
//	               environment variable NAME. call takes -H after the command too
//	-o table|json  tables for people (default), or one JSON object a line for scripts
//	-v             log dabb's own messages (debug level) to standard error
//
// Each command takes -h.
//
// # Exit status
//
// 0 on success, 1 when what was asked failed (a call, a registry that does
// not answer, an instance that is not serving), 2 on bad usage. A failure
// is reported as one line on standard error, naming what failed and the
// status.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	_ "github.com/dabbrpc/dabb/codec/json" // the built-in services' codec
	_ "github.com/dabbrpc/dabb/dubbo"      // the zookeeper:// registry, Dubbo's layout
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
	_ "github.com/dabbrpc/dabb/registry/etcd"
	"github.com/dabbrpc/dabb/registry/static"
	_ "github.com/dabbrpc/dabb/registry/zk"
)

// Exit statuses.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

// registryEnv names the environment variable that -registry defaults to.
const registryEnv = "DABB_REGISTRY"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// app is one run of dabbctl: the global flags and where output goes.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer

	registryURL string
	// headers are -H's attachments, the global ones first, then the
	// command's; every call the command makes carries them.
	headers headerFlag
	tls     *tls.Config // nil: plaintext
	json    bool        // -o json
	log     *slog.Logger
}

// command is one subcommand.
type command struct {
	name, args, summary string
	// help says more than summary, after the usage line; may be empty.
	help string
	// flags declares the command's flags on fs and returns the function
	// that runs it with the positional arguments.
	flags func(a *app, fs *flag.FlagSet) func(ctx context.Context, args []string) error
}

var commands = []*command{lsCommand, watchCommand, describeCommand, callCommand, healthCommand}

func findCommand(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// usageError is bad usage: exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{fmt.Sprintf(format, args...)}
}

// run is dabbctl with its arguments and streams; it returns the exit status.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr}
	global := flag.NewFlagSet("dabbctl", flag.ContinueOnError)
	global.SetOutput(io.Discard)
	global.StringVar(&a.registryURL, "registry", os.Getenv(registryEnv), "registry `URL` (zk://, etcd://, static://, zookeeper:// for Dubbo's layout); default $"+registryEnv)
	useTLS := global.Bool("tls", false, "speak TLS to the instances (on when -cacert, -cert or -servername is given)")
	cacert := global.String("cacert", "", "PEM `file` of the CA certificates that sign the servers' certificates; default the system's")
	cert := global.String("cert", "", "PEM `file` of the client certificate, for mTLS (with -key)")
	key := global.String("key", "", "PEM `file` of the client certificate's key")
	serverName := global.String("servername", "", "the `name` every server's certificate is verified against; default each instance's tls_server_name metadata, or the host of its address")
	global.Var(&a.headers, "H", "an attachment `key=value` for every call to an instance, repeatable; ${NAME} in the value expands the environment variable NAME")
	output := global.String("o", "table", "output `format`: table (for people) or json (one object a line)")
	verbose := global.Bool("v", false, "log dabb's own messages (debug level) to standard error")
	global.Usage = func() {} // -h prints the usage below, once

	err := global.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		printGlobalUsage(stdout, global)
		return exitOK
	}
	if err == nil {
		err = a.setup(*output, *verbose, *useTLS, *cacert, *cert, *key, *serverName)
	}
	if err != nil {
		fmt.Fprintf(stderr, "dabbctl: %v\nrun 'dabbctl -h' for usage\n", oneLine(err))
		return exitUsage
	}
	rest := global.Args()
	if len(rest) == 0 {
		fmt.Fprintln(stderr, "dabbctl: no command given; want one of: "+commandNames())
		fmt.Fprintln(stderr, "run 'dabbctl -h' for usage")
		return exitUsage
	}
	name, rest := rest[0], rest[1:]
	if name == "help" {
		if len(rest) == 0 {
			printGlobalUsage(stdout, global)
			return exitOK
		}
		name, rest = rest[0], []string{"-h"}
	}
	cmd := findCommand(name)
	if cmd == nil {
		fmt.Fprintf(stderr, "dabbctl: unknown command %q; want one of: %s\nrun 'dabbctl -h' for usage\n", name, commandNames())
		return exitUsage
	}
	return a.runCommand(ctx, cmd, rest)
}

// runCommand parses the command's flags, runs it and turns its error into
// a report and an exit status.
func (a *app) runCommand(ctx context.Context, cmd *command, args []string) int {
	fs := flag.NewFlagSet("dabbctl "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	runFn := cmd.flags(a, fs)
	pos, err := parseInterspersed(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		printCommandUsage(a.stdout, cmd, fs)
		return exitOK
	}
	if err == nil {
		var opts []proxy.CallOption
		if opts, err = a.headers.callOptions(); err == nil {
			err = runFn(proxy.WithCallOptions(ctx, opts...), pos)
		}
	}
	var ue *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue) || isFlagError(err):
		fmt.Fprintf(a.stderr, "dabbctl %s: %s\nrun 'dabbctl %s -h' for usage\n", cmd.name, oneLine(err), cmd.name)
		return exitUsage
	case errors.As(err, new(*thrownError)):
		fmt.Fprintln(a.stderr, oneLine(err)) // CLASS: message, as Java prints it
		return exitFail
	default:
		fmt.Fprintf(a.stderr, "dabbctl: %s\n", oneLine(err))
		return exitFail
	}
}

// flagError wraps what the flag package reports about bad flags.
type flagError struct{ err error }

func (e *flagError) Error() string { return e.err.Error() }

func isFlagError(err error) bool {
	var fe *flagError
	return errors.As(err, &fe)
}

// parseInterspersed parses fs's flags wherever they stand among the
// positional arguments, which it returns in order. After "--" every
// argument is positional.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, &flagError{err}
		}
		rest := fs.Args()
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// setup checks and applies the global flags.
func (a *app) setup(output string, verbose, useTLS bool, cacert, cert, key, serverName string) error {
	switch output {
	case "table":
	case "json":
		a.json = true
	default:
		return usagef("-o %q: want table or json", output)
	}
	level := slog.LevelError
	if verbose {
		level = slog.LevelDebug
	}
	a.log = slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: level}))
	if (cert == "") != (key == "") {
		return usagef("-cert and -key go together")
	}
	if !useTLS && cacert == "" && cert == "" && serverName == "" {
		return nil
	}
	cfg := &tls.Config{ServerName: serverName, MinVersion: tls.VersionTLS12}
	if cacert != "" {
		pem, err := os.ReadFile(cacert)
		if err != nil {
			return usagef("-cacert: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return usagef("-cacert %s: no PEM certificate in it", cacert)
		}
		cfg.RootCAs = pool
	}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return usagef("-cert %s, -key %s: %v", cert, key, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	a.tls = cfg
	return nil
}

// openRegistry opens -registry, which the command needs.
func (a *app) openRegistry(ctx context.Context) (registry.Registry, error) {
	if a.registryURL == "" {
		return nil, usagef("no registry: give -registry URL before the command, or set $%s", registryEnv)
	}
	r, err := registry.Open(ctx, a.registryURL, registry.WithLogger(a.log))
	if err != nil {
		if errors.Is(err, registry.ErrInvalid) || errors.Is(err, registry.ErrUnknownScheme) {
			return nil, usagef("-registry: %v", err)
		}
		return nil, err
	}
	return r, nil
}

// newClient returns a client of the instances r lists, with the TLS
// flags, and a function that closes it (and r, when closeReg is set).
func (a *app) newClient(r registry.Registry, closeReg bool, opts ...proxy.Option) (*proxy.Client, func(), error) {
	opts = append([]proxy.Option{proxy.WithLogger(a.log)}, opts...)
	if a.tls != nil {
		opts = append(opts, proxy.WithTLS(a.tls))
	}
	c, err := proxy.NewClient(r, opts...)
	if err != nil {
		if closeReg {
			r.Close()
		}
		return nil, nil, err
	}
	return c, func() {
		c.Close()
		if closeReg {
			r.Close()
		}
	}, nil
}

// instanceClient returns a client of one instance: a static registry that
// resolves every service to it, its metadata kept (a tls_server_name among
// them).
func (a *app) instanceClient(in registry.Instance, opts ...proxy.Option) (*proxy.Client, func(), error) {
	return a.newClient(static.New(registry.Instance{Addr: in.Addr, Metadata: in.Metadata}), true, opts...)
}

// targetClient returns the client a command that takes -addr uses: one
// instance when addr is set, the registry's otherwise.
func (a *app) targetClient(ctx context.Context, addr string, opts ...proxy.Option) (*proxy.Client, func(), error) {
	if addr != "" {
		if err := (registry.Instance{Service: "any", ID: "any", Addr: addr}).Validate(); err != nil {
			return nil, nil, usagef("-addr %q: want host:port", addr)
		}
		return a.instanceClient(registry.Instance{Addr: addr}, opts...)
	}
	r, err := a.openRegistry(ctx)
	if err != nil {
		return nil, nil, err
	}
	return a.newClient(r, true, opts...)
}

// oneLine returns err's message on one line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", "; ")), " ")
}

func commandNames() string {
	names := make([]string, len(commands))
	for i, c := range commands {
		names[i] = c.name
	}
	return strings.Join(names, ", ")
}

func printGlobalUsage(w io.Writer, global *flag.FlagSet) {
	fmt.Fprintln(w, "usage: dabbctl [global flags] COMMAND [flags] [arguments]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Lists, watches, describes, calls and health-checks dabb services.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "commands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "global flags (before the command):")
	global.SetOutput(w)
	global.PrintDefaults()
	global.SetOutput(io.Discard)
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Exit status: 0 on success, 1 when what was asked failed, 2 on bad usage.")
	fmt.Fprintln(w, "Run 'dabbctl COMMAND -h' for a command's flags.")
}

func printCommandUsage(w io.Writer, cmd *command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "usage: dabbctl [global flags] %s [flags] %s\n\n%s\n", cmd.name, cmd.args, cmd.summary)
	if cmd.help != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(cmd.help))
	}
	has := false
	fs.VisitAll(func(*flag.Flag) { has = true })
	if has {
		fmt.Fprintln(w, "\nflags:")
		fs.SetOutput(w)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
}
