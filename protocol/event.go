// Event frames: heartbeats, the read-only event, and dabb's cancel and go-away events, byte-identical with Dubbo's.

package protocol

// Event frames are byte-identical to Apache Dubbo's, whatever codec the calls
// use, so a Dubbo peer understands them. Their bodies are hessian2 values:
// heartbeats carry null (0x4e), the read-only event the string "R"
// (0x01 0x52). Receivers recognise events by the event flag, accept any
// serialization id on them and ignore a heartbeat's body.
//
// The cancel event is dabb's own, built the same way: a one-way event
// request whose body is the hessian2 string "C" (0x01 0x43). A Dubbo peer
// takes it for an event it does not know and does nothing with it. So is
// the go-away event, body "G" (0x01 0x47).

// Hessian2 is the serialization id Dubbo writes on event frames.
const Hessian2 byte = 2

var (
	hessianNull      = []byte{0x4e}
	hessianReadOnlyR = []byte{0x01, 0x52}
	hessianCancelC   = []byte{0x01, 0x43}
	hessianGoAwayG   = []byte{0x01, 0x47}
)

// AppendHeartbeat appends a heartbeat request with the given id: flags
// 0xe2 (request, two-way, event, hessian2), body 0x4e.
func AppendHeartbeat(dst []byte, id uint64) []byte {
	return appendEvent(dst, FlagRequest|FlagTwoWay|FlagEvent, 0, id, hessianNull)
}

// AppendHeartbeatResponse appends the answer to a heartbeat request: flags
// 0x22 (event, hessian2), status 20, the request's id, body 0x4e.
func AppendHeartbeatResponse(dst []byte, id uint64) []byte {
	return appendEvent(dst, FlagEvent, StatusOK, id, hessianNull)
}

// AppendReadOnly appends the read-only event a server sends when it starts
// shutting down: a one-way request, flags 0xa2, body 0x01 0x52.
func AppendReadOnly(dst []byte, id uint64) []byte {
	return appendEvent(dst, FlagRequest|FlagEvent, 0, id, hessianReadOnlyR)
}

// AppendCancel appends the cancel event for request id. A client sends it
// when its caller gave up after the request was written. It is a one-way
// request, flags 0xa2, with the abandoned request's id and body 0x01 0x43.
// The server cancels that call's handler context; nothing answers it.
func AppendCancel(dst []byte, id uint64) []byte {
	return appendEvent(dst, FlagRequest|FlagEvent, 0, id, hessianCancelC)
}

// AppendGoAway appends the go-away event a server sends on one connection
// it is about to close to make room for a new one (MaxConns): a one-way
// request, flags 0xa2, body 0x01 0x47. The client sends no new calls on
// that connection; the server answers 100 to any request it reads there
// after the event, and runs none.
func AppendGoAway(dst []byte, id uint64) []byte {
	return appendEvent(dst, FlagRequest|FlagEvent, 0, id, hessianGoAwayG)
}

func appendEvent(dst []byte, kind Flags, s Status, id uint64, body []byte) []byte {
	var m Message
	m.Header.Init(MakeFlags(kind, Hessian2), s, id)
	m.Payload = body
	return AppendMessage(dst, &m)
}

// IsHeartbeat reports whether m is a heartbeat request (an event that
// expects an answer). Its body is ignored, as Dubbo does.
func (m *Message) IsHeartbeat() bool {
	f := m.Header.Flags()
	return f.IsEvent() && f.IsRequest() && f.IsTwoWay()
}

// IsHeartbeatResponse reports whether m answers a heartbeat: an event
// frame that is not a request.
func (m *Message) IsHeartbeatResponse() bool {
	f := m.Header.Flags()
	return f.IsEvent() && !f.IsRequest()
}

// IsReadOnly reports whether m is the read-only event: a one-way event
// request whose body is the hessian2 string "R".
func (m *Message) IsReadOnly() bool {
	f := m.Header.Flags()
	return f.IsEvent() && f.IsRequest() && !f.IsTwoWay() && string(m.Payload) == string(hessianReadOnlyR)
}

// IsCancel reports whether m is the cancel event: a one-way event request
// whose body is the hessian2 string "C". Its id names the abandoned call.
func (m *Message) IsCancel() bool {
	f := m.Header.Flags()
	return f.IsEvent() && f.IsRequest() && !f.IsTwoWay() && string(m.Payload) == string(hessianCancelC)
}

// IsGoAway reports whether m is the go-away event: a one-way event request
// whose body is the hessian2 string "G".
func (m *Message) IsGoAway() bool {
	f := m.Header.Flags()
	return f.IsEvent() && f.IsRequest() && !f.IsTwoWay() && string(m.Payload) == string(hessianGoAwayG)
}
