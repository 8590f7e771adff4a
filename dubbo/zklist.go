// Listing Dubbo services: the service keys of the providers under the
// root, for tools that browse a registry.

package dubbo

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"

	"github.com/dabbrpc/dabb/registry"
	gozk "github.com/go-zookeeper/zk"
)

var _ registry.Lister = (*Registry)(nil)

// Services implements registry.Lister: the Dubbo service keys,
// [group/]interface[:version], of the providers under Root that a
// consumer could call (protocol dubbo, category providers, not
// enabled=false), sorted, once each. Override URLs are not applied here;
// Watch of a key applies them. A node whose name is no Dubbo URL is
// skipped. ctx bounds the call, as RequestTimeout does.
func (r *Registry) Services(ctx context.Context) ([]string, error) {
	rd, err := r.readerFor()
	if err != nil {
		return nil, fmt.Errorf("dubbo: list services: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
	defer cancel()
	type result struct {
		keys []string
		err  error
	}
	res := make(chan result, 1)
	if !rd.spawn(func() {
		if err := rd.waitSession(ctx); err != nil {
			res <- result{err: err}
			return
		}
		keys, err := r.listKeys(ctx, rd.conn)
		res <- result{keys, err}
	}) {
		return nil, fmt.Errorf("dubbo: list services: %w", registry.ErrClosed)
	}
	select {
	case out := <-res:
		if out.err != nil {
			return nil, fmt.Errorf("dubbo: list services: %w", out.err)
		}
		return out.keys, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("dubbo: list services: %w: %w", registry.ErrUnavailable, ctx.Err())
	}
}

// listKeys reads the interfaces under the root and the service keys of
// their providers. It stops early when ctx ends.
func (r *Registry) listKeys(ctx context.Context, conn *gozk.Conn) ([]string, error) {
	ifaces, _, err := conn.Children(r.cfg.Root)
	if errors.Is(err, gozk.ErrNoNode) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, iface := range ifaces {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		nodes, _, err := conn.Children(path.Join(r.servicePath(iface), categoryProviders))
		if errors.Is(err, gozk.ErrNoNode) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, n := range nodes {
			raw, err := zkDecode(n)
			if err != nil {
				continue
			}
			u, err := parseProviderURL(raw)
			if err != nil {
				continue
			}
			k := serviceKey{iface: iface, group: u.params[paramGroup], version: u.params[paramVersion]}
			if k.matches(u) {
				seen[k.String()] = true
			}
		}
	}
	keys := make([]string, 0, len(seen))
	for k := range seen {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys, nil
}

// String returns k as Dubbo writes a service key:
// [group/]interface[:version].
func (k serviceKey) String() string {
	s := k.iface
	if k.group != "" {
		s = k.group + "/" + s
	}
	if k.version != "" {
		s += ":" + k.version
	}
	return s
}

// SplitServiceKey splits a Dubbo service key, [group/]interface[:version]
// or interface:version:group, into its parts; an absent group or version
// is empty. It fails, wrapping registry.ErrInvalid, for a key with no
// interface or one that is no Java name.
func SplitServiceKey(key string) (iface, group, version string, err error) {
	k, err := parseServiceKey(key)
	if err != nil {
		return "", "", "", err
	}
	return k.iface, k.group, k.version, nil
}
