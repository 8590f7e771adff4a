package prometheus_test

import (
	"log"

	prom "github.com/prometheus/client_golang/prometheus"

	"github.com/dabbrpc/dabb"
	dabbprom "github.com/dabbrpc/dabb/prometheus"
)

// The metrics go to the server twice: as its observer, and as its first
// interceptor, before the token check whose refusals it counts.
func ExampleNew() {
	reg := prom.NewRegistry()
	m, err := dabbprom.New(reg)
	if err != nil {
		log.Fatal(err)
	}
	s := dabb.NewServer(dabb.WithObserver(m),
		dabb.WithInterceptor(m.Interceptor(), dabb.RequireToken("secret")))
	defer s.Close()
	// Serve reg: http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{})).
}
