// Package registry defines how dabb servers publish their instances and how
// clients find them.
//
// A [Registry] is one backend: ZooKeeper (registry/zk), etcd (registry/etcd)
// or a fixed list (registry/static). Servers call [Registry.Register] once
// they listen and [Registry.Deregister] before they drain; clients call
// [Registry.Watch] and receive the full current set of instances of a
// service each time it changes.
//
// The layout is the same in every backend that has one:
//
//	/services/<service>/<instance-id>   the Instance as JSON
//
// Implementations live in subpackages, which import this package; this
// package imports none of them.
package registry

import (
	"context"
	"errors"
)

// Instance is one running copy of a service that can be called.
type Instance struct {
	// Service is the name clients look up, e.g. "inventory.Inventory".
	Service string `json:"service"`
	// ID is unique among the instances of one service; it names the node
	// or key of the instance in the registry.
	ID string `json:"id"`
	// Addr is host:port where the instance listens.
	Addr string `json:"addr"`
	// Weight is the relative share of calls the instance should take;
	// zero or less means the default, 100.
	Weight int `json:"weight,omitempty"`
	// Metadata carries free-form labels such as "version" or "zone".
	Metadata map[string]string `json:"metadata,omitempty"`
}

// DefaultWeight is the weight of an instance that does not set one.
const DefaultWeight = 100

// EffectiveWeight returns the instance's weight, or DefaultWeight when it
// sets none.
func (in Instance) EffectiveWeight() int {
	if in.Weight <= 0 {
		return DefaultWeight
	}
	return in.Weight
}

// Registry is a service registry backend.
//
// Every method honours its context's deadline: a registry that is down makes
// calls fail with an error, never block past the deadline.
type Registry interface {
	// Register publishes the instance. It stays registered across
	// session or lease loss until Deregister or Close: the backend
	// re-creates it on its own.
	Register(ctx context.Context, in Instance) error
	// Deregister removes the instance.
	Deregister(ctx context.Context, in Instance) error
	// Watch starts following the instances of one service.
	Watch(ctx context.Context, service string) (Watcher, error)
	// Close deregisters what this registry registered and releases its
	// connections.
	Close() error
}

// Reachability is an optional interface of a Registry whose client keeps
// a connection or session to the registry. It knows, without asking the
// registry, whether it can reach it. A [Cache] whose first lookup got no
// answer within InitialTimeout asks it, so that its error tells an
// unreachable registry from a slow one. registry/zk and registry/etcd
// implement it.
type Reachability interface {
	// Unreachable returns an error wrapping ErrUnavailable, naming the
	// registry's addresses, when the client cannot reach the registry
	// now. It returns nil when it is connected or cannot tell. It does no
	// I/O and returns at once.
	Unreachable() error
}

// Watcher follows the instances of one service.
type Watcher interface {
	// Next blocks until the set of instances differs from the one it
	// last returned (the first call returns the current set at once),
	// then returns the full set. It returns ctx.Err() when ctx ends and
	// ErrWatcherStopped after Stop. When the backend loses the registry
	// (etcd: the connection; zk: the session) it returns an error
	// wrapping ErrUnavailable once: that is how a Cache learns that its
	// instances are stale. The call after that returns the full set once
	// the registry answers again.
	//
	// The set is a new slice at each call, sorted by ID (then Addr), and
	// the caller's to keep or change. The Metadata maps in it may be shared
	// with the watcher and with the sets it returned before: read them,
	// never write them.
	Next(ctx context.Context) ([]Instance, error)
	// Stop ends the watch; a Next blocked in another goroutine returns.
	Stop()
}

// ErrWatcherStopped is returned by Watcher.Next after Stop.
var ErrWatcherStopped = errors.New("registry: watcher stopped")

// ErrClosed is returned by the methods of a Registry after Close.
var ErrClosed = errors.New("registry: closed")
