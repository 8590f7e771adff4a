package dabb_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log"
	"os"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
)

// mTLS on both sides: the server asks every client for a certificate from
// its CA, and the client verifies the server against the instance's host,
// or its tls_server_name metadata. The files are PEM.
func ExampleWithTLS() {
	ca, err := os.ReadFile("ca.pem")
	if err != nil {
		log.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	serverCert, err := tls.LoadX509KeyPair("server.pem", "server-key.pem")
	if err != nil {
		log.Fatal(err)
	}
	var reg registry.Registry // etcd or ZooKeeper: see registry.Open
	s := dabb.NewServer(dabb.WithRegistry(reg),
		// Published by IP, the instance presents a certificate for a name.
		dabb.WithInstance(0, map[string]string{proxy.MetadataTLSServerName: "inventory.internal"}),
		dabb.WithTLS(&tls.Config{
			Certificates: []tls.Certificate{serverCert},
			ClientCAs:    pool,
			ClientAuth:   tls.RequireAndVerifyClientCert,
		}))
	go s.ListenAndServe(":20880")

	clientCert, err := tls.LoadX509KeyPair("client.pem", "client-key.pem")
	if err != nil {
		log.Fatal(err)
	}
	c, err := proxy.NewClient(reg, proxy.WithTLS(&tls.Config{
		Certificates: []tls.Certificate{clientCert},
		RootCAs:      pool,
	}))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
}

// A handler reads the verified client certificate of its call.
func ExampleRemotePeer() {
	handler := func(ctx context.Context) (string, error) {
		p, ok := dabb.RemotePeer(ctx)
		if !ok || p.TLS == nil || len(p.TLS.VerifiedChains) == 0 {
			return "", fmt.Errorf("no verified client certificate")
		}
		return p.TLS.VerifiedChains[0][0].Subject.CommonName, nil
	}
	_ = handler
}

// Only the payments service, named by its SPIFFE ID, may call.
func ExampleRequirePeerIdentity() {
	allow := dabb.RequirePeerIdentity(dabb.Identities{URIs: []string{"spiffe://example.org/payments"}})
	_ = allow // an Interceptor: give it to the server's interceptor chain
}
