// The call command: one method called by name with a JSON request, its reply printed as JSON.

package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
)

var callCommand = &command{
	name:    "call",
	args:    "SERVICE.METHOD [JSON]",
	summary: "call a method with a JSON request and print the JSON reply",
	help: `
The request is the JSON argument, or -d: JSON text, @FILE, or @- for standard
input; {} when neither is given. The reply is printed indented (-o table) or
on one line (-o json). The call is made as a stub makes it (the method's
directives, retries, balancing), through the registry or to -addr; it needs
the server's reflection service. A failed call prints one line with its
status and exits 1.

-H key=value adds an attachment, here or before the command (the global -H,
which the describe call made first carries too); ${NAME} in the value is
replaced by the environment variable NAME (an unset one is an error), so
that secrets stay off the command line. Of a key given twice, the last wins:

  dabbctl -H 'authorization=Bearer ${TOKEN}' call inventory.Inventory.Stock '{"sku":"sku-42"}'

On a Dubbo registry (zookeeper://), SERVICE is a Java interface, and the call
is Dubbo's generic call ($invoke): a JSON array is the argument list, any
other JSON value the one argument, an object with a "class" key a POJO of
that class; no JSON, no argument. The parameter types are -types, else
inferred (string java.lang.String, integer long, fraction double, bool
boolean, array java.util.List, object its "class" or java.util.Map). The
result is printed as JSON (a POJO as an object with its "class"). An
exception the provider threw prints "CLASS: message" and exits 1:

  dabbctl -registry zookeeper://127.0.0.1:2181 call com.example.Greeter.sayHello '["world"]'
  dabbctl -registry zookeeper://127.0.0.1:2181 call -types long,int com.example.inventory.InventoryService.deduct '[10086, 1]'`,
	flags: func(a *app, fs *flag.FlagSet) func(context.Context, []string) error {
		data := fs.String("d", "", "the request `data`: JSON text, @FILE, or @- for standard input")
		fs.Var(&a.headers, "H", "an attachment `key=value`, repeatable, after the global -H values; ${NAME} in the value expands the environment variable NAME")
		timeout := fs.Duration("timeout", 0, "the call's budget; default the method's //dabb:timeout, or 1s")
		addr := fs.String("addr", "", "call the instance at `host:port` instead of those the registry lists")
		var dubboFlags dubboCallFlags
		fs.StringVar(&dubboFlags.types, "types", "", "Dubbo: the method's Java parameter `types`, comma-separated (java.lang.String,int); default inferred from the arguments")
		fs.StringVar(&dubboFlags.group, "group", "", "Dubbo: the service `group`")
		fs.StringVar(&dubboFlags.version, "version", "", "Dubbo: the service `version`")
		return func(ctx context.Context, args []string) error {
			if len(args) == 0 || len(args) > 2 {
				return usagef("want SERVICE.METHOD and at most one JSON request, got %d arguments", len(args))
			}
			service, method, ok := splitMethod(args[0])
			if !ok {
				return usagef("%q: want SERVICE.METHOD, such as inventory.Inventory.Stock", args[0])
			}
			dubboMode := a.onDubbo()
			if !dubboMode && (dubboFlags.types != "" || dubboFlags.group != "" || dubboFlags.version != "") {
				return usagef("-types, -group and -version are for a Dubbo registry (zookeeper://)")
			}
			if dubboMode {
				if err := checkDubboKey(service); err != nil {
					return err
				}
			} else if err := registry.ValidateService(service); err != nil {
				return usagef("%v", err)
			}
			if *timeout < 0 {
				return usagef("-timeout %v: want a positive duration", *timeout)
			}
			var literal *string
			if len(args) == 2 {
				literal = &args[1]
			}
			req, err := a.requestBody(literal, *data, fs)
			if err != nil {
				return err
			}
			if dubboMode {
				if literal == nil && !flagSet(fs, "d") {
					req = nil // no arguments
				}
				dubboFlags.timeout, dubboFlags.addr = *timeout, *addr
				return a.dubboCall(ctx, service, method, req, dubboFlags)
			}
			return a.call(ctx, service, method, req, *timeout, *addr)
		}
	},
}

// splitMethod splits SERVICE.METHOD (or SERVICE/METHOD) at its last
// separator.
func splitMethod(s string) (service, method string, ok bool) {
	i := strings.LastIndexByte(s, '/')
	if i < 0 {
		i = strings.LastIndexByte(s, '.')
	}
	if i <= 0 || i == len(s)-1 {
		return "", "", false
	}
	return s[:i], s[i+1:], true
}

// requestBody returns the request: the argument, or -d's, or {}.
func (a *app) requestBody(literal *string, data string, fs *flag.FlagSet) ([]byte, error) {
	dSet := flagSet(fs, "d")
	var body []byte
	switch {
	case literal != nil && dSet:
		return nil, usagef("give the request once: as an argument or with -d, not both")
	case literal != nil:
		body = []byte(*literal)
	case dSet && data == "@-":
		b, err := io.ReadAll(a.stdin)
		if err != nil {
			return nil, fmt.Errorf("read the request from standard input: %w", err)
		}
		body = b
	case dSet && strings.HasPrefix(data, "@"):
		b, err := os.ReadFile(data[1:])
		if err != nil {
			return nil, usagef("-d %s: %v", data, err)
		}
		body = b
	case dSet:
		body = []byte(data)
	default:
		body = []byte("{}")
	}
	if !json.Valid(body) {
		var v any
		err := json.Unmarshal(body, &v)
		if err == nil {
			err = fmt.Errorf("more than one JSON value")
		}
		return nil, usagef("the request is not valid JSON: %v", err)
	}
	return body, nil
}

func (a *app) call(ctx context.Context, service, method string, req []byte, timeout time.Duration, addr string) error {
	var opts []proxy.CallOption
	var copts []proxy.Option
	if timeout > 0 {
		copts = append(copts, proxy.WithTimeout(timeout))
		opts = append(opts, proxy.Timeout(timeout))
	}
	c, done, err := a.targetClient(ctx, addr, copts...)
	if err != nil {
		return err
	}
	defer done()
	reply, err := c.InvokeJSON(ctx, service, method, req, opts...)
	if err != nil {
		where := ""
		if addr != "" {
			where = " at " + addr
		}
		return fmt.Errorf("call %s.%s%s: %w", service, method, where, err)
	}
	return a.printJSONValue(reply)
}

// flagSet reports whether the flag name was given.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// headerFlag is -H: attachments, in order.
type headerFlag []string

func (h *headerFlag) String() string { return strings.Join(*h, ", ") }

func (h *headerFlag) Set(v string) error {
	key, _, ok := strings.Cut(v, "=")
	if !ok || strings.TrimSpace(key) == "" {
		return fmt.Errorf("%q: want key=value", v)
	}
	*h = append(*h, v)
	return nil
}

// envRef is ${NAME} in a -H value.
var envRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// callOptions returns the attachments, with ${NAME} expanded.
func (h headerFlag) callOptions() ([]proxy.CallOption, error) {
	var opts []proxy.CallOption
	for _, kv := range h {
		key, value, _ := strings.Cut(kv, "=")
		var missing string
		value = envRef.ReplaceAllStringFunc(value, func(ref string) string {
			name := envRef.FindStringSubmatch(ref)[1]
			v, ok := os.LookupEnv(name)
			if !ok && missing == "" {
				missing = name
			}
			return v
		})
		if missing != "" {
			return nil, usagef("-H %s: the environment variable %s is not set", key, missing)
		}
		opts = append(opts, proxy.Attachment(strings.TrimSpace(key), value))
	}
	return opts, nil
}
