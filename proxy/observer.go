// Observer: what the client reports of its attempts, retries and breakers.

package proxy

import (
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

// Observer is told what the client does: each attempt with its instance,
// status and latency; each retry; each change of an instance's circuit
// breaker. Its methods are called on the call path and must be quick and
// safe for concurrent use. proxy/prometheus implements it.
type Observer interface {
	// Attempted reports one attempt; status is protocol.StatusOK on
	// success, else the status of the error.
	Attempted(service, method, addr string, status protocol.Status, latency time.Duration)
	// Retried reports that a call is about to be tried again after an
	// attempt failed with status.
	Retried(service, method string, status protocol.Status)
	// BreakerChanged reports a breaker changing state ("closed",
	// "half-open", "open").
	BreakerChanged(addr, from, to string)
}
