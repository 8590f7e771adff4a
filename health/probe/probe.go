// Package probe serves a dabb server's health over HTTP, for
// Kubernetes-style liveness and readiness probes. Mount its Handler:
//
//	mux.Handle("/healthz/", probe.Handler(server)) // /healthz/live, /healthz/ready
//
// It is a package of its own so that a program that mounts no probe links
// no HTTP server: the dabb package imports health, for the wire names of
// the health service, and nothing of net/http.
package probe

import (
	"net/http"
	"path"
)

// Prober answers the two probes. *dabb.Server implements it. Each method
// is called on every probe request, so it must answer at once, without
// I/O.
type Prober interface {
	// Live returns nil while the process serves, or an error saying why
	// it does not. A failing liveness probe asks for a restart.
	Live() error
	// Ready returns nil while the process should be sent calls, or an
	// error saying why it should not. A failing readiness probe takes
	// the process out of rotation.
	Ready() error
}

// Handler returns an http.Handler that answers p's probes. It looks at
// the last element of the request's path only:
//
//	GET …/live   200 "live\n"  or 503 "not live: <why>\n"
//	GET …/ready  200 "ready\n" or 503 "not ready: <why>\n"
//
// The application mounts it where it wants:
//
//	mux.Handle("/healthz/", probe.Handler(server)) // /healthz/live, /healthz/ready
//	mux.Handle("/live", probe.Handler(server))      // or each at a path of its own
//	mux.Handle("/ready", probe.Handler(server))
//
// Any other path is answered 404, and a method other than GET or HEAD
// 405. HEAD gets the status alone. Bodies are text/plain and marked not
// to be cached. With a nil p, every request is answered 500.
func Handler(p Prober) http.Handler { return handler{p} }

type handler struct{ p Prober }

func (h handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.p == nil {
		reply(w, r, http.StatusInternalServerError, "probe: Handler was given a nil Prober\n")
		return
	}
	name := path.Base(r.URL.Path)
	var probe func() error
	switch name {
	case "live":
		probe = h.p.Live
	case "ready":
		probe = h.p.Ready
	default:
		reply(w, r, http.StatusNotFound, "probe: no probe at "+r.URL.Path+"; the probes are …/live and …/ready\n")
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		reply(w, r, http.StatusMethodNotAllowed, "probe: probes answer GET and HEAD\n")
		return
	}
	if err := probe(); err != nil {
		reply(w, r, http.StatusServiceUnavailable, "not "+name+": "+err.Error()+"\n")
		return
	}
	reply(w, r, http.StatusOK, name+"\n")
}

// reply writes status and, unless r is a HEAD, body.
func reply(w http.ResponseWriter, r *http.Request, status int, body string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		_, _ = w.Write([]byte(body))
	}
}
