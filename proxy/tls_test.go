package proxy_test

import (
	"context"
	"crypto/tls"
	"errors"
	"strings"
	"testing"

	"github.com/dabbrpc/dabb/internal/tlstest"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
	"github.com/dabbrpc/dabb/transport"
)

// TestWithTLS: the client verifies each instance against its
// tls_server_name metadata, or its address's host; an instance whose
// handshake fails is not sent to, and the call goes to another.
func TestWithTLS(t *testing.T) {
	ca, other := tlstest.NewCA(t, "dabb test CA"), tlstest.NewCA(t, "another CA")
	named := ca.Issue(t, tlstest.Spec{CommonName: "named", DNSNames: []string{"dabb.test"}})
	byIP := ca.Issue(t, tlstest.Spec{CommonName: "by ip", IPs: tlstest.Loopback})
	impostor := other.Issue(t, tlstest.Spec{CommonName: "impostor", IPs: tlstest.Loopback})
	serveTLS := func(cert tls.Certificate) string {
		return serve(t, &seen{}, 0, transport.ServerConfig{TLS: &tls.Config{Certificates: []tls.Certificate{cert}}})
	}
	clientTLS := &tls.Config{RootCAs: ca.Pool()}
	namedAddr, ipAddr, impostorAddr := serveTLS(named), serveTLS(byIP), serveTLS(impostor)
	instance := func(addr, name string) registry.Instance {
		in := registry.Instance{Service: service, ID: addr, Addr: addr}
		if name != "" {
			in.Metadata = map[string]string{proxy.MetadataTLSServerName: name}
		}
		return in
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	tests := []struct {
		name string
		ins  []registry.Instance
		opts []proxy.Option
		want string // the instance answering, or "" for a failure
		err  string // in the failure
	}{
		{"tls_server_name honored", []registry.Instance{instance(namedAddr, "dabb.test")}, nil, namedAddr, ""},
		{"host without tls_server_name", []registry.Instance{instance(namedAddr, "")}, nil, "", "name mismatch"},
		{"IP host", []registry.Instance{instance(ipAddr, "")}, nil, ipAddr, ""},
		{"WithTransport after WithTLS keeps TLS", []registry.Instance{instance(ipAddr, "")},
			[]proxy.Option{proxy.WithTransport(transport.Config{ConnsPerAddr: 1})}, ipAddr, ""},
		{"unknown authority", []registry.Instance{instance(impostorAddr, "")}, nil, "", "unknown authority"},
		{"retried elsewhere", []registry.Instance{instance(impostorAddr, ""), instance(ipAddr, "")},
			[]proxy.Option{proxy.WithBalancer("round_robin")}, ipAddr, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := append([]proxy.Option{proxy.WithLogger(quiet), proxy.WithTLS(clientTLS)}, tt.opts...)
			c := newClient(t, static.New(tt.ins...), opts...)
			defer c.Close()
			for range 4 { // round robin visits both instances
				got, err := invoke(ctx, c)
				if tt.want != "" {
					if err != nil || got != tt.want {
						t.Fatalf("call = %q, %v; want an answer from %s", got, err, tt.want)
					}
					continue
				}
				if !errors.Is(err, proxy.ErrNotSent) || !strings.Contains(err.Error(), "TLS") || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("call = %q, %v; want a not-sent error naming TLS and %q", got, err, tt.err)
				}
			}
		})
	}
}
