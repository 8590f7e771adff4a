// Pooled messages and the read buffer size, shared by both sides of a connection.

package transport

import (
	"bufio"
	"sync"

	"github.com/dabbrpc/dabb/protocol"
)

// readBufferSize is the size of each connection's bufio.Reader.
const readBufferSize = 16 << 10

// msgPool holds the response messages handed to callers (returned with
// Pool.Release) and the server's request/response pairs' storage.
var msgPool = sync.Pool{New: func() any { return new(protocol.Message) }}

func getMessage() *protocol.Message { return msgPool.Get().(*protocol.Message) }

// putMessage pools a message that was read into; a large body buffer goes
// back to the shared buffer pool (Recycle), not with the message.
func putMessage(m *protocol.Message) {
	m.Recycle()
	msgPool.Put(m)
}

// frameLen returns the length of br's next frame, header and body, once
// its header is in the read buffer. It reads from the connection only
// until the header is buffered.
func frameLen(br *bufio.Reader) (int, error) {
	h, err := br.Peek(protocol.HeaderLen)
	if err != nil {
		return 0, err
	}
	var hdr protocol.Header
	copy(hdr[:], h)
	return protocol.HeaderLen + int(hdr.BodyLen()), nil
}

// wholeFrame reports whether br's buffer holds its next frame whole. It
// never reads from the connection.
func wholeFrame(br *bufio.Reader) bool {
	if br.Buffered() < protocol.HeaderLen {
		return false
	}
	n, err := frameLen(br)
	return err == nil && br.Buffered() >= n
}
