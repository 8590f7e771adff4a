package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/dabbrpc/dabb/bench/frameworks"
)

// The server process speaks to its parent in lines on stdin and stdout:
// it prints "<prefix> addr HOST:PORT" once it listens, answers each
// "sample" line with "<prefix> sample CPU_NS READS WRITES" (its own
// getrusage CPU time in nanoseconds and its read and write system calls
// from /proc/self/io; see sample), each "mem" line with "<prefix> mem
// RSS_KIB GOROUTINES HEAP_BYTES" after a GC (see takeMem), answers any other non-empty line with
// "<prefix> error unknown command ...", and exits when stdin closes. Lines
// without the prefix are ignored by the parent.
const ctlPrefix = "dabbbench-server"

// serverMain runs the server process: args are its flags.
func serverMain(args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("dabbbench -server", flag.ContinueOnError)
	fs.Bool("server", true, "run as the server process")
	name := fs.String("framework", "", "framework to serve")
	addr := fs.String("addr", "127.0.0.1:0", "listen address (loopback)")
	profile := fs.String("cpuprofile", "", "write a CPU profile of the server's life to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *profile != "" {
		stop, err := startProfile(*profile)
		if err != nil {
			return err
		}
		defer stop()
	}
	f, err := frameworks.Lookup(*name)
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("dabbbench: server: %w", err)
	}
	srv, err := f.Serve(l)
	if err != nil {
		l.Close()
		return fmt.Errorf("dabbbench: server %s: %w", f.Name, err)
	}
	fmt.Fprintf(stdout, "%s addr %s\n", ctlPrefix, l.Addr())
	sc := bufio.NewScanner(stdin)
	for sc.Scan() {
		switch cmd := strings.TrimSpace(sc.Text()); cmd {
		case "sample":
			fmt.Fprintf(stdout, "%s sample %s\n", ctlPrefix, takeSample())
		case "mem":
			fmt.Fprintf(stdout, "%s mem %s\n", ctlPrefix, takeMem())
		case "":
		default:
			fmt.Fprintf(stdout, "%s error unknown command %q\n", ctlPrefix, cmd)
		}
	}
	if err := srv.Close(); err != nil {
		return fmt.Errorf("dabbbench: server %s: close: %w", f.Name, err)
	}
	return sc.Err()
}
