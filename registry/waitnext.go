// WaitNext: the wait loop of a Watcher's Next, which every backend shares.

package registry

import "context"

// WaitNext runs the loop of a Watcher's Next. It calls poll until poll
// returns a set or an error. When poll has neither, it returns the
// channel that closes at the watcher's next change, and WaitNext waits
// for it before calling poll again.
//
// WaitNext returns ErrWatcherStopped once stop is closed, and ctx.Err()
// once ctx ends, before it calls poll and while it waits. stop is the
// watcher's: closed by its Stop.
func WaitNext(ctx context.Context, stop <-chan struct{}, poll func() ([]Instance, <-chan struct{}, error)) ([]Instance, error) {
	for {
		select {
		case <-stop:
			return nil, ErrWatcherStopped
		default:
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		set, changed, err := poll()
		if err != nil || changed == nil {
			return set, err
		}
		select {
		case <-changed:
		case <-stop:
			return nil, ErrWatcherStopped
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}
