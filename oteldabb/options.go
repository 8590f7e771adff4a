// Options of the middleware and the interceptor: the TracerProvider and the propagator.

package oteldabb

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
)

// instrumentation is the name of the tracers this package makes.
const instrumentation = "github.com/dabbrpc/dabb/oteldabb"

// Option configures ClientMiddleware and ServerInterceptor.
type Option func(*config)

type config struct {
	provider   trace.TracerProvider
	propagator propagation.TextMapPropagator
}

// WithTracerProvider makes the spans with tp. Default
// otel.GetTracerProvider(); nil keeps the default.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) {
		if tp != nil {
			c.provider = tp
		}
	}
}

// WithPropagators carries the trace context and baggage in attachments
// with p. Default otel.GetTextMapPropagator(); nil keeps the default.
func WithPropagators(p propagation.TextMapPropagator) Option {
	return func(c *config) {
		if p != nil {
			c.propagator = p
		}
	}
}

// newConfig applies opts over the defaults and returns the tracer.
func newConfig(opts []Option) (*config, trace.Tracer) {
	c := &config{provider: otel.GetTracerProvider(), propagator: otel.GetTextMapPropagator()}
	for _, o := range opts {
		if o != nil {
			o(c)
		}
	}
	return c, c.provider.Tracer(instrumentation, trace.WithSchemaURL(semconv.SchemaURL))
}
