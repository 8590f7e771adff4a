// Package prometheus exports what a dabb client does as Prometheus metrics.
// Its Observer implements proxy.Observer: give it to the client and expose
// the registry over HTTP.
//
//	import (
//		prom "github.com/prometheus/client_golang/prometheus"
//		"github.com/prometheus/client_golang/prometheus/promhttp"
//		dabbprom "github.com/dabbrpc/dabb/proxy/prometheus"
//	)
//
//	obs, err := dabbprom.New(prom.DefaultRegisterer)
//	if err != nil {
//		return err
//	}
//	c, err := proxy.NewClient(reg, proxy.WithObserver(obs))
//	if err != nil {
//		return err
//	}
//	defer c.Close()
//	http.Handle("/metrics", promhttp.Handler())
//
// With a registry of your own, serve it with
// promhttp.HandlerFor(myRegistry, promhttp.HandlerOpts{}).
//
// # Metrics
//
//	dabb_client_attempts_total{service,method,instance,status}  counter
//	dabb_client_attempt_duration_seconds{service,method}        histogram
//	dabb_client_retries_total{service,method,reason}            counter
//	dabb_client_breaker_state{instance}                         gauge: 0 closed, 1 half-open, 2 open
//	dabb_client_breaker_transitions_total{instance,to}          counter
//
// status and reason are protocol.Status names ("ok", "service error",
// "server threadpool exhausted", ...); reason is the status of the attempt
// that failed and is being tried again. instance is the address the attempt
// went to. An instance has a breaker_state series once its breaker has
// changed state; no series means it is closed. The gauges show the last
// state the client reported: the breaker of an instance that left the
// registry while open stays open there.
//
// # Cardinality
//
// The instance label makes one series per instance address, for every
// service, method and status it served. Where instances come and go often
// (autoscaling, containers with fresh addresses) that adds up without bound,
// since a series lives as long as the Observer. WithoutInstanceLabel drops
// it: attempts are counted per service, method and status, transitions per
// target state, and the per-instance breaker_state gauge gives way to
//
//	dabb_client_breakers{state}  gauge: how many instances are "half-open" or "open"
//
// # Several clients
//
// One Observer can serve every client of a process; an instance's breaker
// gauges then show whichever client reported last. New registers the
// metrics, so it fails with prom.AlreadyRegisteredError on a registry that
// already holds them. To tell clients apart, give each its own Observer on
// a registerer that adds a label:
// prom.WrapRegistererWith(prom.Labels{"client": "orders"}, prom.DefaultRegisterer).
package prometheus
