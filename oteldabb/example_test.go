package oteldabb_test

import (
	"log"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/oteldabb"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry/static"
)

// A server whose handlers call on: its interceptor starts the server
// span, and its client's middleware makes the handlers' calls its
// children. OpenTelemetry's global propagator carries nothing until one
// is set.
func Example() {
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(
		propagation.TraceContext{}, propagation.Baggage{}))
	c, err := proxy.NewClient(static.New(), proxy.WithMiddleware(oteldabb.ClientMiddleware()))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	s := dabb.NewServer(dabb.WithInterceptor(oteldabb.ServerInterceptor()))
	defer s.Close()
}
