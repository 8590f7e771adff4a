// The Handler contract: what a handler may do with a request, its response
// and its context.

package transport

import (
	"context"

	"github.com/dabbrpc/dabb/protocol"
)

// Handler serves one request.
//
// ServeRPC fills resp: its status (resp.Header.SetStatus; zero means OK),
// its Payload and its Attachments. After ServeRPC returns, the transport
// sets resp's magic, id and flags and encodes it. Then it reuses both
// messages, so neither may be kept after ServeRPC returns.
//
// resp.Payload arrives empty, with the capacity of an earlier response.
// Appending to it (resp.Payload = append(resp.Payload[:0], ...)) allocates
// nothing. The transport reuses whatever resp.Payload holds once the
// response is written. A handler that assigns a slice of its own must not
// touch that slice again. Echoing the request (resp.Payload = req.Payload)
// is fine: that array stays the request's.
//
// ctx carries the request's deadline when the request came with a budget.
// It is cancelled when the server closes. For a two-way request it is
// also cancelled when the client sends the cancel event or its connection
// closes. ctx.Err() is then context.Canceled. No response is sent for a
// call the client cancelled. Nor is one sent for a call whose budget ran
// out before the handler returned: its caller has given up. A handler
// must return once ctx is done. Like the messages, ctx must not be used
// after ServeRPC returns.
type Handler interface {
	ServeRPC(ctx context.Context, req, resp *protocol.Message)
}

// HandlerFunc adapts a function to a Handler.
type HandlerFunc func(ctx context.Context, req, resp *protocol.Message)

// ServeRPC calls f(ctx, req, resp).
func (f HandlerFunc) ServeRPC(ctx context.Context, req, resp *protocol.Message) { f(ctx, req, resp) }

var _ Handler = HandlerFunc(nil)
