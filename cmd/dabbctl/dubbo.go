// Dabbctl on a Dubbo registry (zookeeper://): ls, watch, ls -health and
// call, with Dubbo's service keys, $echo and the generic call.

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/dabbrpc/dabb/dubbo"
	"github.com/dabbrpc/dabb/health"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
)

// dubboScheme is the scheme of a registry in Dubbo's layout.
const dubboScheme = "zookeeper://"

// onDubbo reports whether -registry is a Dubbo registry: the commands
// then speak Dubbo (service keys, $echo, the generic call).
func (a *app) onDubbo() bool { return strings.HasPrefix(a.registryURL, dubboScheme) }

// checkDubboKey checks a SERVICE argument on a Dubbo registry: a service
// key, [group/]interface[:version].
func checkDubboKey(key string) error {
	if _, _, _, err := dubbo.SplitServiceKey(key); err != nil {
		return usagef("%v", err)
	}
	return nil
}

// dubboService is a line of ls without SERVICE on a Dubbo registry.
type dubboService struct {
	Interface string `json:"interface"`
	Group     string `json:"group,omitempty"`
	Version   string `json:"version,omitempty"`
	Providers int    `json:"providers"`
}

// lsDubboServices lists the Dubbo interfaces, each group and version on
// a line of its own, with their number of providers.
func (a *app) lsDubboServices(ctx context.Context, timeout time.Duration) error {
	counts, err := a.serviceCounts(ctx, timeout)
	if err != nil {
		return err
	}
	lines := make([]dubboService, 0, len(counts))
	for _, c := range counts {
		iface, group, version, err := dubbo.SplitServiceKey(c.Service)
		if err != nil {
			return fmt.Errorf("ls: %w", err)
		}
		lines = append(lines, dubboService{iface, group, version, c.Instances})
	}
	if a.json {
		for _, l := range lines {
			if err := writeJSON(a.stdout, l); err != nil {
				return err
			}
		}
		return nil
	}
	tw := newTable(a.stdout)
	fmt.Fprintln(tw, "INTERFACE\tGROUP\tVERSION\tPROVIDERS")
	for _, l := range lines {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\n", l.Interface, dash(l.Group), dash(l.Version), l.Providers)
	}
	return tw.Flush()
}

// dash returns s, or "-" for none.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// dubboWatchKey is the key ls and watch follow for a SERVICE argument: a
// bare interface means its providers of every group and version.
func dubboWatchKey(service string) string {
	if strings.ContainsAny(service, "/:") {
		return service
	}
	return "*/" + service + ":*"
}

// dubboProvider is a line of ls SERVICE on a Dubbo registry.
type dubboProvider struct {
	Addr          string `json:"addr"`
	Weight        int    `json:"weight"`
	Group         string `json:"group,omitempty"`
	Version       string `json:"version,omitempty"`
	Application   string `json:"application,omitempty"`
	Release       string `json:"release,omitempty"`
	Serialization string `json:"serialization,omitempty"`
	Health        string `json:"health,omitempty"`
	Error         string `json:"error,omitempty"`
}

func toDubboProvider(in registry.Instance) dubboProvider {
	md := in.Metadata
	return dubboProvider{Addr: in.Addr, Weight: in.EffectiveWeight(), Group: md["group"], Version: md["version"],
		Application: md["application"], Release: md["release"], Serialization: md["serialization"]}
}

// printDubboProviders prints the providers of service, with withHealth
// the answers to $echo: results, in the order of set.
func (a *app) printDubboProviders(service string, set []registry.Instance, withHealth bool, results []checkResult) error {
	return a.printList(service, set, withHealth, results, listForm{
		noun:   "providers",
		header: "ADDRESS\tWEIGHT\tGROUP\tVERSION\tAPPLICATION\tRELEASE\tSERIALIZATION",
		row: func(in registry.Instance) string {
			p := toDubboProvider(in)
			return fmt.Sprintf("%s\t%d\t%s\t%s\t%s\t%s\t%s", p.Addr, p.Weight, dash(p.Group), dash(p.Version),
				dash(p.Application), dash(p.Release), dash(p.Serialization))
		},
		line: func(in registry.Instance, r *checkResult) any {
			line := toDubboProvider(in)
			if r != nil {
				line.Health, line.Error = r.text()
			}
			return line
		},
	})
}

// echoKey is the service key of a provider's instance: its interface,
// group and version.
func echoKey(in registry.Instance) string {
	iface, group, version, _ := dubbo.SplitServiceKey(in.Service)
	if md := in.Metadata; md != nil {
		// A provider the registry listed: its own URL's parameters, as
		// a key with "*" does not say them.
		group, version = md["group"], md["version"]
		if md["interface"] != "" {
			iface = md["interface"]
		}
	}
	key := iface
	if group != "" {
		key = group + "/" + key
	}
	if version != "" {
		key += ":" + version
	}
	return key
}

// echo asks one provider with Dubbo's $echo: serving when it answers.
func (c *checker) echo(ctx context.Context, cl *proxy.Client, in registry.Instance) checkResult {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	if err := dubbo.Echo(ctx, cl, echoKey(in), proxy.Timeout(c.timeout)); err != nil {
		return checkResult{err: fmt.Errorf("%s at %s: %w", dubbo.MethodEcho, in.Addr, err)}
	}
	return checkResult{status: health.Serving}
}

// thrownError is a Java exception a Dubbo provider threw: dabbctl prints
// it as "CLASS: message" alone.
type thrownError struct{ exc *dubbo.Exception }

func (e *thrownError) Error() string { return e.exc.Error() }

// dubboCall calls a Dubbo provider's method with the generic call and
// prints the result as JSON.
func (a *app) dubboCall(ctx context.Context, service, method string, body []byte, o dubboCallFlags) error {
	args, err := dubboArgs(body)
	if err != nil {
		return err
	}
	var types []string
	if o.types != "" {
		for _, t := range strings.Split(o.types, ",") {
			types = append(types, strings.TrimSpace(t))
		}
		if len(types) != len(args) {
			return usagef("-types names %d types for %d arguments", len(types), len(args))
		}
	}
	key := service
	if o.group != "" {
		key = o.group + "/" + key
	}
	if o.version != "" {
		key += ":" + o.version
	}
	if err := checkDubboKey(key); err != nil {
		return err
	}
	var opts []proxy.CallOption
	var copts []proxy.Option
	if o.timeout > 0 {
		copts = append(copts, proxy.WithTimeout(o.timeout))
		opts = append(opts, proxy.Timeout(o.timeout))
	}
	c, done, err := a.targetClient(ctx, o.addr, copts...)
	if err != nil {
		return err
	}
	defer done()
	v, err := dubbo.Invoke(ctx, c, key, method, types, args, opts...)
	if err != nil {
		var exc *dubbo.Exception
		if errors.As(err, &exc) && !errors.Is(err, dubbo.ErrNoSuchMethod) {
			return &thrownError{exc}
		}
		if errors.Is(err, dubbo.ErrOverloaded) {
			return fmt.Errorf("call %s.%s: %w (with -types)", key, method, err)
		}
		return fmt.Errorf("call %s.%s: %w", key, method, err)
	}
	out, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("call %s.%s: print the result as JSON: %w", key, method, err)
	}
	return a.printJSONValue(out)
}

// dubboCallFlags are call's flags for a Dubbo provider.
type dubboCallFlags struct {
	types, group, version, addr string
	timeout                     time.Duration
}

// dubboArgs reads call's JSON: an array is the argument list, any other
// value the one argument (an object with a "class" key a POJO of that
// class); none, no argument. Numbers keep their text (json.Number), so an
// integer stays exact.
func dubboArgs(body []byte) ([]any, error) {
	if body == nil {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, usagef("the arguments are not valid JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, usagef("the arguments are more than one JSON value; give a JSON array of them")
	}
	if list, ok := v.([]any); ok {
		return list, nil
	}
	return []any{v}, nil
}
