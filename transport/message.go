// Pooled messages and the read buffer size, shared by both sides of a connection.

package transport

import (
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
