// Package frameworks runs the benchmark workload on each RPC framework the
// bench compares: a server that answers Echo and a client that calls it,
// both on the framework's recommended default setup.
//
//	f, err := frameworks.Lookup("grpc")
//	srv, err := f.Serve(listener) // in the server process
//	defer srv.Close()
//	c, err := f.Dial(addr)        // in the client process, shared by every caller
//	defer c.Close()
//	reply, err := c.Echo(ctx, benchpb.NewMessage(0))
//
// All is what a run takes by default. Extra adds dabb and gRPC over TLS
// 1.3, which a run takes only when named. Their client trusts a CA made
// at the process's start; a server in another process gets the same
// certificates through TLSEnviron. Dubbo adds dabb over Dubbo's hessian2
// bodies and dubbo-go, also only when named; dubbo-go is a program of its
// own module (Program), whose server and client both run as processes.
package frameworks

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	benchpb "github.com/dabbrpc/dabb/bench/proto"
)

// ErrUnknown reports a framework name that is not in All.
var ErrUnknown = errors.New("frameworks: unknown framework")

// Framework is one RPC framework under test.
type Framework struct {
	// Name is the short name used by flags and in tables.
	Name string
	// Setup says how the framework is configured: version, codec,
	// connections.
	Setup string
	// Serve serves Echo on l until the returned server is closed.
	Serve func(l net.Listener) (io.Closer, error)
	// Dial returns a client of the server at addr, safe for concurrent
	// use.
	Dial func(addr string) (Client, error)
	// UncountedWrites is set for a framework that writes its sockets with
	// sendmsg (Kitex's netpoll): /proc/self/io's syscw, where the bench
	// counts write system calls, counts write and writev but not sendmsg,
	// so the framework's writes would read 0.
	UncountedWrites bool
	// TLS is set for a framework that speaks TLS with the run's
	// certificate: its server process needs TLSEnviron in its
	// environment.
	TLS bool
	// Program, if set, is the directory, relative to the bench module's,
	// of a module of its own whose program is both the framework's server
	// (-server) and its client (-client ADDR, which runs the closed loop
	// itself), as dubbogo/main.go describes; Serve and Dial are nil.
	// BuildProgram builds it.
	Program string
	// AdapterAllocs, if set, says what this package's adapter allocates
	// on top of the framework's own work, which the in-process allocation
	// counts include; it completes "<name>'s row includes ...".
	AdapterAllocs string
}

// Client calls Echo.
type Client interface {
	// Echo sends req and returns the server's reply.
	Echo(ctx context.Context, req *benchpb.BenchmarkMessage) (*benchpb.BenchmarkMessage, error)
	// Close releases the client's connections.
	Close() error
}

// All lists the frameworks a run takes by default, in table order.
func All() []Framework {
	return []Framework{Dabb(), DabbIdempotent(), GRPC(), RPCX(), NetRPC(), Kitex(), KitexPool(), Raw(), RawConn()}
}

// Extra lists the frameworks a run takes only when named: dabb and gRPC
// over TLS.
func Extra() []Framework {
	return []Framework{DabbTLS(), GRPCTLS()}
}

// Dubbo lists the frameworks of Dubbo's protocol in hessian2, which a run
// takes only when named: dabb with the dubbo module, and dubbo-go.
func Dubbo() []Framework {
	return []Framework{DabbHessian2(), DubboGo()}
}

// Names returns the names of All, comma-separated.
func Names() string { return names(All()) }

// ExtraNames returns the names of Extra, comma-separated.
func ExtraNames() string { return names(Extra()) }

// DubboNames returns the names of Dubbo, comma-separated.
func DubboNames() string { return names(Dubbo()) }

func names(fs []Framework) string {
	var names []string
	for _, f := range fs {
		names = append(names, f.Name)
	}
	return strings.Join(names, ",")
}

// Lookup returns the framework of All, Extra or Dubbo called name.
func Lookup(name string) (Framework, error) {
	for _, f := range append(append(All(), Extra()...), Dubbo()...) {
		if f.Name == name {
			return f, nil
		}
	}
	return Framework{}, fmt.Errorf("%w %q (have %s,%s,%s)", ErrUnknown, name, Names(), ExtraNames(), DubboNames())
}
