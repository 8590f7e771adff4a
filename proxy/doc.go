// Package proxy is the client side of dabb: a Client that generated stubs
// call through the one-method Caller interface.
//
// A call goes through the user's middlewares, then the balancing stage
// (instances from the registry cache, memory only after the first call;
// instances that announced shutdown are skipped), then the transport stage,
// which sends what remains of the call's budget with the request so the
// server never starts work nobody waits for.
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
// Timeouts: one second by default (as in Dubbo), overridden by the
// interface's //dabb:timeout directive, then by WithMethodTimeout, then per
// call with WithCallOptions(ctx, Timeout(d)); the context's deadline wins
// when it is earlier.
//
// Every error from Invoke is a *protocol.Error (errors.As) carrying a status
// and whether the server sent it; the Err* variables match classes of
// them with errors.Is. An error a middleware makes of its own is the cause
// of a local 90 (31 at a deadline), reachable with errors.Is and errors.As.
package proxy
