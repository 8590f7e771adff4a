package dubbo

import (
	"errors"
	"testing"

	"github.com/dabbrpc/dabb/registry"
)

// javaNode is a provider node name in the form Java Dubbo 3 writes
// (URLEncoder.encode of URL.toFullString, built by hand by those rules),
// for an export of org.apache.dubbo.demo.DemoService in group g1, version
// 1.0.0.
const javaNode = "dubbo%3A%2F%2F192.168.1.5%3A20880%2Forg.apache.dubbo.demo.DemoService%3F" +
	"anyhost%3Dtrue%26application%3Ddemo-provider%26deprecated%3Dfalse%26dubbo%3D2.0.2%26dynamic%3Dtrue%26" +
	"generic%3Dfalse%26group%3Dg1%26interface%3Dorg.apache.dubbo.demo.DemoService%26" +
	"methods%3DsayHello%2CsayHelloAsync%26pid%3D4242%26release%3D3.2.10%26side%3Dprovider%26" +
	"timestamp%3D1700000000000%26version%3D1.0.0%26weight%3D50"

func TestZKEncodeIsJavaURLEncoder(t *testing.T) {
	tests := []struct{ in, want string }{
		// URLEncoder keeps letters, digits and ".-*_", writes a space as
		// '+' and every other byte as %XX in upper case.
		{"dubbo://1.2.3.4:20880/a.B?x=1&m=a,b", "dubbo%3A%2F%2F1.2.3.4%3A20880%2Fa.B%3Fx%3D1%26m%3Da%2Cb"},
		{"a*b_c-d.e", "a*b_c-d.e"},
		{"a b~c", "a+b%7Ec"},
		{"é", "%C3%A9"},
	}
	for _, tt := range tests {
		if got := zkEncode(tt.in); got != tt.want {
			t.Errorf("zkEncode(%q) = %q, want %q", tt.in, got, tt.want)
		}
		if back, err := zkDecode(tt.want); err != nil || back != tt.in {
			t.Errorf("zkDecode(%q) = %q, %v; want %q", tt.want, back, err, tt.in)
		}
	}
}

func TestParseJavaNode(t *testing.T) {
	raw, err := zkDecode(javaNode)
	if err != nil {
		t.Fatal(err)
	}
	u, err := parseProviderURL(raw)
	if err != nil {
		t.Fatal(err)
	}
	if u.protocol != "dubbo" || u.addr != "192.168.1.5:20880" || u.serviceInterface() != "org.apache.dubbo.demo.DemoService" {
		t.Errorf("parsed %q, %q, %q", u.protocol, u.addr, u.serviceInterface())
	}
	if u.params["methods"] != "sayHello,sayHelloAsync" || u.params["group"] != "g1" || u.params["version"] != "1.0.0" {
		t.Errorf("params %v", u.params)
	}
	// Written back, the URL is the node name again: the parameters are
	// sorted, as Java's toFullString sorts them.
	if got := zkEncode(u.fullString()); got != javaNode {
		t.Errorf("re-encoded:\n%s\nwant\n%s", got, javaNode)
	}
	in := providerInstance("g1/org.apache.dubbo.demo.DemoService:1.0.0", javaNode, u)
	if in.Weight != 50 || in.Addr != "192.168.1.5:20880" || in.ID != javaNode {
		t.Errorf("instance %+v", in)
	}
	if _, ok := in.Metadata["weight"]; ok || in.Metadata["application"] != "demo-provider" {
		t.Errorf("metadata %v: want weight out and application in", in.Metadata)
	}
}

func TestParseProviderURLErrors(t *testing.T) {
	for _, s := range []string{"", "192.168.1.5:20880/x", "dubbo:///x", "dubbo://h:99999/x", "dubbo://[::1/x"} {
		if _, err := parseProviderURL(s); err == nil {
			t.Errorf("parseProviderURL(%q) succeeded", s)
		}
	}
	u, err := parseProviderURL("dubbo://[::1]:20880/x?flag&k=a=b")
	if err != nil {
		t.Fatal(err)
	}
	if u, err := parseProviderURL("override://0.0.0.0/x"); err != nil || u.addr != "0.0.0.0" {
		t.Errorf("an address without a port: %+v, %v", u, err)
	}
	// As Java's URL.valueOf: a part without '=' is its own value; the
	// first '=' splits.
	if u.addr != "[::1]:20880" || u.params["flag"] != "flag" || u.params["k"] != "a=b" {
		t.Errorf("parsed %+v", u)
	}
}

func TestParseServiceKey(t *testing.T) {
	tests := []struct {
		key  string
		want serviceKey
	}{
		{"com.x.Greeter", serviceKey{iface: "com.x.Greeter"}},
		{"com.x.Greeter:1.0", serviceKey{iface: "com.x.Greeter", version: "1.0"}},
		{"g/com.x.Greeter", serviceKey{iface: "com.x.Greeter", group: "g"}},
		{"g/com.x.Greeter:1.0", serviceKey{iface: "com.x.Greeter", group: "g", version: "1.0"}},
		{"*/com.x.Greeter:*", serviceKey{iface: "com.x.Greeter", group: "*", version: "*"}},
		{"com.x.Greeter:1.0:g", serviceKey{iface: "com.x.Greeter", group: "g", version: "1.0"}},
		{"com.x.Greeter::g", serviceKey{iface: "com.x.Greeter", group: "g"}},
	}
	for _, tt := range tests {
		got, err := parseServiceKey(tt.key)
		if err != nil || got != tt.want {
			t.Errorf("parseServiceKey(%q) = %+v, %v; want %+v", tt.key, got, err, tt.want)
		}
		// The colon form reads back as the same key.
		if again, err := parseServiceKey(got.colonKey()); err != nil || again != got {
			t.Errorf("parseServiceKey(%q) = %+v, %v; want %+v", got.colonKey(), again, err, got)
		}
	}
	for _, key := range []string{"", ":1.0", "g/", "g/a/b", "a b", "::g", ":1.0:g"} {
		if _, err := parseServiceKey(key); !errors.Is(err, registry.ErrInvalid) {
			t.Errorf("parseServiceKey(%q) = %v, want ErrInvalid", key, err)
		}
	}
}

func TestMatchesAsUrlUtilsIsMatch(t *testing.T) {
	url := func(s string) providerURL {
		u, err := parseProviderURL(s)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	const base = "dubbo://10.0.0.1:20880/com.x.G?interface=com.x.G"
	tests := []struct {
		key, url string
		want     bool
	}{
		{"com.x.G", base, true},
		{"com.x.H", base, false},
		{"*", base, true},
		{"com.x.G", "dubbo://10.0.0.1:20880/com.x.G", true}, // the path names the interface
		{"com.x.G", base + "&category=providers", true},
		{"com.x.G", base + "&category=consumers", false},
		{"com.x.G", base + "&category=configurators", false},
		{"com.x.G", base + "&enabled=false", false},
		{"com.x.G", base + "&enabled=true", true},
		{"com.x.G", "rest://10.0.0.1:8080/com.x.G?interface=com.x.G", false},
		{"com.x.G", base + "&group=g1", false},
		{"g1/com.x.G", base + "&group=g1", true},
		{"g1,g2/com.x.G", base + "&group=g2", true},
		{"g1/com.x.G", base, false},
		{"*/com.x.G", base + "&group=g9", true},
		{"com.x.G:1.0", base + "&version=1.0", true},
		{"com.x.G:1.0", base + "&version=2.0", false},
		{"com.x.G", base + "&version=1.0", false},
		{"com.x.G:*", base + "&version=2.0", true},
	}
	for _, tt := range tests {
		k, err := parseServiceKey(tt.key)
		if err != nil {
			t.Fatal(err)
		}
		if got := k.matches(url(tt.url)); got != tt.want {
			t.Errorf("key %q, url %q: matches = %v, want %v", tt.key, tt.url, got, tt.want)
		}
	}
}

func TestJavaWeight(t *testing.T) {
	for v, want := range map[string]int{"": 100, "x": 100, "-3": 100, "0": 1, "7": 7, "200": 200} {
		if got := javaWeight(v); got != want {
			t.Errorf("javaWeight(%q) = %d, want %d", v, got, want)
		}
	}
}
