// The built-in health service (dabb.Health), SetServing, and the probes' Live and Ready.

package dabb

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	_ "github.com/dabbrpc/dabb/codec/json" // the built-in services speak JSON
	"github.com/dabbrpc/dabb/health"
)

// Why a probe fails: the errors Live and Ready return.
var (
	errStopped    = errors.New("dabb: server stopped")
	errNoServe    = errors.New("dabb: no Serve running")
	errShutting   = errors.New("dabb: shutting down")
	errUnlisted   = errors.New("dabb: not published to the registry")
	errSetNotSrvg = errors.New("dabb: set not serving (SetServing)")
)

// healthState is what a Server's health service and probes answer from.
type healthState struct {
	// shutting is set when Shutdown or Close begins, and never cleared.
	shutting atomic.Bool
	// draining is set when a Shutdown begins while a Serve runs: the
	// server still serves, though its Serves may have returned.
	draining atomic.Bool
	// stopped is set when Close is called or a Shutdown returns.
	stopped atomic.Bool
	// serves counts the Serve calls running.
	serves atomic.Int32

	mu   sync.RWMutex
	down map[string]bool // the names SetServing(name, false) was given
}

// healthDesc describes the health service. Its one method is marked
// idempotent: Check only reads.
var healthDesc = ServiceDesc{
	Name: health.ServiceName,
	Methods: []MethodDesc{{
		Name:       health.MethodCheck,
		Idempotent: true,
		Handler: func(srv any, _ context.Context, dec func(any) error) (any, error) {
			req := new(health.CheckRequest)
			if err := dec(req); err != nil {
				return nil, err
			}
			return &health.CheckReply{Status: srv.(*Server).status(req.Service)}, nil
		},
	}},
}

// healthService returns s's health service, for its service table. open
// says its calls skip the credential checks.
func (s *Server) healthService(open bool) *service {
	svc, err := newService(&healthDesc, s)
	if err != nil {
		panic("dabb: the health service's description is invalid: " + err.Error()) // a bug in dabb, caught by every test
	}
	svc.builtin, svc.open = true, open
	return svc
}

// status answers Check(service). An empty service is the server as a whole.
func (s *Server) status(service string) health.Status {
	if service != "" {
		if _, ok := (*s.services.Load())[service]; !ok {
			return health.Unknown
		}
	}
	if s.health.shutting.Load() {
		return health.NotServing
	}
	s.health.mu.RLock()
	down := s.health.down[service]
	s.health.mu.RUnlock()
	if down {
		return health.NotServing
	}
	return health.Serving
}

// SetServing sets what the health service answers for service: serving or
// not serving. The empty service is the server as a whole; the ready probe
// (Ready) reads it, and not the other services. Every service is serving
// until SetServing says otherwise.
//
// As with gRPC's health service, it only reports: a service set not
// serving still runs the calls it gets. Clients and operators that ask
// health.ServiceName decide what to do.
//
// A name that is not registered is remembered. Check answers unknown for
// it until it is registered, and then what was set. Once Shutdown or Close
// has begun every service is not serving, whatever was set.
func (s *Server) SetServing(service string, serving bool) {
	s.health.mu.Lock()
	defer s.health.mu.Unlock()
	if serving {
		delete(s.health.down, service)
		return
	}
	if s.health.down == nil {
		s.health.down = map[string]bool{}
	}
	s.health.down[service] = true
}

// beginStop marks every service not serving, at the start of a Shutdown
// or Close, before the withdrawal and the read-only event.
func (s *Server) beginStop(graceful bool) {
	if graceful && s.health.serves.Load() > 0 {
		s.health.draining.Store(true)
	}
	s.health.shutting.Store(true)
}

// Live reports whether the server serves, for a liveness probe. It
// returns nil while a Serve runs, and through a Shutdown until Shutdown
// returns. It returns an error saying why otherwise: no Serve has begun or
// every one returned, or the server is closed. A Serve that fails to
// publish at start, or whose listener fails, thus makes the server not
// live once it returns.
func (s *Server) Live() error {
	switch {
	case s.health.stopped.Load():
		return errStopped
	case s.health.serves.Load() > 0, s.health.draining.Load():
		return nil
	}
	return errNoServe
}

// Ready reports whether the server should be sent calls, for a readiness
// probe. It returns nil when a Serve runs, every running Serve has
// published every service to the registry (always true without one), the
// server as a whole is serving (SetServing("", ...)) and no Shutdown or
// Close has begun. Otherwise it returns an error saying which failed.
// With WithRegistryCheck(false) a server is thus not ready until its
// background publishing succeeds.
func (s *Server) Ready() error {
	serves := s.health.serves.Load()
	switch {
	case s.health.shutting.Load():
		return errShutting
	case serves == 0:
		return errNoServe
	case !s.pub.listed(serves):
		return errUnlisted
	case s.status("") != health.Serving:
		return errSetNotSrvg
	}
	return nil
}
