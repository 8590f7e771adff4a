// The etcd Registry: its Config, New, Register, Deregister and Close.

package etcd

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/dabbrpc/dabb/registry"
)

// Defaults of Config.
const (
	DefaultTTL               = 10 * time.Second
	DefaultDialTimeout       = 2 * time.Second
	DefaultRequestTimeout    = 3 * time.Second
	DefaultMaxReconnectDelay = 2 * time.Second
)

// ErrUnavailable is wrapped by the error Watcher.Next returns when the
// client lost its connection to etcd. The watcher goes on: the next call
// returns the full set once etcd answers again. It wraps
// registry.ErrUnavailable.
var ErrUnavailable error = unavailableError{}

type unavailableError struct{}

func (unavailableError) Error() string { return "etcd: unavailable" }

// Is makes errors.Is(err, registry.ErrUnavailable) hold too.
func (unavailableError) Is(target error) bool { return target == registry.ErrUnavailable }

// Config configures a Registry. Only Endpoints is required.
type Config struct {
	// Endpoints are the etcd client addresses, "host:port" or
	// "http://host:port".
	Endpoints []string
	// Prefix is the root of the layout; default registry.DefaultPrefix.
	Prefix string
	// TTL of the lease the registered keys are bound to: how long the
	// instances of a dead process stay visible. Rounded up to whole
	// seconds; default 10 s.
	TTL time.Duration
	// DialTimeout bounds etcd's client bootstrap operations and the
	// first lease keep-alive; default 2 s. New never blocks on it.
	DialTimeout time.Duration
	// RequestTimeout bounds every call (Register, Deregister, Watch,
	// the list a watcher makes, Close's revoke); default 3 s.
	RequestTimeout time.Duration
	// MaxReconnectDelay caps the wait between connection attempts to an
	// etcd that is down, so the registry notices quickly when it is
	// back; default 2 s.
	MaxReconnectDelay time.Duration
	// Username and Password authenticate, when set.
	Username, Password string
	// TLS, when set, secures the connection.
	TLS *tls.Config
	// Logger receives lease and watch events; nil means slog.Default().
	Logger *slog.Logger
}

func (c Config) withDefaults() (Config, error) {
	if len(c.Endpoints) == 0 {
		return c, fmt.Errorf("etcd: config has no endpoints: %w", registry.ErrInvalid)
	}
	for _, ep := range c.Endpoints {
		if strings.TrimSpace(ep) == "" {
			return c, fmt.Errorf("etcd: config has an empty endpoint in %q: %w", c.Endpoints, registry.ErrInvalid)
		}
	}
	if c.TTL < 0 || c.DialTimeout < 0 || c.RequestTimeout < 0 || c.MaxReconnectDelay < 0 {
		return c, fmt.Errorf("etcd: config has a negative duration: %w", registry.ErrInvalid)
	}
	c.Prefix = registry.CleanPrefix(c.Prefix)
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.MaxReconnectDelay == 0 {
		c.MaxReconnectDelay = DefaultMaxReconnectDelay
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

// ttlSeconds is the lease TTL in whole seconds, at least 1.
func (c Config) ttlSeconds() int64 {
	s := int64((c.TTL + time.Second - 1) / time.Second)
	return max(s, 1)
}

// Registry is an etcd-backed registry. Its methods are safe for concurrent
// use.
type Registry struct {
	cfg Config
	cli *clientv3.Client
	log *slog.Logger

	ctx    context.Context // ends at Close; parent of background work
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// sem serializes lease and key changes: Register, Deregister, lease
	// recovery and Close. A channel, so that waiting honours contexts.
	sem        chan struct{}
	lease      clientv3.LeaseID             // guarded by sem; 0: none
	registered map[string]registry.Instance // guarded by sem; key -> instance
	leaseSet   chan struct{}                // wakes the keeper when lease changes

	// mu guards the following. Goroutines are only started under mu
	// while closed is false, so Close's wait sees all of them.
	mu       sync.Mutex
	closed   bool
	keeping  bool // the keeper goroutine was started
	watchers map[*watcher]struct{}
	conn     *connMonitor // started by the first Watch

	// testHookAfterList, when set, runs in a watcher's goroutine after
	// each list, before the watch starts.
	testHookAfterList func(service string)
}

var (
	_ registry.Registry     = (*Registry)(nil)
	_ registry.Reachability = (*Registry)(nil)
)

// New returns a registry for the endpoints in cfg. It does no I/O: the
// client connects on first use.
func New(cfg Config) (*Registry, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   cfg.Endpoints,
		DialTimeout: cfg.DialTimeout,
		// Pings on an idle connection: a host that died without closing
		// it (power loss, a dropped route) leaves the channel READY, its
		// watches silent and lease renewals unanswered until TCP gives up
		// (~15 min). With pings it fails within seconds and the outage
		// handling (stale cache, lease recovery) starts. etcd accepts
		// pings every 5 s or more (--grpc-keepalive-min-time).
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		Username:             cfg.Username,
		Password:             cfg.Password,
		TLS:                  cfg.TLS,
		Logger:               zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{
				BaseDelay:  100 * time.Millisecond,
				Multiplier: 1.6,
				Jitter:     0.2,
				MaxDelay:   cfg.MaxReconnectDelay,
			},
			MinConnectTimeout: cfg.RequestTimeout,
		})},
	})
	if err != nil {
		return nil, fmt.Errorf("etcd: new client for %v: %w", cfg.Endpoints, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Registry{
		cfg:        cfg,
		cli:        cli,
		log:        cfg.Logger.With("registry", "etcd"),
		ctx:        ctx,
		cancel:     cancel,
		sem:        make(chan struct{}, 1),
		registered: make(map[string]registry.Instance),
		leaseSet:   make(chan struct{}, 1),
		watchers:   make(map[*watcher]struct{}),
	}, nil
}

// key returns <prefix>/<service>/<id>.
func (r *Registry) key(in registry.Instance) string {
	return r.cfg.Prefix + "/" + in.Service + "/" + in.ID
}

// servicePrefix returns <prefix>/<service>/, the prefix of the service's
// keys and of no other service's.
func (r *Registry) servicePrefix(service string) string {
	return r.cfg.Prefix + "/" + service + "/"
}

// callContext bounds ctx by RequestTimeout.
func (r *Registry) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.cfg.RequestTimeout)
}

// acquire takes sem, or fails when ctx ends first.
func (r *Registry) acquire(ctx context.Context) error {
	select {
	case r.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (r *Registry) release() { <-r.sem }

func (r *Registry) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

// Register puts the instance's key, bound to this registry's lease
// (granting one first if there is none). Registering the same service and
// ID again replaces the value. The key is put again, on a new lease, if
// the lease is lost, until Deregister or Close.
func (r *Registry) Register(ctx context.Context, in registry.Instance) error {
	if err := in.Validate(); err != nil {
		return fmt.Errorf("etcd: register: %w", err)
	}
	value, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("etcd: register %s/%s: %w", in.Service, in.ID, err)
	}
	ctx, cancel := r.callContext(ctx)
	defer cancel()
	if err := r.acquire(ctx); err != nil {
		return fmt.Errorf("etcd: register %s/%s: %w", in.Service, in.ID, err)
	}
	defer r.release()
	if r.isClosed() {
		return registry.ErrClosed
	}
	key := r.key(in)
	prev, had := r.registered[key]
	r.registered[key] = in
	if err := r.putRegistered(ctx, key, string(value)); err != nil {
		if had {
			r.registered[key] = prev
		} else {
			delete(r.registered, key)
		}
		return fmt.Errorf("etcd: register %s/%s: %w", in.Service, in.ID, err)
	}
	return nil
}

// putRegistered puts one key on the current lease, establishing a lease
// (and putting every registered key on it) when there is none or the
// current one is gone. The caller holds sem; r.registered holds key.
func (r *Registry) putRegistered(ctx context.Context, key, value string) error {
	if r.lease != 0 {
		_, err := r.cli.Put(ctx, key, value, clientv3.WithLease(r.lease))
		if err == nil {
			return nil
		}
		if !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return err
		}
		r.log.Warn("lease gone, granting a new one", "lease", fmt.Sprintf("%x", int64(r.lease)))
		r.lease = 0
	}
	return r.establish(ctx)
}

// Deregister deletes the instance's key. The instance is no longer put
// again after a lease loss, even when the delete fails.
func (r *Registry) Deregister(ctx context.Context, in registry.Instance) error {
	if err := registry.ValidateService(in.Service); err != nil {
		return fmt.Errorf("etcd: deregister: %w", err)
	}
	if err := registry.ValidateID(in.ID); err != nil {
		return fmt.Errorf("etcd: deregister %s: %w", in.Service, err)
	}
	ctx, cancel := r.callContext(ctx)
	defer cancel()
	if err := r.acquire(ctx); err != nil {
		return fmt.Errorf("etcd: deregister %s/%s: %w", in.Service, in.ID, err)
	}
	defer r.release()
	if r.isClosed() {
		return registry.ErrClosed
	}
	key := r.key(in)
	delete(r.registered, key)
	if _, err := r.cli.Delete(ctx, key); err != nil {
		// The key stays on the lease the keeper renews: delete it when
		// etcd answers again, or clients keep calling an instance that
		// has left.
		r.deleteLater(key)
		return fmt.Errorf("etcd: deregister %s/%s (retrying in the background until etcd answers): %w", in.Service, in.ID, err)
	}
	return nil
}

// deleteLater deletes key in the background, retrying with backoff until
// etcd answers, the key is registered again, or Close (which revokes the
// lease, and so deletes it anyway).
func (r *Registry) deleteLater(key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.wg.Go(func() {
		delay := 100 * time.Millisecond
		for r.pause(delay) {
			if r.tryDelete(key) {
				return
			}
			delay = min(2*delay, time.Second)
		}
	})
}

// tryDelete makes one attempt of deleteLater; it reports whether nothing
// is left to do.
func (r *Registry) tryDelete(key string) bool {
	ctx, cancel := r.callContext(r.ctx)
	defer cancel()
	if err := r.acquire(ctx); err != nil {
		return r.ctx.Err() != nil
	}
	defer r.release()
	if _, again := r.registered[key]; again {
		return true
	}
	_, err := r.cli.Delete(ctx, key)
	if err == nil {
		r.log.Info("deregistered key deleted after etcd came back", "key", key)
	}
	return err == nil || r.ctx.Err() != nil
}

// Close ends every watch, revokes the lease (which deletes the registered
// keys at once; bounded by RequestTimeout: if etcd is down they expire
// after the TTL) and closes the client.
func (r *Registry) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return registry.ErrClosed
	}
	r.closed = true
	ws := make([]*watcher, 0, len(r.watchers))
	for w := range r.watchers {
		ws = append(ws, w)
	}
	r.watchers = nil
	r.mu.Unlock()
	for _, w := range ws {
		w.end(registry.ErrClosed)
	}

	var errs []error
	ctx, cancel := r.callContext(context.Background())
	if err := r.acquire(ctx); err != nil {
		errs = append(errs, fmt.Errorf("etcd: close: waiting for a pending call: %w", err))
	} else {
		if r.lease != 0 {
			if _, err := r.cli.Revoke(ctx, r.lease); err != nil {
				errs = append(errs, fmt.Errorf("etcd: close: revoke lease %x (its keys expire after %v): %w", int64(r.lease), r.cfg.TTL, err))
			}
			r.lease = 0
		}
		clear(r.registered)
		r.release()
	}
	cancel()
	r.cancel()
	r.wg.Wait()
	if err := r.cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
		errs = append(errs, fmt.Errorf("etcd: close client: %w", err))
	}
	return errors.Join(errs...)
}
