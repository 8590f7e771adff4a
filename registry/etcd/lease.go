// The lease every registered key is bound to: granting it, keeping it alive, and putting the keys again when it is lost.

package etcd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// establish grants a new lease, puts every registered key on it and hands
// it to the keeper. The caller holds sem.
func (r *Registry) establish(ctx context.Context) error {
	grant, err := r.cli.Grant(ctx, r.cfg.ttlSeconds())
	if err != nil {
		return fmt.Errorf("grant lease: %w", err)
	}
	id := grant.ID
	ops := make([]clientv3.Op, 0, len(r.registered))
	for key, in := range r.registered {
		value, err := json.Marshal(in)
		if err != nil {
			return err
		}
		ops = append(ops, clientv3.OpPut(key, string(value), clientv3.WithLease(id)))
	}
	// Put in batches: etcd caps the operations of one transaction.
	const batch = 64
	for len(ops) > 0 {
		n := min(batch, len(ops))
		if _, err := r.cli.Txn(ctx).Then(ops[:n]...).Commit(); err != nil {
			r.revokeQuietly(id)
			return fmt.Errorf("put keys on lease %x: %w", int64(id), err)
		}
		ops = ops[n:]
	}
	r.lease = id
	r.mu.Lock()
	if !r.keeping && !r.closed {
		r.keeping = true
		r.wg.Add(1)
		go r.keep()
	}
	r.mu.Unlock()
	select {
	case r.leaseSet <- struct{}{}:
	default:
	}
	return nil
}

// revokeQuietly revokes a lease that is of no use, in the background of a
// failure: errors are only logged, since the lease expires anyway.
func (r *Registry) revokeQuietly(id clientv3.LeaseID) {
	ctx, cancel := r.callContext(r.ctx)
	defer cancel()
	if _, err := r.cli.Revoke(ctx, id); err != nil {
		r.log.Debug("revoke unused lease", "lease", fmt.Sprintf("%x", int64(id)), "err", err)
	}
}

// keep keeps the current lease alive and, when it is lost, establishes a
// new one, retrying with backoff until etcd answers or Close.
func (r *Registry) keep() {
	defer r.wg.Done()
	for {
		id, ok := r.currentLease()
		if !ok {
			return
		}
		if id == 0 {
			select {
			case <-r.leaseSet:
				continue
			case <-r.ctx.Done():
				return
			}
		}
		lost := r.keepAlive(id)
		if r.ctx.Err() != nil {
			return
		}
		if lost {
			r.recover(id)
		}
	}
}

// currentLease returns the lease to keep; ok is false when Close began.
func (r *Registry) currentLease() (id clientv3.LeaseID, ok bool) {
	if err := r.acquire(r.ctx); err != nil {
		return 0, false
	}
	defer r.release()
	return r.lease, true
}

// keepAlive drains the keep-alive responses of lease id until the lease
// is lost (the channel closes: it expired or was revoked) or replaced by
// Register. It reports whether the lease was lost.
func (r *Registry) keepAlive(id clientv3.LeaseID) (lost bool) {
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	ch, err := r.cli.KeepAlive(ctx, id)
	if err != nil {
		r.log.Warn("lease keep-alive failed", "lease", fmt.Sprintf("%x", int64(id)), "err", err)
		return true
	}
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return true
			}
		case <-r.leaseSet:
			cur, ok := r.currentLease()
			if !ok {
				return false
			}
			if cur != id {
				return false
			}
		}
	}
}

// recover replaces lease id, if it is still the current one, by a new
// lease carrying every registered key.
func (r *Registry) recover(id clientv3.LeaseID) {
	r.log.Warn("lease lost, registering again", "lease", fmt.Sprintf("%x", int64(id)))
	delay := 100 * time.Millisecond
	const maxDelay = time.Second
	for attempt := 1; ; attempt++ {
		done, err := r.tryRecover(id)
		if done {
			if err == nil {
				r.log.Info("lease re-established, instances registered again", "attempts", attempt)
			}
			return
		}
		if attempt == 1 {
			r.log.Warn("cannot register again yet, retrying until etcd answers", "err", err)
		}
		if !r.pause(delay) {
			return
		}
		delay = min(2*delay, maxDelay)
	}
}

// pause waits about delay before a retry; false means Close came first.
func (r *Registry) pause(delay time.Duration) bool { return jitteredSleep(r.ctx, delay) }

var (
	errReplaced          = errors.New("etcd: lease already replaced")
	errNothingRegistered = errors.New("etcd: nothing registered")
)

// tryRecover makes one attempt; done reports that nothing is left to do.
func (r *Registry) tryRecover(id clientv3.LeaseID) (done bool, err error) {
	ctx, cancel := r.callContext(r.ctx)
	defer cancel()
	if err := r.acquire(ctx); err != nil {
		return r.ctx.Err() != nil, err
	}
	defer r.release()
	if r.lease != id && r.lease != 0 {
		return true, errReplaced // Register already replaced it
	}
	r.lease = 0
	if len(r.registered) == 0 {
		return true, errNothingRegistered
	}
	if err := r.establish(ctx); err != nil {
		return r.ctx.Err() != nil, err
	}
	return true, nil
}

// leaseID returns the current lease, for tests.
func (r *Registry) leaseID() clientv3.LeaseID {
	if err := r.acquire(r.ctx); err != nil {
		return 0
	}
	defer r.release()
	return r.lease
}
