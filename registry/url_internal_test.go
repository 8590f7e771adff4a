package registry

import (
	"slices"
	"testing"
)

// TestHostListUnescaped: the hosts of a list that needs parseURL's own
// parsing (an IPv6 literal in a list) are unescaped as url.Parse unescapes
// a single host: an IPv6 zone ("%25eth0" in the URL) reaches the backend
// as "%eth0".
func TestHostListUnescaped(t *testing.T) {
	single, err := parseURL("zk://[fe80::1%25eth0]:2181/services")
	if err != nil {
		t.Fatal(err)
	}
	list, err := parseURL("zk://[fe80::1%25eth0]:2181,[::2]:2181/services")
	if err != nil {
		t.Fatal(err)
	}
	one := HostsOf(single)
	two := HostsOf(list)
	if want := []string{one[0], "[::2]:2181"}; !slices.Equal(two, want) {
		t.Fatalf("HostsOf(zk://[fe80::1%%25eth0]:2181,[::2]:2181) = %q, want %q (the zone unescaped, as for a single host)", two, want)
	}
}
