// The keeper: it keeps the registered nodes present across session loss.

package zk

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/dabbrpc/dabb/registry"
	"github.com/go-zookeeper/zk"
)

// keptState is what the keeper keeps: the nodes we own, and those to
// remove. Register and Deregister change it; the keeper restores it.
type keptState struct {
	kick chan struct{} // cap 1: wakes the keeper

	mu       sync.Mutex                   // guards following
	owned    map[string]registry.Instance // node path → instance; the keeper maintains these
	orphans  map[string]bool              // node paths to delete once possible
	sessions map[int64]bool               // the sessions we wrote nodes in: an owner that is not one is another process
}

// sessionHook, set only by tests, is called by the keeper once it has
// brought every owned node of r onto session id.
var sessionHook func(r *Registry, id int64)

// removeAll deletes the nodes we own, bounded by RequestTimeout.
func (r *Registry) removeAll(conn *zk.Conn) {
	if conn.State() != zk.StateHasSession {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.RequestTimeout)
	defer cancel()
	select {
	case r.writes <- struct{}{}:
	case <-ctx.Done():
		r.log.Warn("close: a write is still in progress; leaving node removal to the session's end")
		return
	}
	r.kept.mu.Lock()
	paths := make([]string, 0, len(r.kept.owned)+len(r.kept.orphans))
	for p := range r.kept.owned {
		paths = append(paths, p)
	}
	for p := range r.kept.orphans {
		paths = append(paths, p)
	}
	r.kept.mu.Unlock()
	// The requests run on their own so that ctx bounds them; wg covers
	// them (Close waits after conn.Close, which ends them).
	res := make(chan error, 1)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer func() { <-r.writes }()
		var errs []error
		for _, p := range paths {
			errs = append(errs, r.removeIfOurs(conn, p))
		}
		res <- errors.Join(errs...)
	}()
	select {
	case err := <-res:
		if err != nil {
			r.log.Warn("close: removing nodes", "err", err)
		}
	case <-ctx.Done():
		r.log.Warn("close: removing nodes took longer than the request timeout; the session's end removes them")
	}
}

// write runs fn with a live session, holding the write slot, bounded by
// ctx and RequestTimeout. fn runs on its own goroutine and keeps the slot
// until it returns, even when ctx ends first, so writes never overlap.
func (r *Registry) write(ctx context.Context, fn func(conn *zk.Conn) error) error {
	ctx, cancel := r.bound(ctx)
	defer cancel()
	conn, err := r.session(ctx)
	if err != nil {
		return err
	}
	select {
	case r.writes <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("waiting for another write: %w", ctx.Err())
	case <-r.done:
		return registry.ErrClosed
	}
	res := make(chan error, 1)
	if !r.spawn(func() {
		defer func() { <-r.writes }()
		res <- fn(conn)
	}) {
		<-r.writes
		return registry.ErrClosed
	}
	select {
	case err := <-res:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// owns returns the instance of node p, if we own it.
func (r *Registry) owns(p string) (registry.Instance, bool) {
	r.kept.mu.Lock()
	defer r.kept.mu.Unlock()
	in, ok := r.kept.owned[p]
	return in, ok
}

// poke wakes the keeper.
func (r *Registry) poke() {
	select {
	case r.kept.kick <- struct{}{}:
	default:
	}
}

// keep brings the nodes we own onto the current session whenever a
// session is (re-)established, and removes orphans, retrying with backoff
// while that fails.
func (r *Registry) keep(conn *zk.Conn) {
	defer r.wg.Done()
	const minBackoff, maxBackoff = 100 * time.Millisecond, 5 * time.Second
	backoff := minBackoff
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-r.done:
			return
		case <-r.kept.kick:
		case <-retry.C:
		}
		if conn.State() != zk.StateHasSession {
			continue // the next session pokes us
		}
		id, err := r.reconcile(conn)
		select {
		case <-r.done:
			return // errors here come from the connection closing
		default:
		}
		if err != nil {
			r.log.Warn("restoring registrations failed; retrying", "err", err, "in", backoff)
			retry.Reset(backoff)
			backoff = min(2*backoff, maxBackoff)
			continue
		}
		backoff = minBackoff
		if sessionHook != nil {
			sessionHook(r, id)
		}
	}
}

// reconcile makes ZooKeeper hold exactly our nodes, owned by the current
// session and watched, and returns that session's ID.
func (r *Registry) reconcile(conn *zk.Conn) (int64, error) {
	select {
	case r.writes <- struct{}{}:
	case <-r.done:
		return 0, registry.ErrClosed
	}
	defer func() { <-r.writes }()
	r.kept.mu.Lock()
	owned := make(map[string]registry.Instance, len(r.kept.owned))
	for p, in := range r.kept.owned {
		owned[p] = in
	}
	orphans := make([]string, 0, len(r.kept.orphans))
	for p := range r.kept.orphans {
		orphans = append(orphans, p)
	}
	r.kept.mu.Unlock()
	id := conn.SessionID()
	r.guarded.mu.Lock()
	for p, on := range r.guarded.armed {
		if on != id {
			delete(r.guarded.armed, p) // set in an earlier session, which took it along
		}
	}
	r.guarded.mu.Unlock()

	var errs []error
	for p, in := range owned {
		data, err := json.Marshal(in)
		if err == nil {
			err = r.ensure(conn, p, data, false)
		}
		var intact bool
		if err == nil {
			intact, err = r.arm(conn, p, data)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p, err))
			continue
		}
		if !intact {
			r.queueRepair(p) // deleted or changed again already
		}
	}
	for _, p := range orphans {
		if err := r.removeIfOurs(conn, p); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p, err))
			continue
		}
		r.kept.mu.Lock()
		delete(r.kept.orphans, p)
		r.kept.mu.Unlock()
	}
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	if conn.SessionID() != id {
		return 0, errors.New("session changed while restoring registrations")
	}
	return id, nil
}

// maxAttempts bounds the retries of an operation that lost a race with
// another client.
const maxAttempts = 5

// ensure makes p an ephemeral node of the current session holding data.
// A node of another session or with other data is replaced in one
// transaction, so watchers never see the instance missing. With takeOver
// (Register), a node of any session is replaced: a restarted process
// replaces the node its predecessor's session still holds. Without it
// (the keeper's restore), only a node of an earlier session of ours is.
func (r *Registry) ensure(conn *zk.Conn, p string, data []byte, takeOver bool) error {
	r.kept.mu.Lock()
	r.kept.sessions[conn.SessionID()] = true
	r.kept.mu.Unlock()
	for range maxAttempts {
		got, stat, err := conn.Get(p)
		if errors.Is(err, zk.ErrNoNode) {
			_, err = conn.Create(p, data, zk.FlagEphemeral, r.acl)
			switch {
			case err == nil:
				return nil
			case errors.Is(err, zk.ErrNoNode):
				if err := r.createParents(conn, path.Dir(p)); err != nil {
					return err
				}
				continue
			case errors.Is(err, zk.ErrNodeExists):
				continue
			}
			return err
		}
		if err != nil {
			return err
		}
		session := conn.SessionID()
		if stat.EphemeralOwner == session && bytes.Equal(got, data) {
			return nil
		}
		if stat.EphemeralOwner != session {
			r.kept.mu.Lock()
			mine := r.kept.sessions[stat.EphemeralOwner]
			r.kept.mu.Unlock()
			// A node another process took over since is left to it, as
			// the guard does. Else two processes under one instance ID
			// would take it from each other at every reconnect.
			if !takeOver && !mine && stat.EphemeralOwner != 0 {
				r.log.Warn("instance node is held by another session; not taking it back", "path", p,
					"owner", sessionHex(stat.EphemeralOwner), "session", sessionHex(session))
				return nil
			}
			r.log.Info("replacing a node of another session", "path", p, "owner", sessionHex(stat.EphemeralOwner), "session", sessionHex(session))
		}
		err = multi(conn,
			&zk.DeleteRequest{Path: p, Version: stat.Version},
			&zk.CreateRequest{Path: p, Data: data, Acl: r.acl, Flags: zk.FlagEphemeral})
		switch {
		case err == nil:
			return nil
		case errors.Is(err, zk.ErrNoNode), errors.Is(err, zk.ErrBadVersion), errors.Is(err, zk.ErrNodeExists):
			continue // someone else changed it in between: look again
		}
		return err
	}
	return fmt.Errorf("%s changed %d times while being written", p, maxAttempts)
}

// removeIfOurs deletes p if the current session owns it.
func (r *Registry) removeIfOurs(conn *zk.Conn, p string) error {
	for range maxAttempts {
		ok, stat, err := conn.Exists(p)
		if err != nil {
			return err
		}
		if !ok {
			return nil
		}
		if stat.EphemeralOwner != conn.SessionID() {
			r.log.Debug("not removing a node of another session", "path", p, "owner", sessionHex(stat.EphemeralOwner))
			return nil
		}
		err = conn.Delete(p, stat.Version)
		if err == nil || errors.Is(err, zk.ErrNoNode) {
			return nil
		}
		if !errors.Is(err, zk.ErrBadVersion) {
			return err
		}
	}
	return fmt.Errorf("%s changed %d times while being removed", p, maxAttempts)
}

// createParents creates p and its missing ancestors as persistent nodes.
func (r *Registry) createParents(conn *zk.Conn, p string) error {
	var cur string
	for part := range strings.SplitSeq(strings.TrimPrefix(p, "/"), "/") {
		cur += "/" + part
		_, err := conn.Create(cur, nil, zk.FlagPersistent, r.acl)
		if err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return fmt.Errorf("create %s: %w", cur, err)
		}
	}
	return nil
}

// multi runs ops in one transaction and returns the first operation's
// error when it fails.
func multi(conn *zk.Conn, ops ...any) error {
	res, err := conn.Multi(ops...)
	for _, r := range res {
		if r.Error != nil {
			return r.Error
		}
	}
	return err
}
