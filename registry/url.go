// Open and the scheme table: a Registry from a URL.

package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"path"
	"slices"
	"strings"
	"sync"
)

// DefaultPrefix is the root under which backends keep their instances when
// a URL or Config names none.
const DefaultPrefix = "/services"

// ErrUnknownScheme is wrapped by Open when no backend registered the URL's
// scheme; import the backend's package (see the message) and retry.
var ErrUnknownScheme = errors.New("registry: unknown scheme")

// OpenFunc opens a backend from a parsed URL. The URL's host holds the
// comma-separated server addresses, its path the root prefix (see
// [PrefixOf] and [HostsOf]). cfg holds what Open's options set.
type OpenFunc func(ctx context.Context, u *url.URL, cfg OpenConfig) (Registry, error)

// OpenConfig is what Open gives a backend besides the URL.
type OpenConfig struct {
	// Logger receives the backend's events: sessions, leases, watches.
	// Nil means slog.Default().
	Logger *slog.Logger
}

// OpenOption configures Open.
type OpenOption func(*OpenConfig)

// WithLogger makes the backend log through l. Default slog.Default().
func WithLogger(l *slog.Logger) OpenOption { return func(c *OpenConfig) { c.Logger = l } }

var (
	schemesMu sync.RWMutex
	schemes   = make(map[string]OpenFunc)
)

// knownSchemes names the package that registers each of dabb's schemes, for
// the error Open returns when that package is not linked in. zookeeper is
// Dubbo's own layout, registered by the dubbo module.
var knownSchemes = map[string]string{
	"etcd":      "github.com/dabbrpc/dabb/registry/etcd",
	"static":    "github.com/dabbrpc/dabb/registry/static",
	"zk":        "github.com/dabbrpc/dabb/registry/zk",
	"zookeeper": "github.com/dabbrpc/dabb/dubbo",
}

// RegisterScheme makes a backend available to [Open] under a URL scheme.
// Backends call it from an init function. It panics if open is nil or the
// scheme is empty or already registered.
func RegisterScheme(scheme string, open OpenFunc) {
	if scheme == "" {
		panic("registry: RegisterScheme with an empty scheme")
	}
	if open == nil {
		panic("registry: RegisterScheme(" + scheme + ") with a nil OpenFunc")
	}
	scheme = strings.ToLower(scheme)
	schemesMu.Lock()
	defer schemesMu.Unlock()
	if _, dup := schemes[scheme]; dup {
		panic("registry: RegisterScheme called twice for scheme " + scheme)
	}
	schemes[scheme] = open
}

// Open opens the backend a URL names:
//
//	zk://127.0.0.1:2181/services
//	etcd://h1:2379,h2:2379/services
//	static://127.0.0.1:20880,127.0.0.1:20881
//
// The scheme picks a backend, which must be linked in (for example
// import _ "github.com/dabbrpc/dabb/registry/etcd"); the host lists the
// servers, separated by commas; the path is the root prefix, [DefaultPrefix]
// when empty. Backends document the query parameters they accept.
// WithLogger gives the backend the application's logger.
func Open(ctx context.Context, rawURL string, opts ...OpenOption) (Registry, error) {
	if !strings.Contains(rawURL, "://") {
		return nil, fmt.Errorf("registry: open %q: no scheme; want a URL such as etcd://127.0.0.1:2379/services: %w", rawURL, ErrInvalid)
	}
	u, err := parseURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("registry: open: %w: %w", err, ErrInvalid)
	}
	if u.Scheme == "" {
		return nil, fmt.Errorf("registry: open %q: no scheme; want a URL such as etcd://127.0.0.1:2379/services: %w", rawURL, ErrInvalid)
	}
	scheme := strings.ToLower(u.Scheme)
	schemesMu.RLock()
	open := schemes[scheme]
	schemesMu.RUnlock()
	if open == nil {
		if pkg, ok := knownSchemes[scheme]; ok {
			return nil, fmt.Errorf("%w %q in %q: import _ %q to enable it", ErrUnknownScheme, scheme, rawURL, pkg)
		}
		return nil, fmt.Errorf("%w %q in %q (registered: %s)", ErrUnknownScheme, scheme, rawURL, strings.Join(Schemes(), ", "))
	}
	var cfg OpenConfig
	for _, o := range opts {
		o(&cfg)
	}
	r, err := open(ctx, u, cfg)
	if err != nil {
		return nil, fmt.Errorf("registry: open %s: %w", redact(u), err)
	}
	return r, nil
}

// parseURL parses a registry URL whose host may list several addresses.
// url.Parse takes such a list as one host, which fails as soon as one
// address is an IPv6 literal ("[::1]:2181,[::2]:2181"); the list is then
// checked address by address and set as the host after parsing the rest.
func parseURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err == nil {
		return u, nil
	}
	i := strings.Index(raw, "://")
	rest := raw[i+len("://"):]
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	auth := rest[:end]
	at := strings.LastIndex(auth, "@")
	hosts := auth[at+1:]
	if !strings.Contains(hosts, ",") {
		return nil, err
	}
	var list []string
	for h := range strings.SplitSeq(hosts, ",") {
		hu, herr := url.Parse("x://" + h)
		if herr != nil {
			return nil, herr
		}
		list = append(list, hu.Host) // unescaped, as url.Parse leaves a single host
	}
	u, perr := url.Parse(raw[:i+len("://")] + auth[:at+1] + "hosts" + rest[end:])
	if perr != nil {
		return nil, perr
	}
	u.Host = strings.Join(list, ",")
	return u, nil
}

// Schemes returns the registered schemes, sorted.
func Schemes() []string {
	schemesMu.RLock()
	defer schemesMu.RUnlock()
	out := make([]string, 0, len(schemes))
	for s := range schemes {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// HostsOf returns the comma-separated addresses in the URL's host, without
// empty entries.
func HostsOf(u *url.URL) []string {
	var hosts []string
	for h := range strings.SplitSeq(u.Host, ",") {
		if h = strings.TrimSpace(h); h != "" {
			hosts = append(hosts, h)
		}
	}
	return hosts
}

// PrefixOf returns the root prefix the URL's path names: cleaned, starting
// with '/', without a trailing '/'; [DefaultPrefix] when the path is empty
// or "/".
func PrefixOf(u *url.URL) string {
	return CleanPrefix(u.Path)
}

// CleanPrefix returns p cleaned, starting with '/' and without a trailing
// '/'; [DefaultPrefix] when p is empty or "/".
func CleanPrefix(p string) string {
	if p == "" {
		return DefaultPrefix
	}
	p = path.Clean("/" + p)
	if p == "/" {
		return DefaultPrefix
	}
	return p
}

// redact drops the password of a URL for error messages.
func redact(u *url.URL) string {
	return u.Redacted()
}
