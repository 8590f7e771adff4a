// The run's TLS certificates: a CA made at start, shared with the server processes.

package frameworks

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"sync"
	"time"
)

// TLSEnv is the environment variable that hands the run's certificates to
// a server process. Its value is PEM: the CA's certificate, the server's
// certificate and the server's private key. A process without it makes
// its own on first use. The keys live for one run and protect nothing.
const TLSEnv = "DABBBENCH_TLS"

// errTLSEnv reports a TLSEnv value that is not the three PEM blocks.
var errTLSEnv = errors.New("frameworks: " + TLSEnv)

// benchCerts is one run's certificates, parsed.
type benchCerts struct {
	pem    []byte         // CA certificate, server certificate, server key
	roots  *x509.CertPool // the CA
	server tls.Certificate
}

// certs returns this process's certificates: TLSEnv's, or new ones.
var certs = sync.OnceValues(func() (*benchCerts, error) {
	if v := os.Getenv(TLSEnv); v != "" {
		c, err := parseCerts([]byte(v))
		if err != nil {
			return nil, fmt.Errorf("%w: %w", errTLSEnv, err)
		}
		return c, nil
	}
	pemBytes, err := newCerts(time.Now())
	if err != nil {
		return nil, fmt.Errorf("frameworks: make TLS certificates: %w", err)
	}
	return parseCerts(pemBytes)
})

// TLSEnviron returns "TLSEnv=<PEM>" for the environment of a server
// process, so that it serves the certificate this process's clients trust.
func TLSEnviron() (string, error) {
	c, err := certs()
	if err != nil {
		return "", err
	}
	return TLSEnv + "=" + string(c.pem), nil
}

// serverTLS is the server side: TLS 1.3 only, the run's certificate.
func serverTLS() (*tls.Config, error) {
	c, err := certs()
	if err != nil {
		return nil, err
	}
	return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{c.server}}, nil
}

// clientTLS is the client side: TLS 1.3 only, trusting the run's CA. The
// server name is left to the framework: the host of the address it dials.
func clientTLS() (*tls.Config, error) {
	c, err := certs()
	if err != nil {
		return nil, err
	}
	return &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: c.roots}, nil
}

// newCerts makes a CA and a server certificate for 127.0.0.1, ::1 and
// localhost, valid for a day from now, ECDSA P-256. It returns them as
// TLSEnv's PEM.
func newCerts(now time.Time) ([]byte, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	ca := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "dabbbench CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, caKey.Public(), caKey)
	if err != nil {
		return nil, err
	}
	// The template's parent must be the parsed CA, so the issuer matches
	// it byte for byte.
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "dabbbench server"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames:     []string{"localhost"},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, caCert, key.Public(), caKey)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	for _, blk := range []*pem.Block{{Type: "CERTIFICATE", Bytes: caDER}, {Type: "CERTIFICATE", Bytes: leafDER}, {Type: "PRIVATE KEY", Bytes: keyDER}} {
		if err := pem.Encode(&b, blk); err != nil {
			return nil, err
		}
	}
	return b.Bytes(), nil
}

// parseCerts reads TLSEnv's PEM: the CA, then the server's certificate
// and key.
func parseCerts(pemBytes []byte) (*benchCerts, error) {
	caBlock, rest := pem.Decode(pemBytes)
	if caBlock == nil || caBlock.Type != "CERTIFICATE" {
		return nil, errors.New("no CA certificate first")
	}
	ca, err := x509.ParseCertificate(caBlock.Bytes)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	server, err := tls.X509KeyPair(rest, rest)
	if err != nil {
		return nil, fmt.Errorf("server certificate: %w", err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	return &benchCerts{pem: pemBytes, roots: roots, server: server}, nil
}
