// Opening a Registry from a zk:// URL.

package zk

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"github.com/dabbrpc/dabb/registry"
)

func init() { registry.RegisterScheme("zk", openURL) }

// openURL opens a Registry from a URL, for registry.Open:
//
//	zk://h1:2181,h2:2181/services?session_timeout=10s&request_timeout=3s
//
// The host lists the servers, the path is the prefix (registry.PrefixOf).
// Query parameters: session_timeout and request_timeout, as Go durations
// (Config.SessionTimeout and Config.RequestTimeout). Unknown parameters and
// credentials in the URL are errors. Like New, it does no I/O; ctx is
// not used.
func openURL(_ context.Context, u *url.URL, oc registry.OpenConfig) (registry.Registry, error) {
	if u.User != nil {
		return nil, fmt.Errorf("zk: credentials in the URL are not supported: %w", registry.ErrInvalid)
	}
	cfg := Config{Servers: registry.HostsOf(u), Prefix: registry.PrefixOf(u), Logger: oc.Logger}
	if len(cfg.Servers) == 0 {
		return nil, fmt.Errorf("zk: the URL names no servers; want zk://host:2181/services: %w", registry.ErrInvalid)
	}
	for key, vals := range u.Query() {
		var dst *time.Duration
		switch key {
		case "session_timeout":
			dst = &cfg.SessionTimeout
		case "request_timeout":
			dst = &cfg.RequestTimeout
		default:
			return nil, fmt.Errorf("zk: unknown URL parameter %q (known: session_timeout, request_timeout): %w", key, registry.ErrInvalid)
		}
		if len(vals) != 1 {
			return nil, fmt.Errorf("zk: URL parameter %s given %d times: %w", key, len(vals), registry.ErrInvalid)
		}
		d, err := time.ParseDuration(vals[0])
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("zk: URL parameter %s=%q: want a positive duration such as 10s: %w", key, vals[0], registry.ErrInvalid)
		}
		*dst = d
	}
	return New(cfg)
}
