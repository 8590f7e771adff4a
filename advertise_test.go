package dabb

import (
	"net"
	"testing"
)

func TestAdvertiseAddr(t *testing.T) {
	tests := []struct {
		name       string
		configured string
		listen     *net.TCPAddr
		exact      string // the exact answer, or "" for "a real host, same port"
	}{
		{"configured wins", "10.1.2.3:9000", &net.TCPAddr{IP: net.IPv4zero, Port: 20880}, "10.1.2.3:9000"},
		{"specific host kept", "", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 20880}, "127.0.0.1:20880"},
		{"0.0.0.0 replaced", "", &net.TCPAddr{IP: net.IPv4zero, Port: 20880}, ""},
		{":: replaced", "", &net.TCPAddr{IP: net.IPv6unspecified, Port: 20881}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := advertiseAddr(tt.configured, tt.listen)
			if err != nil {
				t.Fatal(err)
			}
			if tt.exact != "" {
				if got != tt.exact {
					t.Fatalf("got %q, want %q", got, tt.exact)
				}
				return
			}
			host, port, err := net.SplitHostPort(got)
			if err != nil {
				t.Fatalf("%q: %v", got, err)
			}
			if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
				t.Fatalf("advertised %q: the host must be a real address", got)
			}
			if port != "20880" && port != "20881" {
				t.Fatalf("advertised %q: the port changed", got)
			}
		})
	}
}
