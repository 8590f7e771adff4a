// Dubbo's override URLs under configurators, applied to providers as Java's consumers apply them.

package dubbo

import (
	"slices"
	"strconv"
	"strings"
)

// categoryConfigurators is the node, beside providers, where Dubbo Admin
// writes override URLs.
const categoryConfigurators = "configurators"

// anyHost is the host of an override URL that applies to every provider.
const anyHost = "0.0.0.0"

// overrideConditions are the parameters of an override URL that select
// providers or describe the rule; they are never copied onto a provider.
// Java's AbstractConfigurator names the same ones.
var overrideConditions = map[string]bool{
	"category": true, "check": true, "dynamic": true, "enabled": true, "group": true, "version": true,
	"application": true, "side": true, "configVersion": true, "compatible_config": true,
	"interfaces": true,
}

// override is one override URL that a consumer of the key takes into
// account.
type override struct {
	u        providerURL
	host     string
	port     int
	priority int
}

// overridesFor decodes the children of a configurators node and keeps the
// override URLs Java's consumer of k would apply: protocol override, the
// same interface, group and version as k (as UrlUtils.isMatch), not
// enabled=false. They are ordered as Java's configurators: those for
// every host (0.0.0.0) first, then by priority, so that later ones win.
// skip is called with each child that is not a URL.
func overridesFor(k serviceKey, names []string, skip func(name string, err error)) []override {
	var out []override
	for _, name := range names {
		raw, err := zkDecode(name)
		var u providerURL
		if err == nil {
			u, err = parseProviderURL(raw)
		}
		if err != nil {
			skip(name, err)
			continue
		}
		if u.protocol != "override" || !k.matchesOverride(u) {
			continue
		}
		o := override{u: u}
		o.host, o.port, _ = splitAddr(u.addr)
		o.priority, _ = strconv.Atoi(u.params["priority"])
		out = append(out, o)
	}
	slices.SortStableFunc(out, func(a, b override) int {
		if aa, ba := a.host == anyHost, b.host == anyHost; aa != ba {
			if aa {
				return -1
			}
			return 1
		}
		return a.priority - b.priority
	})
	return out
}

// matchesOverride is matches for an override URL: its category is
// configurators, and the protocol is not checked.
func (k serviceKey) matchesOverride(u providerURL) bool {
	if u.params[paramCategory] != categoryConfigurators {
		return false
	}
	o := u
	o.protocol = protocolDubbo
	o.params = make(map[string]string, len(u.params))
	for key, v := range u.params {
		if key != paramCategory {
			o.params[key] = v
		}
	}
	return k.matches(o)
}

// apply returns p with the overrides that select it applied, in order,
// as Java's AbstractConfigurator.configure on a consumer: an override with
// a port selects providers on that host (any host for 0.0.0.0) and port;
// one without a port selects every provider only if its host is 0.0.0.0
// (Java's others name consumer hosts). Its providerAddresses, application
// and "~key" parameters must then agree with the provider's, and its side,
// if set, must be consumer; its other parameters replace the provider's.
func apply(p providerURL, overrides []override) providerURL {
	if len(overrides) == 0 {
		return p
	}
	host, port, _ := splitAddr(p.addr)
	out := p
	out.params = nil
	for _, o := range overrides {
		if o.host != anyHost && o.host != host {
			continue
		}
		if o.port != 0 && o.port != port || o.port == 0 && o.host != anyHost {
			continue
		}
		if !o.selects(p) {
			continue
		}
		if out.params == nil {
			out.params = make(map[string]string, len(p.params)+2)
			for k, v := range p.params {
				out.params[k] = v
			}
		}
		for k, v := range o.u.params {
			if !overrideConditions[k] && !strings.HasPrefix(k, "~") {
				out.params[k] = v
			}
		}
	}
	if out.params == nil {
		out.params = p.params
	}
	return out
}

// selects checks an override's conditions on the provider's parameters.
func (o override) selects(p providerURL) bool {
	if addrs := o.u.params["providerAddresses"]; addrs != "" &&
		!strings.Contains(addrs, p.addr) && !strings.Contains(addrs, anyHost) {
		return false
	}
	for k, v := range o.u.params {
		cond, tilde := strings.CutPrefix(k, "~")
		if !tilde && k != "application" && k != "side" {
			continue
		}
		have := p.params[cond]
		if cond == "side" {
			have = "consumer" // Java compares with the consumer's merged URL
		}
		if v != "" && v != "*" && v != have {
			return false
		}
	}
	return true
}

// disabled reports whether a provider, overrides applied, is to be left
// out, as Java's RegistryDirectory decides: by disabled when the URL has
// it, else by enabled=false.
func disabled(p providerURL) bool {
	if v, ok := p.params[paramDisabled]; ok {
		return strings.EqualFold(v, "true")
	}
	return strings.EqualFold(p.params[paramEnabled], "false")
}
