// Listing services: the service segment of every key under the prefix.

package etcd

import (
	"context"
	"fmt"
	"slices"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dabbrpc/dabb/registry"
)

var _ registry.Lister = (*Registry)(nil)

// Services implements registry.Lister: the services of the keys
// <prefix>/<service>/<id> under the prefix, read keys only. ctx bounds the
// call, as RequestTimeout does; an etcd that does not answer within it
// fails with ErrUnavailable. Keys of another shape are skipped.
func (r *Registry) Services(ctx context.Context) ([]string, error) {
	if r.isClosed() {
		return nil, fmt.Errorf("etcd: list services: %w", registry.ErrClosed)
	}
	ctx, cancel := r.callContext(ctx)
	defer cancel()
	root := r.cfg.Prefix + "/"
	resp, err := r.cli.Get(ctx, root, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		if ctx.Err() != nil {
			// No answer within the deadline: etcd is down or unreachable.
			return nil, fmt.Errorf("%w: list services under %s: %w", ErrUnavailable, r.cfg.Prefix, err)
		}
		return nil, fmt.Errorf("etcd: list services under %s: %w", r.cfg.Prefix, err)
	}
	names := make([]string, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		service, id, ok := strings.Cut(strings.TrimPrefix(string(kv.Key), root), "/")
		if !ok || registry.ValidateService(service) != nil || registry.ValidateID(id) != nil {
			continue
		}
		names = append(names, service)
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}
