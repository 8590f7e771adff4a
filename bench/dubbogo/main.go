// Command dubbogo is the dubbo-go row of dabbbench: a dubbo-go v3.3.1
// server of com.example.bench.EchoService, or a dubbo-go client of one
// that runs dabbbench's closed loop in this process, both over the dubbo
// protocol with hessian2 bodies, the client dialing the server's URL
// directly (no registry).
//
//	dubbogo -server [-cpuprofile FILE]
//	dubbogo -client 127.0.0.1:PORT [-cpuprofile FILE]
//
// dabbbench builds it (GOWORK=off, in this module's directory) and talks
// to it in lines on stdin and stdout; lines of its own start with
// "dabbbench-server " or "dabbbench-client ", anything else on stdout is
// ignored. Both modes answer "sample" with "sample CPU_NS READS WRITES"
// (getrusage's user and system time, and read and write system calls
// from /proc/self/io), and exit when stdin closes.
//
// The server prints "addr HOST:PORT" once it serves. The client prints
// "ready" once a first call has been answered and checked. Then each
// "run C LARGE PAD LARGEPAD WARMUP_NS DURATION_NS" starts C goroutines
// calling with PAD bytes of padding and LARGE more with LARGEPAD, for a
// warm-up and a window (see run.go), and prints:
//
//	start CPU_NS READS WRITES          (its sample as the window begins)
//	end CPU_NS READS WRITES WINDOW_NS  (as it ends)
//	result CALLS ERRORS LARGE_CALLS
//	hist small TEXT                    (the window's latencies, bench/hist's text form)
//	hist large TEXT
//	error TEXT                         (the first failed call, if one failed)
//	done
//
// or "stalled WHERE" if no call completes for 30 s. A bad line is
// answered "error unknown command ...".
//
// It is a module of its own so that dubbo-go's requirements never meet
// dabb's or the bench's.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"strings"
	"sync"

	gxgetty "github.com/apache/dubbo-getty"
	"github.com/dubbogo/gost/log/logger"
	"go.uber.org/zap"

	// The plugins the program uses, instead of dubbo-go's imports
	// package, which links every registry, protocol and filter dubbo-go
	// has.
	_ "dubbo.apache.org/dubbo-go/v3/cluster/cluster/failover"
	_ "dubbo.apache.org/dubbo-go/v3/cluster/loadbalance/random"
	_ "dubbo.apache.org/dubbo-go/v3/filter/echo"
	_ "dubbo.apache.org/dubbo-go/v3/filter/graceful_shutdown"
	_ "dubbo.apache.org/dubbo-go/v3/protocol/dubbo"
	_ "dubbo.apache.org/dubbo-go/v3/proxy/proxy_factory"
	_ "dubbo.apache.org/dubbo-go/v3/registry/protocol"
)

func main() {
	if err := run(os.Args[1:], os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "dubbogo:", err)
		os.Exit(1)
	}
}

func run(args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("dubbogo", flag.ContinueOnError)
	server := fs.Bool("server", false, "serve com.example.bench.EchoService on a free port of 127.0.0.1")
	client := fs.String("client", "", "call the server at this `host:port`")
	profile := fs.String("cpuprofile", "", "write a CPU profile of the process's life to this `file`")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *server == (*client != "") {
		return fmt.Errorf("give one of -server and -client")
	}
	setupLog()
	if *profile != "" {
		f, err := os.Create(*profile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if *server {
		return serve(stdin, &lines{w: stdout, prefix: "dabbbench-server"})
	}
	return callLoop(*client, stdin, &lines{w: stdout, prefix: "dabbbench-client"})
}

// setupLog sends dubbo-go's warnings and errors to standard error; it
// writes to standard output by default, where the control lines go.
// getty, its transport, logs at debug level by default, a line per
// frame: warnings and errors only.
func setupLog() {
	gxgetty.SetLoggerLevel(gxgetty.LoggerLevelWarn)
	logger.InitLogger(&logger.Config{ZapConfig: &zap.Config{
		Level:            zap.NewAtomicLevelAt(zap.WarnLevel),
		Encoding:         "console",
		EncoderConfig:    zap.NewDevelopmentEncoderConfig(),
		OutputPaths:      []string{"stderr"},
		ErrorOutputPaths: []string{"stderr"},
	}})
}

// lines writes control lines, each with the prefix, one at a time.
type lines struct {
	mu     sync.Mutex
	w      io.Writer
	prefix string
}

func (l *lines) printf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.w, l.prefix+" "+format+"\n", args...)
}

// commands calls handle with each non-empty line of stdin until it
// closes; "sample" is answered here.
func commands(stdin io.Reader, out *lines, handle func(cmd string, f []string) bool) error {
	sc := bufio.NewScanner(stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 0:
		case f[0] == "sample" && len(f) == 1:
			out.printf("sample %s", takeSample())
		case handle != nil && handle(f[0], f[1:]):
		default:
			out.printf("error unknown command %q", sc.Text())
		}
	}
	return sc.Err()
}
