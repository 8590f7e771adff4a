// The ls command: the services a registry holds, or one service's instances.

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/dabbrpc/dabb/health"
	"github.com/dabbrpc/dabb/registry"
)

var lsCommand = &command{
	name:    "ls",
	args:    "[SERVICE]",
	summary: "list the services in the registry, or the instances of SERVICE",
	help: `
Without SERVICE: one line per service that has instances, with their number.
With SERVICE: one line per instance, with its address, weight and metadata;
-health asks each instance whether it is serving SERVICE. With -health the
exit status is 1 when an instance listed is not serving or does not answer,
as with 'dabbctl health'.

On a Dubbo registry (zookeeper://): without SERVICE, one line per Dubbo
interface, group and version, with its number of providers. SERVICE is an
interface (its providers of every group and version) or a service key,
[group/]interface[:version]; one line per provider, with its address,
weight, group, version, application, release and serialization. -health
asks each provider with Dubbo's $echo.`,
	flags: func(a *app, fs *flag.FlagSet) func(context.Context, []string) error {
		withHealth := fs.Bool("health", false, "ask each instance of SERVICE for its health (serving, not serving, unknown)")
		timeout := fs.Duration("timeout", 5*time.Second, "bound on the registry's answers and, with -health, on each health check")
		return func(ctx context.Context, args []string) error {
			if *timeout <= 0 {
				return usagef("-timeout %v: want a positive duration", *timeout)
			}
			switch len(args) {
			case 0:
				if *withHealth {
					return usagef("-health needs a SERVICE (or use 'dabbctl health')")
				}
				if a.onDubbo() {
					return a.lsDubboServices(ctx, *timeout)
				}
				return a.lsServices(ctx, *timeout)
			case 1:
				return a.lsInstances(ctx, args[0], *withHealth, *timeout)
			}
			return usagef("want at most one SERVICE, got %d arguments", len(args))
		}
	},
}

// serviceCount is a line of ls without SERVICE.
type serviceCount struct {
	Service   string `json:"service"`
	Instances int    `json:"instances"`
}

func (a *app) lsServices(ctx context.Context, timeout time.Duration) error {
	counts, err := a.serviceCounts(ctx, timeout)
	if err != nil {
		return err
	}
	if a.json {
		for _, c := range counts {
			if err := writeJSON(a.stdout, c); err != nil {
				return err
			}
		}
		return nil
	}
	tw := newTable(a.stdout)
	fmt.Fprintln(tw, "SERVICE\tINSTANCES")
	for _, c := range counts {
		fmt.Fprintf(tw, "%s\t%d\n", c.Service, c.Instances)
	}
	return tw.Flush()
}

// listServices returns the services r holds, sorted.
func listServices(ctx context.Context, r registry.Registry) ([]string, error) {
	l, ok := r.(registry.Lister)
	if !ok {
		return nil, fmt.Errorf("this registry (%T) cannot list its services; name one", r)
	}
	services, err := l.Services(ctx)
	if err != nil {
		return nil, fmt.Errorf("list services: %w", err)
	}
	return services, nil
}

// serviceCounts opens the registry and returns each service it holds
// with its number of instances, within timeout.
func (a *app) serviceCounts(ctx context.Context, timeout time.Duration) ([]serviceCount, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	r, err := a.openRegistry(ctx)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	counts, err := countInstances(ctx, r)
	if err != nil {
		return nil, fmt.Errorf("ls: %w", err)
	}
	return counts, nil
}

// countInstances returns each service r holds with its number of
// instances; a service that lost its last one meanwhile is left out.
func countInstances(ctx context.Context, r registry.Registry) ([]serviceCount, error) {
	services, err := listServices(ctx, r)
	if err != nil {
		return nil, err
	}
	counts := make([]serviceCount, 0, len(services))
	for _, s := range services {
		set, err := instancesOf(ctx, r, s)
		if err != nil {
			return nil, err
		}
		if len(set) > 0 {
			counts = append(counts, serviceCount{s, len(set)})
		}
	}
	return counts, nil
}

// instancesOf returns the instances of service r lists now.
func instancesOf(ctx context.Context, r registry.Registry, service string) ([]registry.Instance, error) {
	w, err := r.Watch(ctx, service)
	if err != nil {
		return nil, fmt.Errorf("instances of %s: %w", service, err)
	}
	defer w.Stop()
	for {
		set, err := w.Next(ctx)
		if errors.Is(err, registry.ErrUnavailable) && ctx.Err() == nil {
			continue // an outage report; the next call answers once the registry does
		}
		if err != nil {
			return nil, fmt.Errorf("instances of %s: %w", service, err)
		}
		return set, nil
	}
}

func (a *app) lsInstances(ctx context.Context, service string, withHealth bool, timeout time.Duration) error {
	watched := service
	if a.onDubbo() {
		if err := checkDubboKey(service); err != nil {
			return err
		}
		watched = dubboWatchKey(service)
	} else if err := registry.ValidateService(service); err != nil {
		return usagef("%v", err)
	}
	lctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	r, err := a.openRegistry(lctx)
	if err != nil {
		return err
	}
	defer r.Close()
	set, err := instancesOf(lctx, r, watched)
	if err != nil {
		return fmt.Errorf("ls: %w", err)
	}
	var results []checkResult
	if withHealth {
		chk := a.newChecker(timeout)
		defer chk.close()
		results = chk.checkAll(ctx, set, func(registry.Instance) string { return service })
	}
	print := a.printInstances
	if a.onDubbo() {
		print = a.printDubboProviders
	}
	if err := print(service, set, withHealth, results); err != nil {
		return err
	}
	bad := 0
	for _, r := range results {
		if r.err != nil || r.status != health.Serving {
			bad++
		}
	}
	if bad > 0 {
		return fmt.Errorf("ls -health: %d of %d instances of %s not serving", bad, len(set), service)
	}
	return nil
}

// printInstances prints the instances of service, with withHealth their
// health: results, in the order of set.
func (a *app) printInstances(service string, set []registry.Instance, withHealth bool, results []checkResult) error {
	return a.printList(service, set, withHealth, results, listForm{
		noun:   "instances",
		header: "ADDRESS\tWEIGHT\tMETADATA",
		row: func(in registry.Instance) string {
			return fmt.Sprintf("%s\t%d\t%s", in.Addr, in.EffectiveWeight(), metadataText(in.Metadata))
		},
		line: func(in registry.Instance, r *checkResult) any {
			line := toJSON(in)
			if r != nil {
				line.Health, line.Error = r.text()
			}
			return line
		},
	})
}

// listForm is how ls prints one kind of instance: a table row and a JSON
// line each.
type listForm struct {
	noun   string // "instances", "providers": the word of the empty list's line
	header string // the table's columns, before HEALTH
	row    func(in registry.Instance) string
	// line is the JSON line of in; r is its health check, or nil.
	line func(in registry.Instance, r *checkResult) any
}

// printList prints set as f says, with withHealth the checks' results,
// in the order of set.
func (a *app) printList(service string, set []registry.Instance, withHealth bool, results []checkResult, f listForm) error {
	if a.json {
		for i, in := range set {
			var r *checkResult
			if withHealth {
				r = &results[i]
			}
			if err := writeJSON(a.stdout, f.line(in, r)); err != nil {
				return err
			}
		}
		return nil
	}
	if len(set) == 0 {
		fmt.Fprintf(a.stderr, "no %s of %s in the registry\n", f.noun, service)
		return nil
	}
	tw := newTable(a.stdout)
	header := f.header
	if withHealth {
		header += "\tHEALTH"
	}
	fmt.Fprintln(tw, header)
	for i, in := range set {
		fmt.Fprint(tw, f.row(in))
		if withHealth {
			fmt.Fprintf(tw, "\t%s", results[i].tableText())
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}
