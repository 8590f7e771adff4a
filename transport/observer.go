// ServerObserver: what a Server reports of the requests it refuses and the connections it serves.

package transport

// Rejection is why a server refused a request without running its
// handler, or a connection. Its value is short snake_case, fit for a metric label.
type Rejection string

// The reasons a request is refused before its handler.
const (
	// RejectOverload: MaxConcurrent requests were running (status 100).
	RejectOverload Rejection = "overload"
	// RejectShutdown: the server was draining (status 100).
	RejectShutdown Rejection = "shutdown"
	// RejectBudgetSpent: the request's budget was spent before it ran
	// (status 31).
	RejectBudgetSpent Rejection = "budget_spent"
	// RejectBadRequest: the frame's body could not be decoded or was over
	// MaxBody (status 40). A dabb.Server reports it too for a request in
	// a serialization it did not import.
	RejectBadRequest Rejection = "bad_request"
	// RejectUnimplemented: the server has no such service or method
	// (status 60). The Handler reports it, not the transport: a
	// dabb.Server does.
	RejectUnimplemented Rejection = "unimplemented"
	// RejectMaxConns: a new connection, not a request, was closed at
	// accept. The server held MaxConns connections, each with a call in
	// flight, so none could be closed to make room.
	RejectMaxConns Rejection = "max_conns"
	// RejectGoneAway: a request read on a connection the server was
	// closing to make room for a new one, after its go-away event
	// (status 100).
	RejectGoneAway Rejection = "gone_away"
)

// ServerObserver is told what a Server does outside its handler: the
// requests it refuses and the connections it opens and closes. Its
// methods are called on the server's goroutines, the reader's among
// them. They must be quick and safe for concurrent use.
type ServerObserver interface {
	// Rejected reports one request refused for reason, or one
	// connection (RejectMaxConns). A one-way request counts too, though
	// no answer goes back to it.
	Rejected(reason Rejection)
	// ConnOpened reports a connection the server began to serve, before
	// its TLS handshake if any. A connection closed at once over
	// MaxConns is not reported.
	ConnOpened()
	// ConnClosed reports the end of a connection ConnOpened reported,
	// once.
	ConnClosed()
}

// rejected tells the observer, if any, of a refused request.
func (s *Server) rejected(reason Rejection) {
	if o := s.cfg.Observer; o != nil {
		o.Rejected(reason)
	}
}
