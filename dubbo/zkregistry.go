// The zookeeper:// registry: Java exports published in Dubbo's interface-level layout.

package dubbo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/zk"
)

// The Metadata keys of a registry.Instance that Register reads. An instance
// is a Java export when it sets MetaMethods; its Service is then the Java
// interface name.
const (
	// MetaMethods lists the Java method names, comma-separated; Register
	// publishes nothing for an instance without it.
	MetaMethods = "dubbo.methods"
	// MetaVersion is the export's Dubbo version; default none.
	MetaVersion = "dubbo.version"
	// MetaGroup is the export's Dubbo group; default none.
	MetaGroup = "dubbo.group"
	// MetaApplication names the application; default the program's file
	// name.
	MetaApplication = "dubbo.application"
)

// Release is dabb's version, published as the release parameter of every
// provider URL.
const Release = "dabb-0.1.0"

// DefaultRoot is the root of Dubbo's layout when the URL has no group.
const DefaultRoot = "/dubbo"

// RegistryConfig configures a Registry. The zero value of every field but
// Servers has a working default.
type RegistryConfig struct {
	// Servers lists the ZooKeeper servers as host:port.
	Servers []string
	// Root is the root node of the layout, Dubbo's registry group; default
	// DefaultRoot. A root without a leading '/' gets one, as Java's.
	Root string
	// SessionTimeout is the session timeout asked of ZooKeeper; default
	// zk.DefaultSessionTimeout, 10 s.
	SessionTimeout time.Duration
	// RequestTimeout bounds each call whose context has no earlier
	// deadline; default zk.DefaultRequestTimeout, 3 s.
	RequestTimeout time.Duration
	// Logger receives the registry's events; nil means slog.Default().
	Logger *slog.Logger
}

// Registry publishes Java exports in Dubbo's interface-level layout in
// ZooKeeper and finds Dubbo providers there. It implements
// registry.Registry; its methods are safe for concurrent use.
//
// Register writes each Java export as an ephemeral node
// {Root}/{interface}/providers/{URL-encoded dubbo:// URL}, under persistent
// parents. One zk.Registry keeps the nodes of every interface, on one
// session: it re-creates them after a session expiry and deletes them at
// Close. An export that sets MetaSignatures also gets
// its service definition written in Dubbo's metadata report, a persistent
// node (metadatawrite.go).
type Registry struct {
	cfg RegistryConfig
	log *slog.Logger

	writing sync.Mutex // serializes Register and Deregister

	mu        sync.Mutex // guards following
	closed    bool
	pub       *zk.Registry           // keeps the nodes Register wrote; nil until the first Register
	published map[string]publication // by instance: Service, NUL, ID
	reader    *reader                // zkwatch.go; nil until the first Watch

	defs    definitionCache // metadata.go: the service definitions read
	written sync.Map        // metadata.go: definition path → the JSON written there
}

// publication is what Register wrote for an instance.
type publication struct {
	iface string
	node  string            // the node's name: the encoded URL
	base  map[string]string // the URL's parameters but timestamp
	addr  string
}

var _ registry.Registry = (*Registry)(nil)

func init() { registry.RegisterScheme("zookeeper", openURL) }

// NewRegistry returns a Registry for cfg. It does no I/O.
func NewRegistry(cfg RegistryConfig) (*Registry, error) {
	if len(cfg.Servers) == 0 {
		return nil, fmt.Errorf("dubbo: registry: no servers: %w", registry.ErrInvalid)
	}
	cfg.Servers = slices.Clone(cfg.Servers)
	root, err := cleanRoot(cfg.Root)
	if err != nil {
		return nil, err
	}
	cfg.Root = root
	if cfg.SessionTimeout < 0 || cfg.RequestTimeout < 0 {
		return nil, fmt.Errorf("dubbo: registry: negative timeout: %w", registry.ErrInvalid)
	}
	if cfg.SessionTimeout == 0 {
		cfg.SessionTimeout = zk.DefaultSessionTimeout
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = zk.DefaultRequestTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	// The servers are checked as zk.Registry checks them; New does no
	// I/O and starts nothing.
	check, err := zk.New(zk.Config{Servers: cfg.Servers, Prefix: cfg.Root})
	if err != nil {
		return nil, fmt.Errorf("dubbo: registry: %w", err)
	}
	check.Close()
	return &Registry{
		cfg:       cfg,
		log:       cfg.Logger.With("registry", "zookeeper"),
		published: make(map[string]publication),
	}, nil
}

// cleanRoot makes a registry group the root path, as Java's
// ZookeeperRegistry does: DefaultRoot when empty, a leading '/' added.
func cleanRoot(group string) (string, error) {
	if group == "" {
		return DefaultRoot, nil
	}
	root := path.Clean("/" + group)
	if root == "/zookeeper" || strings.HasPrefix(root, "/zookeeper/") {
		return "", fmt.Errorf("dubbo: registry: root %q: /zookeeper is reserved by ZooKeeper: %w", root, registry.ErrInvalid)
	}
	return root, nil
}

// Config returns the configuration in use, defaults filled in.
func (r *Registry) Config() RegistryConfig { return r.cfg }

// servicePath returns the node of an interface: {Root}/{encoded interface}.
func (r *Registry) servicePath(iface string) string {
	return strings.TrimSuffix(r.cfg.Root, "/") + "/" + zkEncode(iface)
}

// ProviderPath returns the path of the node Register wrote for the
// instance, and false when it wrote none.
func (r *Registry) ProviderPath(in registry.Instance) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.published[in.Service+"\x00"+in.ID]
	if !ok {
		return "", false
	}
	return r.providerNode(p.iface, p.node), true
}

// Register publishes a Java export: in.Service is the Java interface name,
// in.Metadata sets MetaMethods and optionally MetaVersion, MetaGroup,
// MetaApplication and MetaSignatures (then the service definition is
// published too; see publishDefinition). An instance without MetaMethods is not a Java export:
// Register writes nothing and returns nil, for dabb's own clients find it
// through zk:// or etcd://. A second Register of the same Service and ID
// replaces the node when the URL changes (the timestamp aside).
//
// in.Addr must name the address consumers dial: an unspecified IP
// (0.0.0.0, ::) is refused, for the URL says anyhost=false.
func (r *Registry) Register(ctx context.Context, in registry.Instance) error {
	if in.Metadata[MetaMethods] == "" {
		return nil
	}
	params, err := providerParams(in)
	if err != nil {
		return fmt.Errorf("dubbo: register %s/%s: %w", in.Service, in.ID, err)
	}
	r.writing.Lock()
	defer r.writing.Unlock()
	key := in.Service + "\x00" + in.ID
	r.mu.Lock()
	old, had := r.published[key]
	r.mu.Unlock()
	node := old.node
	if !had || old.addr != in.Addr || !maps.Equal(old.base, params) {
		withTime := maps.Clone(params)
		withTime["timestamp"] = strconv.FormatInt(time.Now().UnixMilli(), 10)
		u := providerURL{protocol: protocolDubbo, addr: in.Addr, path: in.Service, params: withTime}
		node = zkEncode(u.fullString())
	}
	pub, err := r.publisher()
	if err != nil {
		return fmt.Errorf("dubbo: register %s/%s: %w", in.Service, in.ID, err)
	}
	at := r.providerNode(in.Service, node)
	if err := pub.RegisterAt(ctx, at, registry.Instance{Service: categoryProviders, ID: node, Addr: in.Addr}); err != nil {
		if !had || old.node != node {
			// The write may still complete, and zk.Registry would then
			// keep the node: withdraw it. Deregister stops keeping it at
			// once and, its context being done, deletes it later
			// without waiting.
			done, cancel := context.WithCancel(context.Background())
			cancel()
			_ = pub.DeregisterAt(done, at)
		}
		return fmt.Errorf("dubbo: register %s/%s: %w", in.Service, in.ID, err)
	}
	r.mu.Lock()
	r.published[key] = publication{iface: in.Service, node: node, base: params, addr: in.Addr}
	r.mu.Unlock()
	r.publishDefinition(ctx, in, params)
	if had && old.node != node {
		// The new node is in place: consumers never see the export
		// missing.
		if err := r.unpublish(ctx, old); err != nil {
			r.log.Warn("register: removing the previous node failed; its session's end removes it", "interface", in.Service, "err", err)
		}
	}
	return nil
}

// providerParams returns the URL parameters of a Java export but the
// timestamp.
func providerParams(in registry.Instance) (map[string]string, error) {
	if err := in.Validate(); err != nil {
		return nil, err
	}
	if strings.ContainsAny(in.Service, " \t,;=&?:") {
		return nil, fmt.Errorf("%w: service %q is not a Java interface name", registry.ErrInvalid, in.Service)
	}
	host, _, _ := net.SplitHostPort(in.Addr)
	if ip, err := netip.ParseAddr(host); err == nil && ip.IsUnspecified() {
		return nil, fmt.Errorf("%w: addr %s is unspecified; publish the address consumers dial", registry.ErrInvalid, in.Addr)
	}
	methods := strings.Split(in.Metadata[MetaMethods], ",")
	for i, m := range methods {
		methods[i] = strings.TrimSpace(m)
		if methods[i] == "" || strings.ContainsAny(methods[i], " \t&=?") {
			return nil, fmt.Errorf("%w: %s %q: method %q is not a Java method name", registry.ErrInvalid, MetaMethods, in.Metadata[MetaMethods], methods[i])
		}
	}
	app := in.Metadata[MetaApplication]
	if app == "" {
		app = filepath.Base(os.Args[0])
	}
	p := map[string]string{
		"anyhost":       "false",
		"application":   app,
		paramCategory:   categoryProviders,
		"deprecated":    "false",
		"dubbo":         "2.0.2",
		"dynamic":       "true",
		"generic":       "false",
		paramInterface:  in.Service,
		"methods":       strings.Join(sortedUnique(methods), ","),
		"pid":           strconv.Itoa(os.Getpid()),
		"release":       Release,
		"serialization": "hessian2",
		"side":          "provider",
		paramWeight:     strconv.Itoa(in.EffectiveWeight()),
	}
	for key, param := range map[string]string{MetaVersion: paramVersion, MetaGroup: paramGroup} {
		v := in.Metadata[key]
		if strings.ContainsAny(v, "&=?/ ") {
			return nil, fmt.Errorf("%w: %s %q contains one of \"&=?/ \"", registry.ErrInvalid, key, v)
		}
		if v != "" {
			p[param] = v
		}
	}
	if strings.ContainsAny(app, "&=?") {
		return nil, fmt.Errorf("%w: %s %q contains one of \"&=?\"", registry.ErrInvalid, MetaApplication, app)
	}
	return p, nil
}

func sortedUnique(s []string) []string {
	seen := make(map[string]bool, len(s))
	out := make([]string, 0, len(s))
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	slices.Sort(out)
	return out
}

// publisher returns the zk.Registry that keeps the provider nodes,
// creating it on first use. Its prefix is the root: a node's path names
// its interface (providerNode).
func (r *Registry) publisher() (*zk.Registry, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, registry.ErrClosed
	}
	if r.pub != nil {
		return r.pub, nil
	}
	pub, err := zk.New(zk.Config{
		Servers:        r.cfg.Servers,
		Prefix:         r.cfg.Root,
		SessionTimeout: r.cfg.SessionTimeout,
		RequestTimeout: r.cfg.RequestTimeout,
		Logger:         r.cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	r.pub = pub
	return pub, nil
}

// providerNode returns the path of a provider node of iface:
// {Root}/{encoded interface}/providers/{node}.
func (r *Registry) providerNode(iface, node string) string {
	return r.servicePath(iface) + "/" + categoryProviders + "/" + node
}

// unpublish removes a node Register wrote.
func (r *Registry) unpublish(ctx context.Context, p publication) error {
	r.mu.Lock()
	pub := r.pub
	r.mu.Unlock()
	if pub == nil {
		return registry.ErrClosed
	}
	return pub.DeregisterAt(ctx, r.providerNode(p.iface, p.node))
}

// Deregister removes the node Register wrote for the instance (by Service
// and ID); it returns nil when Register wrote none. When ZooKeeper cannot
// be reached it returns an error and the node goes later, as with
// zk.Registry.
func (r *Registry) Deregister(ctx context.Context, in registry.Instance) error {
	r.writing.Lock()
	defer r.writing.Unlock()
	key := in.Service + "\x00" + in.ID
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return fmt.Errorf("dubbo: deregister %s/%s: %w", in.Service, in.ID, registry.ErrClosed)
	}
	p, ok := r.published[key]
	delete(r.published, key)
	r.mu.Unlock()
	if !ok {
		return nil
	}
	if err := r.unpublish(ctx, p); err != nil {
		return fmt.Errorf("dubbo: deregister %s/%s: %w", in.Service, in.ID, err)
	}
	return nil
}

// Close stops every watcher, deletes the nodes this Registry wrote and
// ends its sessions. Later calls return registry.ErrClosed.
func (r *Registry) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return registry.ErrClosed
	}
	r.closed = true
	pub, rd := r.pub, r.reader
	r.mu.Unlock()
	var err error
	if pub != nil {
		if err = pub.Close(); errors.Is(err, registry.ErrClosed) {
			err = nil
		}
	}
	if rd != nil {
		rd.close()
	}
	return err
}
