package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"

	"github.com/dabbrpc/dabb/bench/frameworks"
	benchpb "github.com/dabbrpc/dabb/bench/proto"
)

// warmupTries bounds the calls callsMain makes before a first one
// succeeds.
const warmupTries = 20

// callsMode reports whether args ask for the fixed-count client: -calls
// in any of the flag package's spellings (-calls N, --calls=N).
func callsMode(args []string) bool {
	return slices.ContainsFunc(args, func(a string) bool {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		return strings.HasPrefix(a, "-") && name == "calls"
	})
}

// callsMain runs the fixed-count client: args are its flags. It dials the
// server of -framework at -addr (a server process started with -server),
// calls until a first call succeeds (at most warmupTries times), then
// makes -calls calls of the standard message one after the other, checks
// each reply, prints "calls N" and exits. scripts/instructions.sh runs it
// under callgrind to count the instructions of a call.
func callsMain(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("dabbbench -calls", flag.ContinueOnError)
	name := fs.String("framework", "", "framework whose server is at -addr")
	addr := fs.String("addr", "", "the server's address, HOST:PORT")
	calls := fs.Int("calls", 0, "calls to make, one after the other, from 1 to 100000000")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("%w: unexpected arguments %q", ErrUsage, fs.Args())
	case *addr == "":
		return fmt.Errorf("%w: -calls needs -addr", ErrUsage)
	case *calls < 1 || *calls > 100_000_000:
		return fmt.Errorf("%w: -calls %d: want 1 to 100000000", ErrUsage, *calls)
	}
	f, err := frameworks.Lookup(*name)
	if err != nil {
		return fmt.Errorf("%w: -framework: %w", ErrUsage, err)
	}
	c, err := f.Dial(*addr)
	if err != nil {
		return err
	}
	req := benchpb.NewMessage(0)
	ctx := context.Background()
	// Under callgrind, the first calls run code valgrind has not yet
	// translated, and may overrun dabb's 1 s default budget.
	for try := 1; ; try++ {
		reply, err := c.Echo(ctx, req)
		if err == nil {
			err = benchpb.Check(req, reply)
		}
		if err == nil {
			break
		}
		if try == warmupTries {
			c.Close()
			return fmt.Errorf("dabbbench: %s: %d calls failed before the first succeeded: %w", f.Name, try, err)
		}
	}
	for i := range *calls {
		reply, err := c.Echo(ctx, req)
		if err == nil {
			err = benchpb.Check(req, reply)
		}
		if err != nil {
			c.Close()
			return fmt.Errorf("dabbbench: %s: call %d of %d: %w", f.Name, i+1, *calls, err)
		}
	}
	if err := c.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("dabbbench: %s: close: %w", f.Name, err)
	}
	_, err = fmt.Fprintf(stdout, "calls %d\n", *calls)
	return err
}
