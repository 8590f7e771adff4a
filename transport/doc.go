// Package transport moves protocol.Message frames over TCP: a client
// [Pool] of multiplexed connections per address, and a [Server].
//
// Serve:
//
//	srv := transport.NewServer(transport.HandlerFunc(
//		func(ctx context.Context, req, resp *protocol.Message) {
//			resp.Payload = append(resp.Payload[:0], req.Payload...) // echo
//		}), transport.ServerConfig{})
//	l, _ := net.Listen("tcp", "127.0.0.1:20880")
//	go srv.Serve(l) // returns ErrServerClosed after Shutdown
//	...
//	srv.Shutdown(ctx) // read-only event, drain, wait for clients to close
//
// Call:
//
//	pool := transport.NewPool(transport.Config{}) // dials lazily
//	defer pool.Close()
//	req := &protocol.Message{Service: "inventory.Inventory", Method: "Stock",
//		Timeout: 200 * time.Millisecond, Payload: payload}
//	req.Header.SetFlags(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, 22))
//	resp, err := pool.RoundTrip(ctx, "127.0.0.1:20880", req)
//	if err != nil {
//		// a *protocol.Error; errors.Is(err, transport.ErrNotSent) means
//		// the request never left: safe to retry anywhere.
//	}
//	use(resp.Payload)
//	pool.Release(resp)
//
// Each connection has a pending table keyed by request id, one reader
// goroutine and a coalescing writer. An idle connection writes a frame
// inline from the calling goroutine. Under load, the frames that queue up
// while one write is in the kernel go out together in the next. A frame
// with a payload of 64 KiB or more is written from the caller's buffer
// (writev, no copy). Such requests get a connection of their own per
// address ([Config.LargeMessage]). Idle connections exchange Dubbo
// heartbeats, and a peer silent for three intervals is dropped. On Linux,
// a peer acknowledging a large frame still being written is not silent.
//
// A handler's context answers [Request] with the request it serves, so
// layers above read attachments without a context value per call. It
// answers [RemotePeer] with its connection's [Peer], made once per
// connection.
//
// TLS: [Config.TLS] and [ServerConfig.TLS] make every connection TLS. The
// client's handshake is part of the dial, within [Config.DialTimeout]; the
// server's runs on the connection's goroutine, within
// [ServerConfig.HandshakeTimeout]. A failed handshake fails its calls not
// sent, with an error naming TLS and the cause. Under TLS 1.3 a server
// refuses a client certificate only after the client's handshake has
// ended; the client reads that alert before any frame, and its calls fail
// not sent too.
//
// A peer that speaks the other protocol is told so before the connection
// closes. A TLS server answers a plaintext dabb frame with a TLS alert
// record; the client reads a TLS record where dabb's magic should be. A
// plaintext server answers a TLS handshake with a dabb frame (status 40);
// the client's handshake reads dabb's magic where a TLS record should be.
// Either client fails not sent with an error matching [ErrTLSMismatch]
// that says what the server speaks. The server logs such peers, and failed
// handshakes, once a minute per IP.
//
// Graceful shutdown: [Server.Shutdown] stops accepting and sends the
// read-only event on every connection. It still serves what is in the
// listener's accept queue, rather than letting the operating system reset
// it. [Pool.ReadOnly] then reports that address until a fresh connection
// to it succeeds. The pool closes each connection there once no call is
// pending on it. When all are closed, it probes the address in the
// background, in the dial backoff, so a server restarted there is found
// again ([Config.OnBack]).
//
// The server lets its handlers finish, then keeps reading until each
// client has closed. Any request that still arrives gets status 100 (not
// run: retry elsewhere). So a graceful shutdown never makes a call on an
// established connection fail with a 35 that says the server may have
// acted. A peer that ignores the event is closed after
// [ServerConfig.ShutdownLinger].
//
// Cancellation: a caller may give up on a two-way call whose request was
// written: its ctx is cancelled, its budget runs out, or another attempt
// won. The client then sends the cancel event for that request id on the
// same connection, without waiting for the socket. The server cancels that
// handler's ctx, and ctx.Err() is context.Canceled. It does not run the
// handler if it had not started, and does not write its response. A call
// that got its response, or whose request never left, sends no cancel. A
// server that does not know the event ignores it.
//
// The server bounds running handlers with [ServerConfig.MaxConcurrent],
// and answers status 100 at once when full. A request whose budget is
// spent gets 31 without running. One whose budget runs out while its
// handler runs gets no response: its caller has timed out already. A
// handler panic becomes 70 for that call only.
package transport
