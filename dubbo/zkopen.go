// Opening a Registry from a zookeeper:// URL, Dubbo's own form of a registry address.

package dubbo

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/dabbrpc/dabb/registry"
)

// openURL opens a Registry from a URL, for registry.Open:
//
//	zookeeper://HOST:PORT[?backup=HOST:PORT,...][&group=ROOT][&timeout=MS][&session=MS]
//
// The host, and backup's comma-separated list, name the servers. group is
// the root node, DefaultRoot by default. timeout and session are
// milliseconds: RegistryConfig.RequestTimeout and SessionTimeout. A path
// is refused: Dubbo names the root with group. Unknown or repeated
// parameters, and credentials, are errors. Like NewRegistry, it does no
// I/O; ctx is not used.
func openURL(_ context.Context, u *url.URL, oc registry.OpenConfig) (registry.Registry, error) {
	if u.User != nil {
		return nil, fmt.Errorf("dubbo: credentials in a zookeeper:// URL are not supported: %w", registry.ErrInvalid)
	}
	if u.Path != "" && u.Path != "/" {
		return nil, fmt.Errorf("dubbo: zookeeper:// takes no path (%q): name the root node with ?group=%s: %w",
			u.Path, strings.Trim(u.Path, "/"), registry.ErrInvalid)
	}
	cfg := RegistryConfig{Servers: registry.HostsOf(u), Logger: oc.Logger}
	if len(cfg.Servers) == 0 {
		return nil, fmt.Errorf("dubbo: the URL names no servers; want zookeeper://host:2181: %w", registry.ErrInvalid)
	}
	for key, vals := range u.Query() {
		if len(vals) != 1 {
			return nil, fmt.Errorf("dubbo: zookeeper:// parameter %s given %d times: %w", key, len(vals), registry.ErrInvalid)
		}
		v := vals[0]
		switch key {
		case "backup":
			for h := range strings.SplitSeq(v, ",") {
				if h = strings.TrimSpace(h); h != "" {
					cfg.Servers = append(cfg.Servers, h)
				}
			}
		case "group":
			if v == "" {
				return nil, fmt.Errorf("dubbo: zookeeper:// parameter group is empty; omit it for %s: %w", DefaultRoot, registry.ErrInvalid)
			}
			cfg.Root = v
		case "timeout", "session":
			ms, err := strconv.Atoi(v)
			if err != nil || ms <= 0 {
				return nil, fmt.Errorf("dubbo: zookeeper:// parameter %s=%q: want a positive number of milliseconds: %w", key, v, registry.ErrInvalid)
			}
			if key == "timeout" {
				cfg.RequestTimeout = time.Duration(ms) * time.Millisecond
			} else {
				cfg.SessionTimeout = time.Duration(ms) * time.Millisecond
			}
		default:
			return nil, fmt.Errorf("dubbo: unknown zookeeper:// parameter %q (known: backup, group, timeout, session): %w", key, registry.ErrInvalid)
		}
	}
	return NewRegistry(cfg)
}
