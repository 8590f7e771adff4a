// etcd://host,host/prefix URLs: the scheme registry.Open knows etcd by.

package etcd

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"github.com/dabbrpc/dabb/registry"
)

func init() {
	registry.RegisterScheme("etcd", open)
}

// open serves etcd://host:port,host:port/prefix?ttl=10s&timeout=3s&dial_timeout=2s.
// User information in the URL (etcd://user:pass@host:port) authenticates.
func open(_ context.Context, u *url.URL, oc registry.OpenConfig) (registry.Registry, error) {
	cfg := Config{Endpoints: registry.HostsOf(u), Prefix: registry.PrefixOf(u), Logger: oc.Logger}
	if len(cfg.Endpoints) == 0 {
		return nil, fmt.Errorf("etcd: URL has no endpoints (want etcd://host:port,host:port/prefix): %w", registry.ErrInvalid)
	}
	if u.User != nil {
		cfg.Username = u.User.Username()
		cfg.Password, _ = u.User.Password()
	}
	for name, vals := range u.Query() {
		var dst *time.Duration
		switch name {
		case "ttl":
			dst = &cfg.TTL
		case "timeout":
			dst = &cfg.RequestTimeout
		case "dial_timeout":
			dst = &cfg.DialTimeout
		default:
			return nil, fmt.Errorf("etcd: URL has an unknown parameter %q (known: ttl, timeout, dial_timeout): %w", name, registry.ErrInvalid)
		}
		d, err := time.ParseDuration(vals[len(vals)-1])
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("etcd: URL parameter %s=%q: want a positive duration such as 10s: %w", name, vals[len(vals)-1], registry.ErrInvalid)
		}
		*dst = d
	}
	return New(cfg)
}
