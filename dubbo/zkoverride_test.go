package dubbo

import (
	"testing"
)

func TestOverridesApplyInJavasOrder(t *testing.T) {
	k, err := parseServiceKey("com.x.G")
	if err != nil {
		t.Fatal(err)
	}
	names := []string{
		zkEncode("override://10.0.0.1:20880/com.x.G?category=configurators&weight=30&priority=2"),
		zkEncode("override://10.0.0.1:20880/com.x.G?category=configurators&weight=20&priority=1"),
		zkEncode("override://0.0.0.0/com.x.G?category=configurators&weight=10&timeout=5"),
		zkEncode("override://0.0.0.0/com.x.H?category=configurators&weight=99"),               // another interface
		zkEncode("override://0.0.0.0/com.x.G?category=providers&weight=99"),                   // not an override's category
		zkEncode("dubbo://0.0.0.0/com.x.G?category=configurators&weight=99"),                  // not an override
		zkEncode("override://0.0.0.0/com.x.G?category=configurators&enabled=false&weight=99"), // switched off
		"%zz",
	}
	var skipped []string
	ovs := overridesFor(k, names, func(name string, err error) { skipped = append(skipped, name) })
	if len(skipped) != 1 || skipped[0] != "%zz" {
		t.Errorf("skipped %v, want the name that is not a URL", skipped)
	}
	if len(ovs) != 3 {
		t.Fatalf("kept %d overrides, want 3", len(ovs))
	}
	// Every host first, then by priority: the last one applied wins.
	if ovs[0].host != anyHost || ovs[1].priority != 1 || ovs[2].priority != 2 {
		t.Errorf("order: %+v", ovs)
	}
	p, err := parseProviderURL("dubbo://10.0.0.1:20880/com.x.G?interface=com.x.G&weight=100&side=provider")
	if err != nil {
		t.Fatal(err)
	}
	got := apply(p, ovs)
	if got.params["weight"] != "30" || got.params["timeout"] != "5" {
		t.Errorf("applied: %v, want weight 30 (priority 2 last) and timeout 5", got.params)
	}
	if _, ok := got.params["category"]; ok {
		t.Errorf("a condition key was copied: %v", got.params)
	}
	if p.params["weight"] != "100" {
		t.Errorf("apply changed the provider's own map: %v", p.params)
	}
	other, _ := parseProviderURL("dubbo://10.0.0.2:20880/com.x.G?interface=com.x.G")
	if got := apply(other, ovs); got.params["weight"] != "10" {
		t.Errorf("another host: weight %q, want only the every-host override's 10", got.params["weight"])
	}
}

func TestOverrideConditions(t *testing.T) {
	p, err := parseProviderURL("dubbo://10.0.0.1:20880/com.x.G?interface=com.x.G&application=inv&side=provider&zone=a")
	if err != nil {
		t.Fatal(err)
	}
	k, _ := parseServiceKey("com.x.G")
	for _, tt := range []struct {
		override string
		applies  bool
	}{
		{"override://0.0.0.0/com.x.G?category=configurators&disabled=true", true},
		{"override://10.0.0.1:20880/com.x.G?category=configurators&disabled=true", true},
		{"override://10.0.0.1:20881/com.x.G?category=configurators&disabled=true", false}, // another port
		{"override://10.0.0.1/com.x.G?category=configurators&disabled=true", false},       // a consumer's host
		{"override://0.0.0.0/com.x.G?category=configurators&disabled=true&application=inv", true},
		{"override://0.0.0.0/com.x.G?category=configurators&disabled=true&application=other", false},
		{"override://0.0.0.0/com.x.G?category=configurators&disabled=true&~zone=a", true},
		{"override://0.0.0.0/com.x.G?category=configurators&disabled=true&~zone=b", false},
		{"override://0.0.0.0/com.x.G?category=configurators&disabled=true&side=consumer", true},
		{"override://0.0.0.0/com.x.G?category=configurators&disabled=true&side=provider", false},
		{"override://0.0.0.0/com.x.G?category=configurators&disabled=true&providerAddresses=10.0.0.1:20880", true},
		{"override://0.0.0.0/com.x.G?category=configurators&disabled=true&providerAddresses=10.0.0.2:20880", false},
	} {
		ovs := overridesFor(k, []string{zkEncode(tt.override)}, func(string, error) { t.Fatalf("%s not parsed", tt.override) })
		if got := disabled(apply(p, ovs)); got != tt.applies {
			t.Errorf("%s: applies = %v, want %v", tt.override, got, tt.applies)
		}
	}
}

func TestDisabledAsRegistryDirectory(t *testing.T) {
	for params, want := range map[string]bool{
		"":                              false,
		"&enabled=false":                true,
		"&disabled=true":                true,
		"&disabled=false&enabled=false": false, // disabled decides when present
		"&disabled=TRUE":                true,
	} {
		p, err := parseProviderURL("dubbo://10.0.0.1:20880/com.x.G?interface=com.x.G" + params)
		if err != nil {
			t.Fatal(err)
		}
		if got := disabled(p); got != want {
			t.Errorf("%q: disabled = %v, want %v", params, got, want)
		}
	}
}
