// Listing services: the children of the prefix that hold instances.

package zk

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/dabbrpc/dabb/registry"
	"github.com/go-zookeeper/zk"
)

var _ registry.Lister = (*Registry)(nil)

// Services implements registry.Lister: the children of the prefix that
// have at least one child. Service nodes are persistent, so a service whose
// instances all left still has a node; it is not listed. ctx bounds the
// call, as RequestTimeout does.
func (r *Registry) Services(ctx context.Context) ([]string, error) {
	ctx, cancel := r.bound(ctx)
	defer cancel()
	conn, err := r.session(ctx)
	if err != nil {
		return nil, fmt.Errorf("zk: list services: %w", err)
	}
	type result struct {
		names []string
		err   error
	}
	res := make(chan result, 1)
	// The client's calls take no context: they run on their own, and ctx
	// bounds the wait for them.
	if !r.spawn(func() {
		names, err := r.listServices(conn)
		res <- result{names, err}
	}) {
		return nil, fmt.Errorf("zk: list services: %w", registry.ErrClosed)
	}
	select {
	case got := <-res:
		if got.err != nil {
			return nil, fmt.Errorf("zk: list services under %s: %w", r.cfg.Prefix, got.err)
		}
		return got.names, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("zk: list services under %s: %w", r.cfg.Prefix, ctx.Err())
	}
}

// listServices reads the prefix's children and keeps those with children.
func (r *Registry) listServices(conn *zk.Conn) ([]string, error) {
	children, _, err := conn.Children(r.cfg.Prefix)
	if errors.Is(err, zk.ErrNoNode) {
		return []string{}, nil // nothing was ever registered here
	}
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(children))
	for _, c := range children {
		_, st, err := conn.Exists(r.servicePath(c))
		if err != nil {
			return nil, err
		}
		if st != nil && st.NumChildren > 0 {
			names = append(names, c)
		}
	}
	slices.Sort(names)
	return names, nil
}
