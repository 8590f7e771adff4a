// Package health defines dabb's health service on the wire: its name, its
// method and its messages. Every dabb.Server serves it; dabb.Server's
// SetServing and Shutdown change what it answers. Package health/probe
// serves a server's liveness and readiness over HTTP, for Kubernetes-style
// probes.
//
// The service is called like any other, with the JSON codec:
//
//	dabb.Health/Check {"service":"inventory.Inventory"} → {"status":"serving"}
//
// An empty service asks about the server as a whole. The request is a JSON
// object: {} asks about the server as a whole too.
package health

// ServiceName is the health service's name on the wire.
const ServiceName = "dabb.Health"

// MethodCheck is the method that answers one service's status.
const MethodCheck = "Check"

// Status is a service's health, as Check answers it.
type Status string

const (
	// Serving: the service is registered and the server is not shutting
	// down.
	Serving Status = "serving"
	// NotServing: the service is registered, but the server is shutting
	// down or the application said so (dabb.Server.SetServing). Check
	// only reports it: calls are still run until the server drains.
	NotServing Status = "not serving"
	// Unknown: the server has no such service.
	Unknown Status = "unknown"
)

// CheckRequest asks for one service's status.
type CheckRequest struct {
	// Service is the service's name; empty for the server as a whole.
	Service string `json:"service,omitempty"`
}

// CheckReply answers a CheckRequest.
type CheckReply struct {
	Status Status `json:"status"`
}
