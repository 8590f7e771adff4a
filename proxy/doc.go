// Package proxy is the client side of dabb. Generated stubs call a Client
// through the one-method Caller interface.
//
// A call passes three stages. The user's middlewares run first. The
// balancing stage then picks an instance from the registry cache, which
// answers from memory after the first call. It skips instances that
// announced shutdown. The transport stage last sends the request with what
// remains of the call's budget, so the server never starts work nobody
// waits for.
//
//	c, err := proxy.NewClient(reg, proxy.WithTimeout(500*time.Millisecond))
//	if err != nil {
//		return err // an unknown balancer or codec name
//	}
//	defer c.Close()
//	inv := inventory.NewInventoryClient(c)
//	reply, err := inv.Stock(ctx, &pb.StockRequest{Sku: "sku-42"})
//	switch {
//	case errors.Is(err, proxy.ErrTimeout):     // budget ran out
//	case errors.Is(err, proxy.ErrUnavailable): // no instance or connection lost
//	}
//
// A call's timeout is one second by default, as in Dubbo. The interface's
// //dabb:timeout directive overrides it, then WithMethodTimeout, then
// WithCallOptions(ctx, Timeout(d)) for one call. The context's deadline
// wins when it is earlier.
//
// Every error from Invoke is a *protocol.Error (errors.As). It carries a
// status and whether the server sent it. The Err* variables match classes
// of them with errors.Is. An error a middleware makes of its own becomes
// the cause of a local 90 (31 at a deadline); errors.Is and errors.As
// still reach it. A server's error may carry a Code and Details too;
// ErrUnauthenticated and ErrPermissionDenied match the two refusals,
// which are never retried; no sentinel of a status (ErrBadRequest
// among them) matches them.
//
// Describe and InvokeJSON call a service without its stub, through the
// reflection service every dabb server runs: a method by name, with a JSON
// request and a JSON reply, with the same budget, retries and balancing.
// Via reaches a service's instances for a call that names another service.
//
// WithTLS dials every connection over TLS; WithCredentials adds per-call
// credentials such as BearerToken, refused over plaintext unless they
// allow it. docs/security.md has the whole story.
package proxy
