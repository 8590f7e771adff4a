package dabb_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dabbrpc/dabb"
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
			if pe.Status != protocol.StatusBadRequest || pe.Msg != tc.msg || !errors.Is(err, proxy.ErrBadRequest) {
				t.Errorf("client got %v, want status 40 saying %q", err, tc.msg)
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
