// Package protocol is dabb's wire format: a 16-byte header bit-exact with
// Apache Dubbo's ExchangeCodec, followed by a body.
//
//	0      2      3       4              12             16
//	+------+------+-------+--------------+--------------+----------+
//	|magic |flags |status |  request id  | body length  |  body    |
//	|0xdabb|      |       |  (8 bytes)   |  (4 bytes)   |          |
//	+------+------+-------+--------------+--------------+----------+
//
// All integers are big-endian. The flag byte holds the request (0x80),
// two-way (0x40) and event (0x20) bits and, in its low five bits, the
// serialization id of the payload. The status byte is set on responses only.
//
// A request or response body is: service, method, attachments, payload (see
// [AppendMessage]), unless a [BodyFormat] registered for the frame's
// serialization id lays it out (another protocol's bodies, such as Dubbo's
// hessian2); an event body is Dubbo's own (see [AppendHeartbeat] and
// [AppendReadOnly]). docs/protocol.md documents every byte.
//
// Every layer reports failures as an [*Error] carrying a [Status]; match them
// with errors.As, or with errors.Is against the sentinels (ErrTimeout, ...).
// An error response may also carry an application code and details, as
// attachments: see [NewError] and [Message.SetError].
package protocol
