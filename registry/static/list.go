// Listing services: those registered by name.

package static

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/dabbrpc/dabb/registry"
)

var _ registry.Lister = (*Registry)(nil)

// Services implements registry.Lister: the services registered by name
// (with New or Register) that have an instance. Instances given without a
// Service belong to every service and name none, so a registry opened
// from static://host:port lists no service.
func (r *Registry) Services(ctx context.Context) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("static: list services: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, registry.ErrClosed
	}
	return slices.Sorted(maps.Keys(r.services)), nil
}
