// The guard: it re-creates our nodes that others delete or change.

package zk

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path"
	"sync"
	"time"

	"github.com/dabbrpc/dabb/registry"
	"github.com/go-zookeeper/zk"
)

// The guard re-creates an instance node that someone else deletes while our
// session lives, and puts our data back when someone changes it; the keeper
// only restores nodes when a session is (re-)established.
//
// Every node we own carries an exists watch, set right after the node is
// written (by Register, by the keeper's restore and by the guard itself)
// and set again after each of its events. The client's event callback
// (onNodeEvent) sees the watch fire; for a node we still own it queues the
// path and wakes the guard, which re-creates the node in the write slot,
// the one the restore path uses. A node we no longer own (Deregister or
// Close deleted it, or is about to) is left alone: both drop it from owned
// before they delete it, and the guard looks at owned only once it holds
// the write slot.
//
// The guard never replaces a node that another session holds, and the
// keeper's restore replaces only nodes of earlier sessions of ours: two
// processes registered under one instance ID would otherwise replace each
// other's node forever. The watch stays on it, so the node is re-created
// if that holder deletes it while we still own the instance.

// guardState is what the guard watches: the exists watches on our nodes,
// and the nodes queued for repair.
type guardState struct {
	kick chan struct{} // cap 1: wakes the guard

	mu      sync.Mutex       // guards following
	armed   map[string]int64 // node path → session its exists watch was set in
	repairs map[string]int   // node paths for the guard → failed attempts
}

// armHook, set only by tests, is called by the guard's repair of r between
// putting node p right and watching it.
var armHook func(r *Registry, p string)

// Bounds of the guard's retries when re-creating a node fails while the
// session lives. After the last one the node is left to the next restore.
const (
	maxRepairAttempts = 5
	minRepairBackoff  = 200 * time.Millisecond
	maxRepairBackoff  = 2 * time.Second
)

// errNoLiveSession reports a repair attempted while the session was not
// live: the keeper's restore, which runs once it is back, covers it.
var errNoLiveSession = errors.New("zk: no live session")

// onNodeEvent handles a watch event. It is called by the client's receive
// loop and must not block.
func (r *Registry) onNodeEvent(ev zk.Event) {
	g := &r.guarded
	g.mu.Lock()
	if _, ok := g.armed[ev.Path]; !ok {
		g.mu.Unlock()
		return // not one of our instance nodes' watches
	}
	// The watch has fired or ended; either way it is gone.
	delete(g.armed, ev.Path)
	g.mu.Unlock()
	if ev.Type == zk.EventNotWatching {
		return // the session ended or the client closed: restore re-arms
	}
	r.queueRepair(ev.Path)
}

// queueRepair asks the guard to look at p: re-create it if it is missing
// and set its watch again.
func (r *Registry) queueRepair(p string) {
	// A Deregister between this check and the guard's repair is no
	// harm: the repair looks at owned again, in the write slot.
	if _, ok := r.owns(p); !ok || r.isClosed() {
		return
	}
	g := &r.guarded
	g.mu.Lock()
	if _, ok := g.repairs[p]; !ok {
		g.repairs[p] = 0
	}
	g.mu.Unlock()
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// arm sets the data watch on p, which was just written with want, unless
// one is already set in the current session (a change fires that one). It
// reports whether p exists and holds want (nil: any data): a write of
// someone else's between ours and the watch would otherwise go unseen.
// When it does not,
// the watch is set (p exists, holding other data) or not (p is gone), and
// the caller looks again. It is called in the write slot.
func (r *Registry) arm(conn *zk.Conn, p string, want []byte) (bool, error) {
	session := conn.SessionID()
	g := &r.guarded
	g.mu.Lock()
	if on, ok := g.armed[p]; ok && on == session {
		g.mu.Unlock()
		return true, nil
	}
	// Recorded before the request: the watch may fire before GetW
	// returns, and onNodeEvent must know it.
	g.armed[p] = session
	g.mu.Unlock()
	data, _, _, err := conn.GetW(p)
	if err != nil {
		g.mu.Lock()
		if on, ok := g.armed[p]; ok && on == session {
			delete(g.armed, p) // no watch was set
		}
		g.mu.Unlock()
		if errors.Is(err, zk.ErrNoNode) {
			return false, nil
		}
		return false, fmt.Errorf("watch %s: %w", p, err)
	}
	return want == nil || bytes.Equal(data, want), nil
}

// guard re-creates the nodes onNodeEvent queues, retrying a failure a
// bounded number of times with backoff.
func (r *Registry) guard(conn *zk.Conn) {
	defer r.wg.Done()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-r.done:
			return
		case <-r.guarded.kick:
		case <-retry.C:
		}
		r.guarded.mu.Lock()
		due := maps.Clone(r.guarded.repairs)
		clear(r.guarded.repairs)
		r.guarded.mu.Unlock()
		var backoff time.Duration
		for p, failed := range due {
			err := r.repair(conn, p)
			select {
			case <-r.done:
				return // errors here come from the connection closing
			default:
			}
			switch {
			case err == nil:
				continue
			case errors.Is(err, errNoLiveSession):
				r.log.Debug("instance node changed while the session was not live; the restore covers it", "path", p)
				continue
			}
			failed++
			if failed >= maxRepairAttempts {
				r.log.Error("re-creating an instance node failed; giving up until the next session", "path", p, "err", err, "attempts", failed)
				continue
			}
			d := min(minRepairBackoff<<(failed-1), maxRepairBackoff)
			r.log.Warn("re-creating an instance node failed; retrying", "path", p, "err", err, "attempt", failed, "in", d)
			if _, ok := r.owns(p); ok && !r.isClosed() {
				r.guarded.mu.Lock()
				r.guarded.repairs[p] = max(r.guarded.repairs[p], failed)
				r.guarded.mu.Unlock()
			}
			backoff = max(backoff, d)
		}
		if backoff > 0 {
			retry.Reset(backoff)
		}
	}
}

// restoreData sets p's data back to data if it differs. It reports false
// when p was deleted or changed again meanwhile, so the caller looks again.
func (r *Registry) restoreData(conn *zk.Conn, p string, data []byte) (bool, error) {
	got, stat, err := conn.Get(p)
	switch {
	case errors.Is(err, zk.ErrNoNode):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("read %s: %w", p, err)
	case bytes.Equal(got, data):
		return true, nil
	}
	_, err = conn.Set(p, data, stat.Version)
	switch {
	case err == nil:
		r.log.Info("restored the data of an instance node changed while our session lived", "path", p)
		return true, nil
	case errors.Is(err, zk.ErrNoNode), errors.Is(err, zk.ErrBadVersion):
		return false, nil
	}
	return false, fmt.Errorf("restore %s: %w", p, err)
}

// repair re-creates p in the current session if we still own it and it is
// missing, puts our data back if it was changed, and sets its watch again.
// It holds the write slot throughout.
func (r *Registry) repair(conn *zk.Conn, p string) error {
	select {
	case r.writes <- struct{}{}:
	case <-r.done:
		return registry.ErrClosed
	}
	defer func() { <-r.writes }()
	in, owned := r.owns(p)
	switch {
	case r.isClosed():
		return registry.ErrClosed
	case !owned:
		return nil // deregistered meanwhile: it stays gone
	case conn.State() != zk.StateHasSession:
		return errNoLiveSession
	}
	data, err := json.Marshal(in)
	if err != nil {
		return err
	}
	session := conn.SessionID()
	for range maxAttempts {
		ok, stat, err := conn.Exists(p)
		theirs := false
		switch {
		case err != nil:
			return fmt.Errorf("look at %s: %w", p, err)
		case !ok:
			_, err := conn.Create(p, data, zk.FlagEphemeral, r.acl)
			switch {
			case err == nil:
				r.log.Info("re-created an instance node deleted while our session lived", "path", p, "session", sessionHex(session))
			case errors.Is(err, zk.ErrNoNode):
				if err := r.createParents(conn, path.Dir(p)); err != nil {
					return err
				}
				continue
			case errors.Is(err, zk.ErrNodeExists):
				continue // created by someone else meanwhile: look again
			default:
				return fmt.Errorf("create %s: %w", p, err)
			}
		case stat.EphemeralOwner != session:
			r.log.Warn("instance node is held by another session; not replacing it", "path", p,
				"owner", sessionHex(stat.EphemeralOwner), "session", sessionHex(session))
			theirs = true
		default:
			// Ours: put our data back if someone changed it (zkCli's
			// set), since clients read the instance from it.
			restored, err := r.restoreData(conn, p, data)
			if err != nil {
				return err
			}
			if !restored {
				continue // deleted or changed again meanwhile: look again
			}
		}
		if theirs {
			// Another session's node: watched, not ours to check,
			// unless it went before the watch was set (GetW sets none
			// on a missing node): then look again, and create ours.
			exists, err := r.arm(conn, p, nil)
			if err != nil {
				return err
			}
			if exists {
				return nil
			}
			continue
		}
		if armHook != nil {
			armHook(r, p)
		}
		intact, err := r.arm(conn, p, data)
		if err != nil {
			return err
		}
		if intact {
			return nil
		}
		// Deleted or changed again before the watch was set: once more.
	}
	return fmt.Errorf("%s deleted or changed %d times while being re-created", p, maxAttempts)
}
