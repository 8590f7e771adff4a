// Dubbo's metadata report in ZooKeeper: a provider's service definition,
// read for the parameter types of a generic call.

package dubbo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dabbrpc/dabb/registry"
	gozk "github.com/go-zookeeper/zk"
)

// ServiceDefinition is a provider's service definition as Java Dubbo's
// metadata report stores it in JSON (FullServiceDefinition). Fields dabb
// does not read are kept as the JSON gave them.
type ServiceDefinition struct {
	// CanonicalName is the Java interface name.
	CanonicalName string `json:"canonicalName"`
	// CodeSource names the jar the interface came from; may be empty.
	CodeSource string `json:"codeSource,omitempty"`
	// Methods lists the interface's public methods, overloads included.
	Methods []MethodDefinition `json:"methods"`
	// Types describes the types the methods use (Java's TypeDefinition).
	Types []json.RawMessage `json:"types,omitempty"`
	// Annotations are the interface's annotations as Java prints them.
	Annotations []string `json:"annotations,omitempty"`
	// Parameters are the provider URL's parameters.
	Parameters map[string]string `json:"parameters,omitempty"`
}

// MethodDefinition is one method of a ServiceDefinition.
type MethodDefinition struct {
	// Name is the Java method name.
	Name string `json:"name"`
	// ParameterTypes are the Java parameter types as Java's
	// TypeDefinitionBuilder names them: java.lang.String, int, int[],
	// java.util.List<java.lang.String>.
	ParameterTypes []string `json:"parameterTypes"`
	// ReturnType is the Java result type, "void" for none.
	ReturnType string `json:"returnType"`
	// Annotations are the method's annotations as Java prints them.
	Annotations []string `json:"annotations,omitempty"`
}

// ErrOverloaded matches the error of Invoke, called without types, when
// the provider's service definition has several methods of that name and
// argument count. Its message lists them; pass the parameter types.
var ErrOverloaded = errors.New("dubbo: overloaded method")

// The metadata report's layout under the root, Java's
// MetadataIdentifier path: {Root}/metadata/{interface}[/{version}][/{group}]/provider/{application}.
const (
	metadataNode = "metadata"
	sideProvider = "provider"
)

// definitionTTL is how long a definition read (or found missing) is
// reused for the same service key.
const definitionTTL = 10 * time.Second

// definitionWait bounds a read of the metadata report.
const definitionWait = time.Second

// maxDefinitionApps bounds the application nodes read for one service.
const maxDefinitionApps = 8

// definitionCache keeps the definitions read, by service key.
type definitionCache struct {
	mu      sync.Mutex
	entries map[serviceKey]definitionEntry
}

type definitionEntry struct {
	defs []*ServiceDefinition // nil when none was found
	err  error
	at   time.Time
}

// definitionPath returns the node under which the applications that
// provide key publish its definition. An empty version or group has no
// segment, as in Java's path.
func (r *Registry) definitionPath(key serviceKey) string {
	p := strings.TrimSuffix(r.cfg.Root, "/") + "/" + metadataNode + "/" + zkEncode(key.iface)
	for _, seg := range []string{key.version, key.group} {
		if seg != "" {
			p += "/" + seg
		}
	}
	return p + "/" + sideProvider
}

// ServiceDefinitions reads the service definitions published for service
// (a service key, as for Invoke), one per application that published
// one, sorted by application. It returns none, and no error, when there
// is no definition. ctx bounds the call, as RequestTimeout does.
func (r *Registry) ServiceDefinitions(ctx context.Context, service string) ([]*ServiceDefinition, error) {
	key, err := parseServiceKey(service)
	if err != nil {
		return nil, fmt.Errorf("dubbo: service definition: %w", err)
	}
	return r.readDefinitions(ctx, key)
}

// readDefinitions reads the definitions of key on the reading session.
func (r *Registry) readDefinitions(ctx context.Context, key serviceKey) ([]*ServiceDefinition, error) {
	rd, err := r.readerFor()
	if err != nil {
		return nil, fmt.Errorf("dubbo: service definition of %s: %w", key, err)
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
	defer cancel()
	type result struct {
		defs []*ServiceDefinition
		err  error
	}
	res := make(chan result, 1)
	if !rd.spawn(func() {
		if err := rd.waitSession(ctx); err != nil {
			res <- result{err: err}
			return
		}
		defs, err := r.fetchDefinitions(ctx, rd.conn, key)
		res <- result{defs, err}
	}) {
		return nil, fmt.Errorf("dubbo: service definition of %s: %w", key, registry.ErrClosed)
	}
	select {
	case out := <-res:
		if out.err != nil {
			return nil, fmt.Errorf("dubbo: service definition of %s: %w", key, out.err)
		}
		return out.defs, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("dubbo: service definition of %s: %w: %w", key, registry.ErrUnavailable, ctx.Err())
	}
}

// fetchDefinitions lists the applications under key's definition node and
// decodes the definition of each.
func (r *Registry) fetchDefinitions(ctx context.Context, conn *gozk.Conn, key serviceKey) ([]*ServiceDefinition, error) {
	dir := r.definitionPath(key)
	apps, _, err := conn.Children(dir)
	if errors.Is(err, gozk.ErrNoNode) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	slices.Sort(apps)
	if len(apps) > maxDefinitionApps {
		apps = apps[:maxDefinitionApps]
	}
	var defs []*ServiceDefinition
	for _, app := range apps {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		data, _, err := conn.Get(dir + "/" + app)
		if errors.Is(err, gozk.ErrNoNode) {
			continue
		}
		if err != nil {
			return nil, err
		}
		var def ServiceDefinition
		if err := json.Unmarshal(data, &def); err != nil {
			return nil, fmt.Errorf("%s/%s is no service definition: %w", dir, app, err)
		}
		defs = append(defs, &def)
	}
	return defs, nil
}

// cachedDefinitions returns the definitions of key, read at most once per
// definitionTTL; a read takes at most definitionWait.
func (r *Registry) cachedDefinitions(ctx context.Context, key serviceKey) ([]*ServiceDefinition, error) {
	r.defs.mu.Lock()
	e, ok := r.defs.entries[key]
	r.defs.mu.Unlock()
	if ok && time.Since(e.at) < definitionTTL {
		return e.defs, e.err
	}
	ctx, cancel := context.WithTimeout(ctx, definitionWait)
	defer cancel()
	defs, err := r.readDefinitions(ctx, key)
	r.defs.mu.Lock()
	if r.defs.entries == nil {
		r.defs.entries = make(map[serviceKey]definitionEntry)
	}
	r.defs.entries[key] = definitionEntry{defs: defs, err: err, at: time.Now()}
	r.defs.mu.Unlock()
	return defs, err
}

// definedTypes returns the parameter types of method with n parameters in
// the definitions of key. It returns nil, and no error, when the
// definitions are missing or unreadable (logged at debug level) or have
// no such method; an error wrapping ErrOverloaded when they have several
// of different types.
func (r *Registry) definedTypes(ctx context.Context, key serviceKey, method string, n int) ([]string, error) {
	defs, err := r.cachedDefinitions(ctx, key)
	if err != nil {
		r.log.Debug("generic call: the service definition could not be read; inferring the parameter types",
			"service", key.String(), "method", method, "err", err)
		return nil, nil
	}
	types, err := methodTypes(defs, method, n)
	if err != nil {
		return nil, err
	}
	if types == nil {
		r.log.Debug("generic call: no service definition of the method; inferring the parameter types",
			"service", key.String(), "method", method, "args", n, "definitions", len(defs))
	}
	return types, nil
}

// methodTypes returns the parameter types, generics erased, of the one
// method named method with n parameters in defs; nil when there is none.
// Overloads of different types are an error wrapping ErrOverloaded.
func methodTypes(defs []*ServiceDefinition, method string, n int) ([]string, error) {
	var found [][]string
	for _, d := range defs {
		for _, m := range d.Methods {
			if m.Name != method || len(m.ParameterTypes) != n {
				continue
			}
			types := make([]string, n)
			for i, t := range m.ParameterTypes {
				types[i] = erasure(t)
			}
			if !slices.ContainsFunc(found, func(f []string) bool { return slices.Equal(f, types) }) {
				found = append(found, types)
			}
		}
	}
	switch len(found) {
	case 0:
		return nil, nil
	case 1:
		return found[0], nil
	}
	sigs := make([]string, len(found))
	for i, f := range found {
		sigs[i] = method + "(" + strings.Join(f, ", ") + ")"
	}
	slices.Sort(sigs)
	return nil, fmt.Errorf("%w: the service definition has %d methods %s of %d parameters: %s; pass the parameter types",
		ErrOverloaded, len(found), method, n, strings.Join(sigs, ", "))
}

// erasure returns a Java type name without its type arguments:
// java.util.List<java.lang.String> is java.util.List, as a generic call
// names it.
func erasure(t string) string {
	t = strings.TrimSpace(t)
	i := strings.IndexByte(t, '<')
	if i < 0 {
		return t
	}
	// An array of a parameterized type keeps its brackets.
	return t[:i] + strings.Repeat("[]", strings.Count(t[strings.LastIndexByte(t, '>'):], "[]"))
}

// typeSource is a registry that knows the parameter types of a provider's
// methods: the zookeeper:// Registry, from the metadata report.
type typeSource interface {
	definedTypes(ctx context.Context, key serviceKey, method string, n int) ([]string, error)
}
