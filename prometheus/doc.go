// Package prometheus exports what a dabb server does as Prometheus metrics.
// Its Metrics is both an interceptor, for the calls that reach the
// server's interceptors, and a transport.ServerObserver, for the requests
// refused before them and the connections. Give it to the server both ways
// and expose the registry over HTTP:
//
//	import (
//		prom "github.com/prometheus/client_golang/prometheus"
//		"github.com/prometheus/client_golang/prometheus/promhttp"
//		dabbprom "github.com/dabbrpc/dabb/prometheus"
//	)
//
//	m, err := dabbprom.New(prom.DefaultRegisterer)
//	if err != nil {
//		return err
//	}
//	s := dabb.NewServer(dabb.WithObserver(m),
//		dabb.WithInterceptor(m.Interceptor(), dabb.RequireToken(token)))
//	http.Handle("/metrics", promhttp.Handler())
//
// Put m.Interceptor() first: it sees what the interceptors after it
// refuse, auth among them, and times everything they do. The client's
// metrics are in github.com/dabbrpc/dabb/proxy/prometheus; the two share a
// registry without conflict.
//
// # Metrics
//
//	dabb_server_calls_total{service,method,status}           counter
//	dabb_server_handling_duration_seconds{service,method}    histogram
//	dabb_server_in_flight{service,method}                    gauge
//	dabb_server_rejections_total{reason}                     counter
//	dabb_server_connections                                  gauge
//
// calls_total counts the calls that reached the interceptors, by the
// status the server answers (protocol.Status names: "ok", "service
// error", "bad request", ...). handling_duration_seconds is the time from
// the interceptor to the reply, decoding and the handler included,
// encoding not. in_flight is the calls between the two.
//
// rejections_total counts the requests refused without running their
// handler, by reason: "overload" (MaxConcurrent reached, 100), "shutdown"
// (the server drains, 100), "budget_spent" (31), "bad_request" (a frame
// that does not decode, a body over MaxBody, a serialization the server
// did not import: 40), "unimplemented" (no such service or method, 60) and
// "auth" (a call an interceptor refused with code unauthenticated or
// permission_denied). Every reason has a series from the start. An auth
// refusal reached the interceptors, so it is in calls_total too, with its
// status; the others are not.
//
// connections is the number of connections the server holds open.
//
// # Cardinality
//
// service and method take only the names of the registered services and
// methods: a call to one the server does not have is counted under
// rejections, "unimplemented", without its names.
package prometheus
