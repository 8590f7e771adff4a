package probe_test

import (
	"log"
	"net/http"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/health/probe"
)

// The probes on an HTTP port of their own, beside the dabb port: a
// Kubernetes pod points its livenessProbe at /healthz/live and its
// readinessProbe at /healthz/ready.
func ExampleHandler() {
	s := dabb.NewServer()
	// register services here
	mux := http.NewServeMux()
	mux.Handle("/healthz/", probe.Handler(s))
	go func() { log.Fatal(http.ListenAndServe("127.0.0.1:8080", mux)) }()
	log.Fatal(s.ListenAndServe("127.0.0.1:20880"))
}
