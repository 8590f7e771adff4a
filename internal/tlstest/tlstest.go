// Package tlstest makes certificate authorities and certificates for tests.
//
//	ca := tlstest.NewCA(t, "test CA")
//	srv := ca.Issue(t, tlstest.Spec{CommonName: "server", DNSNames: []string{"dabb.test"}, IPs: tlstest.Loopback})
//	cli := ca.Issue(t, tlstest.Spec{CommonName: "client", Client: true})
//	serverTLS := &tls.Config{Certificates: []tls.Certificate{srv}, ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert}
//	clientTLS := &tls.Config{Certificates: []tls.Certificate{cli}, RootCAs: ca.Pool()}
//
// Keys are ECDSA P-256, so making them is quick.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/url"
	"sync/atomic"
	"testing"
	"time"
)

// Loopback is the IP SAN of a certificate for 127.0.0.1.
var Loopback = []net.IP{net.IPv4(127, 0, 0, 1)}

// CA is a certificate authority.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// Spec describes a certificate to issue.
type Spec struct {
	CommonName   string
	Organization string
	DNSNames     []string
	IPs          []net.IP
	URIs         []string
	// Client makes a client certificate; otherwise it is a server's.
	Client bool
}

var serial atomic.Int64

func nextSerial() *big.Int { return big.NewInt(serial.Add(1) + time.Now().UnixNano()) }

// NewCA returns a new self-signed authority named name.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          nextSerial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{cert: cert, key: key}
}

// Certificate returns the authority's own certificate.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// Pool returns a pool holding the authority's certificate alone.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// Issue returns a certificate the authority signs, with its key.
func (ca *CA) Issue(t testing.TB, s Spec) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	usage := x509.ExtKeyUsageServerAuth
	if s.Client {
		usage = x509.ExtKeyUsageClientAuth
	}
	tmpl := &x509.Certificate{
		SerialNumber: nextSerial(),
		Subject:      pkix.Name{CommonName: s.CommonName},
		DNSNames:     s.DNSNames,
		IPAddresses:  s.IPs,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	if s.Organization != "" {
		tmpl.Subject.Organization = []string{s.Organization}
	}
	for _, u := range s.URIs {
		parsed, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, parsed)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
}
