// The health command, and the health checks ls -health makes too.

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/dabbrpc/dabb/health"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
)

var healthCommand = &command{
	name:    "health",
	args:    "[SERVICE]",
	summary: "ask instances whether they are serving: SERVICE's, or every service's",
	help: `
One line per service and instance: serving, not serving (shutting down, or
turned off by the application), unknown (the instance has no such service),
or error and why (the instance did not answer). Without SERVICE: every
service of every instance the registry lists. With -addr: that one instance,
asked about SERVICE, or about the server as a whole without SERVICE.
The exit status is 0 when every line says serving, 1 otherwise.
A dabb server answers a health check without the credentials its calls
need, unless it was built with dabb.WithHealthCredentials(true): give them
then with the global -H. On a Dubbo registry (zookeeper://), each provider
is asked with Dubbo's $echo, and SERVICE is a service key,
[group/]interface[:version].`,
	flags: func(a *app, fs *flag.FlagSet) func(context.Context, []string) error {
		addr := fs.String("addr", "", "ask the instance at `host:port` instead of those the registry lists")
		timeout := fs.Duration("timeout", 5*time.Second, "bound on the registry's answers and on each health check")
		return func(ctx context.Context, args []string) error {
			if len(args) > 1 {
				return usagef("want at most one SERVICE, got %d arguments", len(args))
			}
			if *timeout <= 0 {
				return usagef("-timeout %v: want a positive duration", *timeout)
			}
			service := ""
			if len(args) == 1 {
				service = args[0]
				if a.onDubbo() {
					if err := checkDubboKey(service); err != nil {
						return err
					}
				} else if err := registry.ValidateService(service); err != nil {
					return usagef("%v", err)
				}
			} else if a.onDubbo() && *addr != "" {
				return usagef("-addr on a Dubbo registry needs a SERVICE to ask with $echo")
			}
			return a.health(ctx, service, *addr, *timeout)
		}
	},
}

// healthLine is a line of health -o json.
type healthLine struct {
	Service string `json:"service"`
	Addr    string `json:"addr"`
	Status  string `json:"status"`
	Error   string `json:"error,omitempty"`
}

func (a *app) health(ctx context.Context, service, addr string, timeout time.Duration) error {
	var targets []registry.Instance // Service: the one to ask about
	if addr != "" {
		if err := (registry.Instance{Service: "any", ID: "any", Addr: addr}).Validate(); err != nil {
			return usagef("-addr %q: want host:port", addr)
		}
		targets = []registry.Instance{{Service: service, Addr: addr}}
	} else {
		lctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		r, err := a.openRegistry(lctx)
		if err != nil {
			return err
		}
		defer r.Close()
		services := []string{service}
		if service == "" {
			if services, err = listServices(lctx, r); err != nil {
				return fmt.Errorf("health: %w", err)
			}
		}
		for _, s := range services {
			set, err := instancesOf(lctx, r, s)
			if err != nil {
				return fmt.Errorf("health: %w", err)
			}
			targets = append(targets, set...)
		}
		if len(targets) == 0 {
			if service == "" {
				return fmt.Errorf("health: the registry lists no instances")
			}
			return fmt.Errorf("health: no instances of %s in the registry", service)
		}
	}
	chk := a.newChecker(timeout)
	defer chk.close()
	results := chk.checkAll(ctx, targets, func(in registry.Instance) string { return in.Service })
	bad := 0
	tw := newTable(a.stdout)
	if !a.json {
		fmt.Fprintln(tw, "SERVICE\tADDRESS\tSTATUS")
	}
	for i, in := range targets {
		r := results[i]
		if r.err != nil || r.status != health.Serving {
			bad++
		}
		name := in.Service
		if name == "" {
			name = "(server)"
		}
		if a.json {
			status, why := r.text()
			if err := writeJSON(a.stdout, healthLine{Service: in.Service, Addr: in.Addr, Status: status, Error: why}); err != nil {
				return err
			}
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", name, in.Addr, r.tableText())
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if bad > 0 {
		return fmt.Errorf("health: %d of %d not serving", bad, len(targets))
	}
	return nil
}

// checker asks instances for their health, one client per address.
type checker struct {
	a       *app
	timeout time.Duration

	mu      sync.Mutex // guards following
	clients map[string]*proxy.Client
	closers []func()
}

func (a *app) newChecker(timeout time.Duration) *checker {
	return &checker{a: a, timeout: timeout, clients: map[string]*proxy.Client{}}
}

// checkResult is one health check's outcome: a status, or the error that
// kept the instance from answering.
type checkResult struct {
	status health.Status
	err    error
}

// text returns the status and, for a failed check, why.
func (r checkResult) text() (status, why string) {
	if r.err != nil {
		return "error", oneLine(r.err)
	}
	return string(r.status), ""
}

func (r checkResult) tableText() string {
	status, why := r.text()
	if why != "" {
		return status + ": " + why
	}
	return status
}

// maxChecks bounds the health checks in flight at once.
const maxChecks = 16

// checkAll checks every instance, at most maxChecks at once, about the
// service about returns for it; results are in the order of ins.
func (c *checker) checkAll(ctx context.Context, ins []registry.Instance, about func(registry.Instance) string) []checkResult {
	results := make([]checkResult, len(ins))
	sem := make(chan struct{}, maxChecks)
	var wg sync.WaitGroup
	for i, in := range ins {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			results[i] = c.check(ctx, in, about(in))
		})
	}
	wg.Wait()
	return results
}

// check asks one instance about service ("" for the server as a whole).
func (c *checker) check(ctx context.Context, in registry.Instance, service string) checkResult {
	cl, err := c.client(in)
	if err != nil {
		return checkResult{err: err}
	}
	if c.a.onDubbo() {
		return c.echo(ctx, cl, in)
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var reply health.CheckReply
	err = cl.Invoke(ctx, health.ServiceName, health.MethodCheck, &health.CheckRequest{Service: service}, &reply, proxy.Timeout(c.timeout))
	if err != nil {
		if errors.Is(err, proxy.ErrNotSent) && strings.Contains(err.Error(), "shutting down") {
			// The server refused the check unsent because it drains:
			// what its health service would say, could it answer.
			return checkResult{status: health.NotServing}
		}
		return checkResult{err: fmt.Errorf("%s/%s at %s: %w", health.ServiceName, health.MethodCheck, in.Addr, err)}
	}
	switch reply.Status {
	case health.Serving, health.NotServing, health.Unknown:
		return checkResult{status: reply.Status}
	}
	return checkResult{err: fmt.Errorf("%s at %s answered status %q, which is none of serving, not serving and unknown", health.ServiceName, in.Addr, reply.Status)}
}

// client returns the client of in's address, made on first use.
func (c *checker) client(in registry.Instance) (*proxy.Client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cl, ok := c.clients[in.Addr]; ok {
		return cl, nil
	}
	cl, closeFn, err := c.a.instanceClient(in, proxy.WithCodec("json"))
	if err != nil {
		return nil, err
	}
	c.clients[in.Addr] = cl
	c.closers = append(c.closers, closeFn)
	return cl, nil
}

func (c *checker) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, f := range c.closers {
		f()
	}
	c.closers = nil
}
