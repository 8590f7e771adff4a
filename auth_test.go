package dabb_test

import (
	"context"
	"crypto/tls"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/internal/tlstest"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
)

// bearer sends credentials as the authorization attachment.
func bearer(credentials string) proxy.CallOption {
	return proxy.Attachment(dabb.AttachAuthorization, credentials)
}

func TestRequireToken(t *testing.T) {
	// observe, outside the token check, keeps the error the server answers.
	rejected := make(chan error, 10)
	observe := func(ctx context.Context, info *dabb.CallInfo, next dabb.CallHandler) (any, error) {
		reply, err := next(ctx)
		if err != nil {
			rejected <- err
		}
		return reply, err
	}
	p := newProbe()
	_, addr := startServer(t, p, dabb.WithInterceptor(observe, dabb.RequireToken("token-one", "token-two")))
	c := newClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	for _, cred := range []string{"Bearer token-one", "Bearer token-two", "bearer token-one"} {
		if _, err := call(ctx, c, "echo", bearer(cred)); err != nil {
			t.Errorf("%q: %v, want admitted", cred, err)
		}
	}
	if n := p.ran.Load(); n != 3 {
		t.Fatalf("the handler ran %d times for 3 admitted calls", n)
	}
	p.ran.Store(0)
	for _, tc := range []struct {
		name string
		opts []proxy.CallOption
		msg  string
	}{
		{"ThirdToken", []proxy.CallOption{bearer("Bearer token-three")}, "invalid bearer token"},
		{"Prefix", []proxy.CallOption{bearer("Bearer token-on")}, "invalid bearer token"},
		{"Longer", []proxy.CallOption{bearer("Bearer token-one2")}, "invalid bearer token"},
		{"Missing", nil, "missing credentials: no authorization attachment"},
		{"Empty", []proxy.CallOption{bearer("")}, "missing credentials: no authorization attachment"},
		{"EmptyToken", []proxy.CallOption{bearer("Bearer ")}, "the authorization attachment is not a bearer token"},
		{"Basic", []proxy.CallOption{bearer("Basic dG9rZW4tb25l")}, "the authorization attachment is not a bearer token"},
		{"Bare", []proxy.CallOption{bearer("token-one")}, "the authorization attachment is not a bearer token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := call(ctx, c, "echo", tc.opts...)
			pe := statusOf(t, err)
			if pe.Status != protocol.StatusBadRequest || pe.Msg != tc.msg {
				t.Errorf("client got %v, want status 40 saying %q", err, tc.msg)
			}
			if !errors.Is(err, proxy.ErrUnauthenticated) || errors.Is(err, proxy.ErrBadRequest) {
				t.Errorf("client got %v, want it to match ErrUnauthenticated and not ErrBadRequest", err)
			}
			var se *protocol.Error
			if err := <-rejected; !errors.As(err, &se) || se.Code != protocol.CodeUnauthenticated ||
				se.Status != protocol.StatusBadRequest || dabb.StatusOf(err) != protocol.StatusBadRequest {
				t.Errorf("the server answered %v, want a status 40 *protocol.Error of code unauthenticated", err)
			}
		})
	}
	if n := p.ran.Load(); n != 0 {
		t.Errorf("the handler ran %d times for rejected calls, want 0", n)
	}
	if n := len(rejected); n != 0 {
		t.Errorf("the server rejected %d attempts more than there were calls: a rejection was retried", n)
	}
}

func TestTokenSet(t *testing.T) {
	tokens := dabb.NewTokenSet("old")
	p := newProbe()
	_, addr := startServer(t, p, dabb.WithInterceptor(tokens.Intercept))
	c := newClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	admits := func(token string) bool {
		t.Helper()
		_, err := call(ctx, c, "echo", bearer("Bearer "+token))
		if err != nil && statusOf(t, err).Status != protocol.StatusBadRequest {
			t.Fatalf("token %q: %v, want ok or status 40", token, err)
		}
		return err == nil
	}
	steps := []struct {
		set       []string
		old, next bool
	}{
		{nil, true, false},                    // as made
		{[]string{"old", "next"}, true, true}, // clients move to next
		{[]string{"next", ""}, false, true},   // old retired; "" ignored
		{[]string{""}, false, false},          // none left: nothing admitted
	}
	for i, st := range steps {
		if i > 0 {
			tokens.Set(st.set...)
		}
		if got := admits("old"); got != st.old {
			t.Errorf("step %d: old admitted %v, want %v", i, got, st.old)
		}
		if got := admits("next"); got != st.next {
			t.Errorf("step %d: next admitted %v, want %v", i, got, st.next)
		}
		if admits("") {
			t.Errorf("step %d: an empty token was admitted", i)
		}
	}

	// The set changes under calls in flight: each call sees one set.
	tokens.Set("a")
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 200 {
			if i%2 == 0 {
				tokens.Set("a", "b")
			} else {
				tokens.Set("a")
			}
		}
	}()
	for range 50 {
		if !admits("a") {
			t.Fatal("token a, in every set, was rejected during a rotation")
		}
	}
	wg.Wait()

	var zero dabb.TokenSet
	next := func(ctx context.Context) (any, error) { return nil, errors.New("the handler ran") }
	info := &dabb.CallInfo{Attachments: map[string]string{dabb.AttachAuthorization: "Bearer a"}}
	if _, err := zero.Intercept(ctx, info, next); statusOf(t, err).Code != protocol.CodeUnauthenticated {
		t.Errorf("the zero TokenSet answered %v, want a rejection", err)
	}
}

// attempts counts what a client reports of its attempts.
type attempts struct {
	attempted, retried, breakerChanged atomic.Int64
}

func (a *attempts) Attempted(service, method, addr string, status protocol.Status, latency time.Duration) {
	a.attempted.Add(1)
}
func (a *attempts) Retried(service, method string, status protocol.Status) { a.retried.Add(1) }
func (a *attempts) BreakerChanged(addr, from, to string)                   { a.breakerChanged.Add(1) }

// TestRequireTokenRejectionsSpareTheInstance: a rejected call, even an
// idempotent one, is not retried, and a hundred of them leave the
// instance's breaker closed.
func TestRequireTokenRejectionsSpareTheInstance(t *testing.T) {
	p := newProbe()
	_, addr := startServer(t, p, dabb.WithInterceptor(dabb.RequireToken("token-one")))
	obs := &attempts{}
	c := newClientWith(t, []proxy.Option{proxy.WithObserver(obs)}, addr)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	for i := range 100 {
		_, err := call(ctx, c, "echo", proxy.Idempotent(), bearer("Bearer token-three"))
		if statusOf(t, err).Status != protocol.StatusBadRequest {
			t.Fatalf("rejection %d: %v, want status 40", i, err)
		}
	}
	if _, err := call(ctx, c, "echo", bearer("Bearer token-one")); err != nil {
		t.Fatalf("a valid call after 100 rejections: %v", err)
	}
	if a, r, b := obs.attempted.Load(), obs.retried.Load(), obs.breakerChanged.Load(); a != 101 || r != 0 || b != 0 {
		t.Errorf("%d attempts, %d retries, %d breaker changes for 101 calls, want 101, 0, 0", a, r, b)
	}
	if n := p.ran.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want once", n)
	}
}

// TestRequireTokenWithCredentialsOverTLS: a client's BearerToken reaches
// RequireToken over TLS. Both rotating tokens are admitted, a third is
// refused with ErrUnauthenticated, and a hundred refusals leave the
// instance's breaker closed: the next good call succeeds at once. Over
// plaintext the client refuses to send the token, unless its credentials
// allow it.
func TestRequireTokenWithCredentialsOverTLS(t *testing.T) {
	ca := tlstest.NewCA(t, "dabb test CA")
	serverCert := ca.Issue(t, tlstest.Spec{CommonName: "server", IPs: tlstest.Loopback})
	var served atomic.Int64 // attempts that reached a server
	count := func(ctx context.Context, info *dabb.CallInfo, next dabb.CallHandler) (any, error) {
		served.Add(1)
		return next(ctx)
	}
	p := newProbe()
	check := dabb.WithInterceptor(count, dabb.RequireToken("t1", "t2"))
	_, tlsAddr := startServer(t, p, check, dabb.WithTLS(&tls.Config{Certificates: []tls.Certificate{serverCert}}))
	_, plainAddr := startServer(t, p, check)

	var token atomic.Value
	var asked atomic.Int64
	source := proxy.BearerToken(func(context.Context) (string, error) {
		asked.Add(1)
		return token.Load().(string), nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	t.Run("TLS", func(t *testing.T) {
		served.Store(0)
		p.ran.Store(0)
		obs := &attempts{}
		c := newClientWith(t, []proxy.Option{proxy.WithObserver(obs), proxy.WithCredentials(source),
			proxy.WithTLS(&tls.Config{RootCAs: ca.Pool()})}, tlsAddr)
		for _, tok := range []string{"t1", "t2"} {
			token.Store(tok)
			if _, err := call(ctx, c, "echo"); err != nil {
				t.Fatalf("token %s: %v, want admitted", tok, err)
			}
		}
		token.Store("t3")
		for i := range 100 {
			_, err := call(ctx, c, "echo", proxy.Idempotent())
			if !errors.Is(err, proxy.ErrUnauthenticated) || !strings.Contains(err.Error(), "invalid bearer token") {
				t.Fatalf("token t3, call %d: %v, want one matching proxy.ErrUnauthenticated", i, err)
			}
		}
		if st := c.BreakerState(tlsAddr); st != "closed" {
			t.Fatalf("the breaker is %s after 100 refusals, want closed", st)
		}
		token.Store("t1")
		before := obs.attempted.Load()
		if _, err := call(ctx, c, "echo"); err != nil {
			t.Fatalf("token t1 after 100 refusals: %v", err)
		}
		if a := obs.attempted.Load() - before; a != 1 {
			t.Errorf("the good call after the refusals took %d attempts, want 1", a)
		}
		if s, r, b := served.Load(), obs.retried.Load(), obs.breakerChanged.Load(); s != 103 || r != 0 || b != 0 {
			t.Errorf("103 calls: the server saw %d attempts, the client retried %d and changed a breaker %d times; want 103, 0, 0", s, r, b)
		}
		if n := p.ran.Load(); n != 3 {
			t.Errorf("the handler ran %d times, want 3: the admitted calls only", n)
		}
	})
	t.Run("plaintext refused", func(t *testing.T) {
		served.Store(0)
		asked.Store(0)
		token.Store("t1")
		c := newClientWith(t, []proxy.Option{proxy.WithCredentials(source)}, plainAddr)
		_, err := call(ctx, c, "echo")
		if !errors.Is(err, proxy.ErrNotSent) || !errors.Is(err, proxy.ErrInsecureCredentials) {
			t.Fatalf("%v, want one matching proxy.ErrNotSent and proxy.ErrInsecureCredentials", err)
		}
		if pe := statusOf(t, err); pe.Remote || !strings.Contains(err.Error(), "require TLS") {
			t.Errorf("%#v, want a local error saying the credentials require TLS", pe)
		}
		if s, a := served.Load(), asked.Load(); s != 0 || a != 0 {
			t.Errorf("the server saw %d attempts and the token source was asked %d times; want 0 and 0", s, a)
		}
	})
	t.Run("plaintext allowed", func(t *testing.T) {
		served.Store(0)
		token.Store("t2")
		c := newClientWith(t, []proxy.Option{proxy.WithCredentials(plaintextOK{source})}, plainAddr)
		if _, err := call(ctx, c, "echo"); err != nil {
			t.Fatalf("credentials that allow plaintext: %v, want admitted", err)
		}
		if s := served.Load(); s != 1 {
			t.Errorf("the server saw %d attempts, want 1", s)
		}
	})
}
