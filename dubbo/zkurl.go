// Dubbo's provider URLs: the form Java writes into ZooKeeper, built, encoded, decoded and matched.

package dubbo

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/dabbrpc/dabb/registry"
)

// The URL parameters of a provider that the registry writes or reads.
const (
	paramInterface = "interface"
	paramVersion   = "version"
	paramGroup     = "group"
	paramCategory  = "category"
	paramEnabled   = "enabled"
	paramWeight    = "weight"
	paramDisabled  = "disabled"

	categoryProviders = "providers"
	protocolDubbo     = "dubbo"
)

// providerURL is a Dubbo URL as Java's org.apache.dubbo.common.URL holds it:
// protocol://host:port/path?params.
type providerURL struct {
	protocol string
	addr     string // host:port
	path     string // without the leading '/'
	params   map[string]string
}

// fullString writes the URL as Java's URL.toFullString does: the parameters
// sorted by key, values as they are (not escaped).
func (u providerURL) fullString() string {
	var b strings.Builder
	b.WriteString(u.protocol)
	b.WriteString("://")
	b.WriteString(u.addr)
	b.WriteString("/")
	b.WriteString(u.path)
	keys := make([]string, 0, len(u.params))
	for k := range u.params {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		if i == 0 {
			b.WriteByte('?')
		} else {
			b.WriteByte('&')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(u.params[k])
	}
	return b.String()
}

// serviceInterface returns the interface the URL names: its interface
// parameter, else its path, as Java's URL.getServiceInterface.
func (u providerURL) serviceInterface() string {
	if s := u.params[paramInterface]; s != "" {
		return s
	}
	return u.path
}

// zkEncode escapes s as Java's URLEncoder.encode(s, "UTF-8") does, the
// encoding of Dubbo's node names: letters, digits and ".-*_" stay, a space
// becomes '+', every other byte of the UTF-8 form becomes %XX (upper case).
func zkEncode(s string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(s) + len(s)/2)
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9',
			c == '.', c == '-', c == '*', c == '_':
			b.WriteByte(c)
		case c == ' ':
			b.WriteByte('+')
		default:
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		}
	}
	return b.String()
}

// zkDecode undoes zkEncode, as Java's URLDecoder.decode: '+' is a space.
func zkDecode(s string) (string, error) {
	return url.QueryUnescape(s)
}

// parseProviderURL parses a decoded node name as Java's URL.valueOf does:
// the parameters are split at '&' and at each part's first '=', their
// values kept as they are; a part without '=' is a key whose value is
// itself.
func parseProviderURL(s string) (providerURL, error) {
	var u providerURL
	i := strings.Index(s, "://")
	if i <= 0 {
		return u, fmt.Errorf("no protocol in %q", s)
	}
	u.protocol, s = s[:i], s[i+len("://"):]
	query := ""
	if q := strings.IndexByte(s, '?'); q >= 0 {
		s, query = s[:q], s[q+1:]
	}
	if p := strings.IndexByte(s, '/'); p >= 0 {
		s, u.path = s[:p], s[p+1:]
	}
	if at := strings.LastIndexByte(s, '@'); at >= 0 {
		s = s[at+1:] // credentials are not the address
	}
	if _, _, err := splitAddr(s); err != nil {
		return u, fmt.Errorf("address %q: %w", s, err)
	}
	u.addr = s
	u.params = make(map[string]string)
	for part := range strings.SplitSeq(query, "&") {
		if part == "" {
			continue
		}
		k, v, ok := strings.Cut(part, "=")
		if !ok {
			v = k
		}
		if k != "" {
			u.params[k] = v
		}
	}
	return u, nil
}

// splitAddr splits a URL's address into host and port; the port is 0
// when the address has none, as in Java's URL.
func splitAddr(addr string) (string, int, error) {
	if addr == "" {
		return "", 0, errors.New("empty")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		if strings.Contains(err.Error(), "missing port") {
			return strings.Trim(addr, "[]"), 0, nil
		}
		return "", 0, err
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return "", 0, fmt.Errorf("port %q", port)
	}
	return host, n, nil
}

// serviceKey is what a consumer asks for: Dubbo's service key
// [group/]interface[:version].
type serviceKey struct {
	iface, group, version string
}

// parseServiceKey splits a service key such as
// "g1/com.example.Greeter:1.0.0", or one in Dubbo's colon-separated form
// interface:version:group (Java's URL.getColonSeparatedKey), such as
// "com.example.Greeter:1.0.0:g1" or "com.example.Greeter::g1".
func parseServiceKey(key string) (serviceKey, error) {
	var k serviceKey
	rest := key
	if parts := strings.Split(key, ":"); len(parts) == 3 && !strings.Contains(key, "/") {
		// The colon form names no '/', so it passes registry.Cache's
		// check of service names: proxy.Client calls by it.
		k.iface, k.version, k.group = parts[0], parts[1], parts[2]
		rest = ""
	}
	if g, r, ok := strings.Cut(rest, "/"); ok {
		k.group, rest = g, r
	}
	if i := strings.LastIndexByte(rest, ':'); i >= 0 {
		rest, k.version = rest[:i], rest[i+1:]
	}
	if k.iface == "" {
		k.iface = rest
	}
	switch {
	case k.iface == "":
		return k, fmt.Errorf("%w Dubbo service key %q: no interface; want [group/]interface[:version]", registry.ErrInvalid, key)
	case strings.ContainsAny(k.iface, "/ \t\r\n"):
		return k, fmt.Errorf("%w Dubbo service key %q: interface %q is not a Java interface name", registry.ErrInvalid, key, k.iface)
	}
	return k, nil
}

// colonKey returns k in the colon-separated form when it has a group
// (interface:version:group), else as interface[:version].
func (k serviceKey) colonKey() string {
	switch {
	case k.group != "":
		return k.iface + ":" + k.version + ":" + k.group
	case k.version != "":
		return k.iface + ":" + k.version
	}
	return k.iface
}

// matches reports whether Java's UrlUtils.isMatch would let a consumer of
// k see u, and whether u is a provider dabb can call: the same interface
// (or "*" on either side), category providers (the default), not
// enabled=false, the group among k's comma-separated groups (or k's group
// "*"), the same version (or k's "*"), and protocol dubbo. An empty group
// or version matches only an empty one, as Java's null does.
func (k serviceKey) matches(u providerURL) bool {
	iface := u.serviceInterface()
	if k.iface != "*" && iface != "*" && iface != k.iface {
		return false
	}
	if c := u.params[paramCategory]; c != "" && c != categoryProviders {
		return false
	}
	if strings.EqualFold(u.params[paramEnabled], "false") {
		return false
	}
	if u.protocol != protocolDubbo {
		return false
	}
	group := u.params[paramGroup]
	if k.group != "*" && k.group != group && !slices.Contains(strings.Split(k.group, ","), group) {
		return false
	}
	return k.version == "*" || k.version == u.params[paramVersion]
}

// providerInstance makes the instance a consumer of service (the key it
// asked for) sees for u, found in the node named node: the node name is
// the ID, u's weight the weight, its other parameters the metadata.
func providerInstance(service, node string, u providerURL) registry.Instance {
	in := registry.Instance{Service: service, ID: node, Addr: u.addr}
	md := make(map[string]string, len(u.params))
	for k, v := range u.params {
		if k == paramWeight {
			in.Weight = javaWeight(v)
			continue
		}
		md[k] = v
	}
	in.Metadata = md
	return in
}

// javaWeight reads a weight parameter. Java's balancers give a provider of
// weight 0 no calls while others have weight; dabb's least weight, 1, is
// the nearest. A weight that is not a number is the default, as Java's
// URL.getParameter with a default reads it.
func javaWeight(v string) int {
	w, err := strconv.Atoi(v)
	switch {
	case err != nil || w < 0:
		return registry.DefaultWeight
	case w == 0:
		return 1
	}
	return w
}
