// The watch command: a service's instances joining and leaving, as it happens.

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/dabbrpc/dabb/registry"
)

var watchCommand = &command{
	name:    "watch",
	args:    "SERVICE",
	summary: "print the instances of SERVICE joining and leaving, until interrupted",
	help: `
The first lines list the instances there are now ("listed"); then each change
prints one line: "join", "leave", or "update" (same instance, new address,
weight or metadata). When the registry cannot be reached, an "unavailable"
line says so; the changes missed meanwhile follow once it answers again.
Interrupt (Ctrl-C) to stop; the exit status is then 0. On a Dubbo registry
(zookeeper://), SERVICE is an interface (its providers of every group and
version) or a service key, [group/]interface[:version].`,
	flags: func(a *app, fs *flag.FlagSet) func(context.Context, []string) error {
		timeout := fs.Duration("timeout", 5*time.Second, "bound on the registry's first answer")
		return func(ctx context.Context, args []string) error {
			if len(args) != 1 {
				return usagef("want one SERVICE, got %d arguments", len(args))
			}
			service := args[0]
			if a.onDubbo() {
				if err := checkDubboKey(service); err != nil {
					return err
				}
				service = dubboWatchKey(service)
			} else if err := registry.ValidateService(service); err != nil {
				return usagef("%v", err)
			}
			if *timeout <= 0 {
				return usagef("-timeout %v: want a positive duration", *timeout)
			}
			return a.watch(ctx, service, *timeout)
		}
	},
}

// watchEvent is a line of watch -o json.
type watchEvent struct {
	Time     time.Time     `json:"time"`
	Event    string        `json:"event"` // listed, join, leave, update, unavailable
	Instance *instanceJSON `json:"instance,omitempty"`
	Error    string        `json:"error,omitempty"`
}

func (a *app) watch(ctx context.Context, service string, timeout time.Duration) error {
	octx, cancel := context.WithTimeout(ctx, timeout)
	r, err := a.openRegistry(octx)
	if err != nil {
		cancel()
		return err
	}
	defer r.Close()
	w, err := r.Watch(octx, service)
	cancel()
	if err != nil {
		return fmt.Errorf("watch %s: %w", service, err)
	}
	defer w.Stop()
	var prev map[string]registry.Instance // by ID; nil before the first set
	for {
		set, err := w.Next(ctx)
		if ctx.Err() != nil {
			return nil // interrupted: the end a watch is meant to have
		}
		if errors.Is(err, registry.ErrUnavailable) {
			if err := a.printEvent(watchEvent{Time: time.Now(), Event: "unavailable", Error: oneLine(err)}); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("watch %s: %w", service, err)
		}
		now := time.Now()
		cur := make(map[string]registry.Instance, len(set))
		for _, in := range set {
			cur[in.ID] = in
		}
		for _, in := range set { // sorted by ID
			old, had := prev[in.ID]
			ev := ""
			switch {
			case prev == nil:
				ev = "listed"
			case !had:
				ev = "join"
			case !sameInstance(old, in):
				ev = "update"
			}
			if ev != "" {
				if err := a.printEvent(watchEvent{Time: now, Event: ev, Instance: ptr(toJSON(in))}); err != nil {
					return err
				}
			}
		}
		for _, id := range slices.Sorted(maps.Keys(prev)) {
			if _, ok := cur[id]; !ok {
				if err := a.printEvent(watchEvent{Time: now, Event: "leave", Instance: ptr(toJSON(prev[id]))}); err != nil {
					return err
				}
			}
		}
		prev = cur
	}
}

func ptr[T any](v T) *T { return &v }

func sameInstance(x, y registry.Instance) bool {
	return x.Addr == y.Addr && x.EffectiveWeight() == y.EffectiveWeight() && maps.Equal(x.Metadata, y.Metadata)
}

// printEvent prints one event as a line.
func (a *app) printEvent(ev watchEvent) error {
	if a.json {
		return writeJSON(a.stdout, ev)
	}
	ts := ev.Time.Format("15:04:05.000")
	var err error
	if ev.Instance == nil {
		_, err = fmt.Fprintf(a.stdout, "%s  %-11s %s\n", ts, ev.Event, ev.Error)
		return err
	}
	in := ev.Instance
	id := ""
	if in.ID != in.Addr {
		id = " id=" + in.ID
	}
	md := ""
	if len(in.Metadata) > 0 {
		md = " " + metadataText(in.Metadata)
	}
	_, err = fmt.Fprintf(a.stdout, "%s  %-11s %s%s weight=%d%s\n", ts, ev.Event, in.Addr, id, in.Weight, md)
	return err
}
