// Publishing a Java export's service definition in Dubbo's metadata
// report, where Java's and dabb's generic callers read its parameter types.

package dubbo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/dabbrpc/dabb/registry"
	gozk "github.com/go-zookeeper/zk"
)

// MetaSignatures is the Metadata key of a registry.Instance that lists
// the Java methods of an export with their types, for the service
// definition Register publishes: "name(type,type)result" per method
// (overloads included), separated by ';'. Service sets it. Register
// publishes no definition for an instance without it.
const MetaSignatures = "dubbo.signatures"

// signature returns m as MetaSignatures lists it.
func (m *method) signature() string {
	return m.java + "(" + strings.Join(m.types, ",") + ")" + m.result
}

// parseSignatures reads MetaSignatures into methods.
func parseSignatures(s string) ([]MethodDefinition, error) {
	var out []MethodDefinition
	for sig := range strings.SplitSeq(s, ";") {
		lp, rp := strings.IndexByte(sig, '('), strings.LastIndexByte(sig, ')')
		if lp <= 0 || rp < lp || rp == len(sig)-1 {
			return nil, fmt.Errorf("%w: %s: %q is not name(types)result", registry.ErrInvalid, MetaSignatures, sig)
		}
		m := MethodDefinition{Name: sig[:lp], ParameterTypes: []string{}, ReturnType: sig[rp+1:]}
		if params := sig[lp+1 : rp]; params != "" {
			m.ParameterTypes = strings.Split(params, ",")
		}
		out = append(out, m)
	}
	return out, nil
}

// definitionJSON returns the FullServiceDefinition of an export as Java
// writes it: its methods, a type entry for each type they name, and the
// provider URL's parameters.
func definitionJSON(iface string, methods []MethodDefinition, params map[string]string) ([]byte, error) {
	def := ServiceDefinition{CanonicalName: iface, Methods: methods, Annotations: []string{}, Parameters: params}
	var names []string
	for _, m := range methods {
		names = append(names, m.ParameterTypes...)
		names = append(names, m.ReturnType)
	}
	slices.Sort(names)
	for _, n := range slices.Compact(names) {
		if n == "void" {
			continue
		}
		t, err := json.Marshal(map[string]string{"type": n})
		if err != nil {
			return nil, err
		}
		def.Types = append(def.Types, t)
	}
	return json.Marshal(def)
}

// publishDefinition writes the service definition of the export Register
// published with params, when in sets MetaSignatures: a persistent node
// {Root}/metadata/{interface}[/{version}][/{group}]/provider/{application},
// as Java's ZookeeperMetadataReport writes it. Java never deletes it, nor
// does Deregister. A failure is logged, not returned: consumers then infer
// the types or are given them.
func (r *Registry) publishDefinition(ctx context.Context, in registry.Instance, params map[string]string) {
	sigs := in.Metadata[MetaSignatures]
	if sigs == "" {
		return
	}
	fail := func(err error) {
		r.log.Warn("register: the service definition was not published; generic callers infer the parameter types",
			"interface", in.Service, "err", err)
	}
	methods, err := parseSignatures(sigs)
	if err != nil {
		fail(err)
		return
	}
	data, err := definitionJSON(in.Service, methods, params)
	if err != nil {
		fail(err)
		return
	}
	key := serviceKey{iface: in.Service, group: params[paramGroup], version: params[paramVersion]}
	node := r.definitionPath(key) + "/" + zkEncode(params["application"])
	if prev, ok := r.written.Load(node); ok && string(prev.([]byte)) == string(data) {
		return
	}
	if err := r.writeNode(ctx, node, data); err != nil {
		fail(err)
		return
	}
	r.written.Store(node, data)
}

// writeNode creates or updates a persistent node with data, its parents
// created empty, on the reading session.
func (r *Registry) writeNode(ctx context.Context, node string, data []byte) error {
	rd, err := r.readerFor()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
	defer cancel()
	res := make(chan error, 1)
	if !rd.spawn(func() {
		if err := rd.waitSession(ctx); err != nil {
			res <- err
			return
		}
		res <- createOrSet(rd.conn, node, data)
	}) {
		return registry.ErrClosed
	}
	select {
	case err := <-res:
		return err
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", registry.ErrUnavailable, ctx.Err())
	}
}

// createOrSet writes data at node, creating it and its missing parents.
func createOrSet(conn *gozk.Conn, node string, data []byte) error {
	_, err := conn.Set(node, data, -1)
	if !errors.Is(err, gozk.ErrNoNode) {
		return err
	}
	var parents []string
	for p := path.Dir(node); p != "/"; p = path.Dir(p) {
		parents = append(parents, p)
	}
	for _, p := range slices.Backward(parents) {
		if _, err := conn.Create(p, nil, 0, gozk.WorldACL(gozk.PermAll)); err != nil && !errors.Is(err, gozk.ErrNodeExists) {
			return fmt.Errorf("create %s: %w", p, err)
		}
	}
	_, err = conn.Create(node, data, 0, gozk.WorldACL(gozk.PermAll))
	if errors.Is(err, gozk.ErrNodeExists) {
		_, err = conn.Set(node, data, -1)
	}
	return err
}
