// Rpcgen writes the dabb client stub and server glue for Go interfaces.
//
// Declare the service as an interface and let go generate do the rest:
//
//	//go:generate go run github.com/dabbrpc/dabb/cmd/rpcgen -type Inventory
//
//	// Inventory keeps stock per item.
//	type Inventory interface {
//		// Deduct takes items out of stock.
//		Deduct(ctx context.Context, req *pb.DeductRequest) (*pb.DeductReply, error)
//		// Stock reports what is left.
//		//dabb:idempotent
//		//dabb:timeout 200ms
//		Stock(ctx context.Context, req *pb.StockRequest) (*pb.StockReply, error)
//	}
//
// Running "go generate" writes inventory_dabb.go beside it, which declares:
//
//	const InventoryServiceName = "inventory.Inventory"
//	func NewInventoryClient(c proxy.Caller) Inventory       // the client stub
//	func RegisterInventoryServer(s *dabb.Server, impl Inventory) error
//	var InventoryServiceDesc = dabb.ServiceDesc{...}        // the server glue
//
// The ServiceDesc records each method's directives and its request and
// response types, which the server's reflection service reports.
//
// A client calls inventory.NewInventoryClient(client).Deduct(ctx, req), where
// client is a *proxy.Client. A server calls
// inventory.RegisterInventoryServer(srv, impl) before serving.
//
// # Methods
//
// Every method of the interface must be exported and have the form
//
//	Name(ctx context.Context, req *Request) (*Response, error)
//
// Request and Response are named struct types: protobuf messages, or plain
// Go types for the JSON codec (see the imports below).
// They may be declared in the same package or imported from others. The
// methods of embedded interfaces count, flattened in declaration order; an
// embedded any adds none.
//
// The generated code names a message type itself, not an alias of it. The
// exception is a type of an internal package that the interface's package
// may not import: the code names it through the exported alias the source
// refers to it by.
//
// # Directives
//
// Comment lines starting with //dabb: set what the runtime needs to know.
// On a method, among the lines of its doc comment:
//
//	//dabb:idempotent     the call may be retried on another instance after a failure
//	//dabb:timeout 200ms  the method's deadline (a time.ParseDuration string)
//
// In the interface's doc comment:
//
//	//dabb:service name   the service name; default <package name>.<Interface>
//	//dabb:dubbo name     a Java interface: see "Dubbo interfaces"
//
// A service name must be one the registry accepts (registry.ValidateService).
// It is not empty, "." or "..", and has no '/' or control characters.
//
// In a group of types, type ( ... ), the interface's doc comment is the one
// inside the parentheses. The group's own doc comment holds the directives
// only for a group of one type without a doc comment of its own.
//
// Unknown directives are errors, so a typo cannot be ignored silently. So
// are directives anywhere else inside the interface or above a group of
// types, and lines like "// dabb:idempotent", with a space after the slashes.
//
// # Dubbo interfaces
//
// An interface whose doc comment holds
//
//	//dabb:dubbo com.example.inventory.InventoryService [version=V] [group=G]
//
// declares a Java interface, served to and called from Dubbo in hessian2
// through the dubbo module (github.com/dabbrpc/dabb/dubbo). Its methods
// have the form
//
//	Name(ctx context.Context, args...) (R, error)
//	Name(ctx context.Context, args...) error   // a void Java method
//
// The arguments and the result are Go types the dubbo module maps to Java
// (dubbo.JavaType): rpcgen refuses those it never maps, such as unsigned
// integers, arrays and channels. A method's doc comment may also hold
//
//	//dabb:java deduct             the Java method name; default the Go name
//	                              with a lower-case first letter
//	//dabb:java deduct(long,int)   the name and the Java parameter types;
//	                              default the dubbo module's table
//
// and //dabb:idempotent and //dabb:timeout, as above. //dabb:dubbo and
// //dabb:service exclude each other. For InventoryService the generated
// file declares the Dubbo code only:
//
//	const InventoryServiceJavaInterface = "com.example.inventory.InventoryService"
//	func InventoryServiceDubboOptions() []dubbo.ServiceOption
//	func NewInventoryServiceDubboClient(c *proxy.Client, opts ...dubbo.ServiceOption) (InventoryService, error)
//	func RegisterInventoryServiceDubboServer(s *dabb.Server, impl InventoryService, opts ...dubbo.ServiceOption) error
//
// The options are the declaration: version, group, //dabb:java names and
// types, and the idempotent methods. The client and the registration take
// them first and opts after. The client's methods call dubbo.Client.Call
// with the method's timeout. The registration serves the interface's
// methods and no others. Only a file with a Dubbo interface imports the
// dubbo module, and it imports no codec.
//
// # Usage
//
//	rpcgen -type T[,T...] [-output file] [-dir dir] [-tags tags]
//
// The flags are:
//
//	-type    names of the interfaces, comma-separated; required
//	-output  output file; default <dir>/<lowercase type>_dabb.go, one file
//	         per type (see "Build constraints" for a type declared in a
//	         file with one). With -output, all types go into that one file
//	         (a relative name is relative to the working directory).
//	-dir     directory of the package to read; default "." (the package
//	         of the file go generate runs for; $GOFILE is not needed)
//	-tags    build tags to apply when loading the package, comma-separated
//	         (or space-separated, as the go command also accepts)
//
// Rpcgen reads the package with the go command, so run it inside the module
// that holds the package. It follows GOFLAGS, -modfile included. It ignores
// the code of files it wrote earlier, so a stale stub never prevents its own
// regeneration. It overwrites only such files.
//
// The generated code names its imports so that they clash with no
// package-level name, those of the package's _test.go files included.
// Rpcgen refuses to generate a name the package already declares. The files
// it wrote earlier for other interfaces stay, and count as declaring their
// names. So separate runs, one //go:generate line per interface, cannot
// generate the same name twice. Each generated file records the interfaces
// it was generated for. Rpcgen refuses to replace it with one that lacks any
// of them, as a run for another type bound for the same file name would.
//
// On a problem rpcgen prints one line per problem, in the form
//
//	inventory.go:21: rpcgen: method Stock: first parameter must be context.Context, got string
//
// It then writes nothing and exits with status 1. A usage error exits with
// status 2.
//
// The generated code imports the dabb runtime packages github.com/dabbrpc/dabb
// and github.com/dabbrpc/dabb/proxy, and the packages of the messages. It
// stops compiling against a runtime too old for it. It imports only the
// codecs its services use. A service whose messages are all protobuf
// messages (their pointers have protoc-gen-go's ProtoReflect method) uses
// the protobuf codec github.com/dabbrpc/dabb/codec/proto, the client's
// default. A service with a plain Go type among its messages uses the JSON
// codec github.com/dabbrpc/dabb/codec/json, the one of dabb's that encodes
// such types; its client constructor says that the client needs
// proxy.WithCodec("json").
//
// # Build constraints
//
// The generated file builds exactly where the files declaring its interfaces
// do. It carries their build constraints, combined into one //go:build line:
// those of their //go:build lines (or // +build lines) and those their names
// imply (svc_linux.go builds only on Linux).
//
// An interface declared in a file with a build constraint may be declared
// again, for other builds, in other files. Take store_linux.go and
// store_windows.go, which go generate reads each under its own GOOS. Each
// declaration gets a file of its own: the default name of the generated
// file derives from the name of the file declaring the interface too. A
// _GOOS, _GOARCH or _GOOS_GOARCH suffix of that name stays last:
//
//	Store in store.go (no constraint)          store_dabb.go
//	Store in store_linux.go                    store_dabb_linux.go
//	Store in store_windows_amd64.go            store_dabb_windows_amd64.go
//	Store in store_unix.go (//go:build unix)   store_unix_dabb.go
//	Store in svc_linux.go                      store_svc_dabb_linux.go
//
// Older versions of rpcgen named these files <lowercase type>_dabb.go as
// well. A run without -output may find such a file in the build it loads,
// generated earlier for one of its interfaces under another name. It reports
// the file and writes nothing, so that the file is deleted rather than left
// to declare the same names twice.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"go/token"
	"io"
	"os"
	"slices"
	"strings"
	"unicode"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

const usageText = `usage: rpcgen -type T[,T...] [-output file] [-dir dir] [-tags tags]

rpcgen writes the dabb client stub and server glue for Go interfaces.
The manual: go doc github.com/dabbrpc/dabb/cmd/rpcgen

Flags:
`

// run is the command: it parses args, generates, writes the files and
// returns the exit status.
func run(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("rpcgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	typeNames := fs.String("type", "", "comma-separated list of interface names; required")
	output := fs.String("output", "", "output file name; default <dir>/<lowercase type>_dabb.go, one per type, with the source file's name in it when that file has a build constraint")
	dir := fs.String("dir", ".", "directory of the package to read")
	tags := fs.String("tags", "", "comma-separated list of build tags to apply")
	fs.Usage = func() {
		fmt.Fprint(stderr, usageText)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	usage := func(msg string) int {
		fmt.Fprintf(stderr, "rpcgen: %s\n", msg)
		fs.Usage()
		return 2
	}
	if fs.NArg() > 0 {
		return usage("unexpected arguments: " + strings.Join(fs.Args(), " "))
	}
	typeList, err := splitList(*typeNames)
	if err != nil {
		return usage(err.Error())
	}
	if len(typeList) == 0 {
		return usage("-type is required")
	}
	tagList, err := splitTags(*tags)
	if err != nil {
		return usage(err.Error())
	}

	files, err := generate(config{dir: *dir, types: typeList, tags: tagList}, *output)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if err := writeFiles(files); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

// splitList splits a comma-separated list of identifiers (the -type value),
// dropping duplicates and empty entries.
func splitList(s string) ([]string, error) {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !token.IsIdentifier(f) {
			return nil, fmt.Errorf("%q is not a Go identifier", f)
		}
		if !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	return out, nil
}

// splitTags splits a -tags value as the go command does, on commas or on
// spaces (its older form), and drops duplicates. It checks that each is a
// build tag: letters, digits, '_' and '.'.
func splitTags(s string) ([]string, error) {
	var out []string
	for _, tag := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || unicode.IsSpace(r) }) {
		if strings.IndexFunc(tag, func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) && r != '_' && r != '.' }) >= 0 {
			return nil, fmt.Errorf("-tags: %q is not a build tag (letters, digits, '_' and '.')", tag)
		}
		if !slices.Contains(out, tag) {
			out = append(out, tag)
		}
	}
	return out, nil
}

// writeFiles writes files, refusing up front to overwrite any file that
// rpcgen did not write, or wrote for interfaces the new content lacks (the
// output of another run). A file whose content is unchanged is left alone.
func writeFiles(files []outFile) error {
	var todo []outFile
	for _, f := range files {
		fi, err := os.Stat(f.path)
		switch {
		case errors.Is(err, os.ErrNotExist):
		case err != nil:
			return fmt.Errorf("rpcgen: %w", err)
		case !fi.Mode().IsRegular():
			// A device or pipe, such as /dev/stdout: just write.
		default:
			old, err := os.ReadFile(f.path)
			switch {
			case err != nil:
				return fmt.Errorf("rpcgen: %w", err)
			case bytes.Equal(old, f.src):
				continue
			case !isGenerated(old):
				return fmt.Errorf("rpcgen: refusing to overwrite %s: it was not written by rpcgen", f.path)
			}
			if lost := dropped(old, f.svcs); len(lost) > 0 {
				return fmt.Errorf("rpcgen: refusing to overwrite %s: it holds the code generated for %s, which this run (for %s) would drop; write one of them to another file with -output, or delete %s if that code is no longer wanted",
					f.path, strings.Join(lost, ", "), strings.Join(ifaceNames(f.svcs), ", "), f.path)
			}
		}
		todo = append(todo, f)
	}
	for _, f := range todo {
		if err := os.WriteFile(f.path, f.src, 0o644); err != nil {
			return fmt.Errorf("rpcgen: %w", err)
		}
	}
	return nil
}

// dropped returns the interfaces the generated file old was generated for
// that are not among svcs.
func dropped(old []byte, svcs []*service) []string {
	was, _ := headerInterfaces(old)
	now := ifaceNames(svcs)
	return slices.DeleteFunc(was, func(iface string) bool { return slices.Contains(now, iface) })
}

func ifaceNames(svcs []*service) []string {
	var names []string
	for _, s := range svcs {
		names = append(names, s.iface)
	}
	return names
}
