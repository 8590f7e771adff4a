package proxy_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/transport"
)

// plaintextOK wraps credentials that require TLS into ones that allow a
// plaintext connection, as a trusted test network might.
type plaintextOK struct{ proxy.Credentials }

func (plaintextOK) RequireTransportSecurity() bool { return false }

func (p plaintextOK) String() string { return fmt.Sprint(p.Credentials) }

// tokens is a token source that counts its calls and returns "t1", "t2", ...
type tokens struct{ n atomic.Int64 }

func (s *tokens) next(context.Context) (string, error) {
	return "t" + strconv.FormatInt(s.n.Add(1), 10), nil
}

// TestCredentialsOverPlaintextRefused: a client without TLS refuses to
// send credentials that require it. Nothing reaches the server, and the
// token source is not even asked.
func TestCredentialsOverPlaintextRefused(t *testing.T) {
	s := &seen{}
	addr := serve(t, s, 0, transport.ServerConfig{})
	src := &tokens{}
	c := client(t, []string{addr}, proxy.WithCredentials(proxy.BearerToken(src.next)))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	_, err := invoke(ctx, c)
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Remote || pe.Status != protocol.StatusClientError {
		t.Fatalf("got %v, want a local 90", err)
	}
	if !errors.Is(err, proxy.ErrNotSent) || !errors.Is(err, proxy.ErrInsecureCredentials) || !errors.Is(err, proxy.ErrBadRequest) {
		t.Errorf("%v: want ErrNotSent, ErrInsecureCredentials and ErrBadRequest", err)
	}
	for _, want := range []string{"bearer token", "TLS", "test.Svc.M", "not sent"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
	if strings.Count(err.Error(), "require TLS") != 1 {
		t.Errorf("%q repeats itself", err)
	}
	if n := s.runs.Load(); n != 0 {
		t.Errorf("the server ran %d calls; want none", n)
	}
	if n := src.n.Load(); n != 0 {
		t.Errorf("the token source was asked %d times; want never", n)
	}
}

// TestBearerTokenSendsTheAttachment: each call carries the token source's
// latest token, so a token that refreshes is sent from the next call on.
func TestBearerTokenSendsTheAttachment(t *testing.T) {
	s := &seen{}
	addr := serve(t, s, 0, transport.ServerConfig{})
	src := &tokens{}
	c := client(t, []string{addr}, proxy.WithCredentials(plaintextOK{proxy.BearerToken(src.next)}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	for i := 1; i <= 3; i++ {
		if _, err := invoke(ctx, c); err != nil {
			t.Fatal(err)
		}
		s.mu.Lock()
		got := s.attachments[protocol.AttachAuthorization]
		s.mu.Unlock()
		if want := "Bearer t" + strconv.Itoa(i); got != want {
			t.Errorf("call %d carried authorization %q, want %q", i, got, want)
		}
	}
}

// TestCredentialsErrorIsNotSent: credentials that fail, or that a call's
// deadline cuts off, fail the call unsent, naming the credentials.
func TestCredentialsErrorIsNotSent(t *testing.T) {
	s := &seen{}
	addr := serve(t, s, 0, transport.ServerConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	broken := errors.New("token endpoint said 503")
	for _, tc := range []struct {
		name   string
		source func(context.Context) (string, error)
		status protocol.Status
		is     error
	}{
		{"source fails", func(context.Context) (string, error) { return "", broken }, protocol.StatusClientError, broken},
		{"empty token", func(context.Context) (string, error) { return "", nil }, protocol.StatusClientError, proxy.ErrBadRequest},
		{"source outlives the call", func(ctx context.Context) (string, error) {
			<-ctx.Done()
			return "", fmt.Errorf("fetch token: %w", ctx.Err())
		}, protocol.StatusClientTimeout, proxy.ErrTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := client(t, []string{addr}, proxy.WithCredentials(plaintextOK{proxy.BearerToken(tc.source)}))
			start := time.Now()
			_, err := invoke(ctx, c, proxy.Timeout(200*time.Millisecond))
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("the call took %v with a 200ms timeout", d)
			}
			var pe *protocol.Error
			if !errors.As(err, &pe) || pe.Remote || pe.Status != tc.status {
				t.Fatalf("got %v, want a local %d", err, tc.status)
			}
			if !errors.Is(err, proxy.ErrNotSent) || !errors.Is(err, tc.is) {
				t.Errorf("%v: want ErrNotSent and %v", err, tc.is)
			}
			if !strings.Contains(err.Error(), "credentials (bearer token) for test.Svc.M") {
				t.Errorf("%q does not name the credentials and the call", err)
			}
		})
	}
	if n := s.runs.Load(); n != 0 {
		t.Errorf("the server ran %d calls; want none", n)
	}
}

// hmacSigner signs each call's service, method and time with a shared
// key. The signature reveals no key and names its call, so it may travel
// in plaintext, unlike a bearer token.
type hmacSigner struct {
	key []byte
	now func() time.Time
}

func (h hmacSigner) Attachments(_ context.Context, service, method string) (map[string]string, error) {
	ts := strconv.FormatInt(h.now().Unix(), 10)
	return map[string]string{"x-timestamp": ts, "x-signature": sign(h.key, service, method, ts)}, nil
}

func (hmacSigner) RequireTransportSecurity() bool { return false }

func sign(key []byte, service, method, ts string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(service + "\n" + method + "\n" + ts))
	return hex.EncodeToString(m.Sum(nil))
}

// TestHMACCredentialsOverPlaintext: credentials that do not require
// transport security travel without TLS, and the server can check them.
func TestHMACCredentialsOverPlaintext(t *testing.T) {
	key := []byte("shared secret")
	s := &seen{}
	addr := serve(t, s, 0, transport.ServerConfig{})
	c := client(t, []string{addr}, proxy.WithCredentials(hmacSigner{key, time.Now}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if _, err := invoke(ctx, c); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	att := s.attachments
	s.mu.Unlock()
	ts, sig := att["x-timestamp"], att["x-signature"]
	if ts == "" || !hmac.Equal([]byte(sig), []byte(sign(key, service, "M", ts))) {
		t.Errorf("the server cannot verify the signature in %q", att)
	}
	if hmac.Equal([]byte(sig), []byte(sign(key, service, "Other", ts))) {
		t.Error("the signature does not name its method")
	}
}

// TestCredentialsStageOrder: middlewares given after WithCredentials see
// its attachments, those given before do not.
func TestCredentialsStageOrder(t *testing.T) {
	addr := serve(t, &seen{}, 0, transport.ServerConfig{})
	saw := func(got *string) proxy.Middleware {
		return func(next proxy.Invoker) proxy.Invoker {
			return func(ctx context.Context, call *proxy.Call) error {
				*got = call.Attachments[protocol.AttachAuthorization]
				return next(ctx, call)
			}
		}
	}
	var before, after string
	src := &tokens{}
	c := client(t, []string{addr}, proxy.WithMiddleware(saw(&before)),
		proxy.WithCredentials(plaintextOK{proxy.BearerToken(src.next)}), proxy.WithMiddleware(saw(&after)))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if _, err := invoke(ctx, c); err != nil {
		t.Fatal(err)
	}
	if before != "" || after != "Bearer t1" {
		t.Errorf("middleware before saw %q, after saw %q; want nothing and %q", before, after, "Bearer t1")
	}
}
