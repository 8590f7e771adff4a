// Admission at MaxConns: a place for every new connection, made by closing an idle one when the server is full.

package transport

import (
	"math"
	"net"
	"sync/atomic"
	"time"
)

// evicting is the in-flight count evict gives the connection it closes.
// From then on dispatch runs no call of it.
const evicting = math.MinInt64 / 2

// full takes one of the MaxConns places for nc and reports false. When the
// server holds MaxConns connections already, it makes room (evict). When
// nothing can be evicted, it closes nc, counts it (RejectMaxConns) and
// reports true. forget gives the place back, and so does unplace for a
// connection track refused.
func (s *Server) full(nc net.Conn) bool {
	// The place is taken before the check: two listeners accepting at
	// once must not both see the last one free.
	if s.nconns.Add(1) <= int64(s.cfg.MaxConns) || s.evict() {
		return false
	}
	s.nconns.Add(-1)
	_ = nc.Close()
	s.rejected(RejectMaxConns)
	// One line a second at most: a flood of connections must not become
	// a flood of log lines.
	if logNow(&s.refusedLog) {
		s.log.Warn("transport: too many connections, every one with a call in flight; closing new ones at once",
			"max_conns", s.cfg.MaxConns, "remote", nc.RemoteAddr())
	}
	return true
}

// unplace gives back the place full took for a connection that track
// refused.
func (s *Server) unplace() { s.nconns.Add(-1) }

// evict closes one connection to make room for a new one, and reports
// whether it did. It closes the oldest connection that has not completed a
// valid frame; with none, the one that has waited longest with no call in
// flight. It never closes a connection with a call in flight. It evicts
// nothing once the server stops serving.
func (s *Server) evict() bool {
	// A few tries: the connection chosen may dispatch a call between the
	// choice and the claim.
	for range 4 {
		s.mu.Lock()
		var victim *serverConn
		if s.current() == serving {
			victim = s.victimLocked()
		}
		s.mu.Unlock()
		if victim == nil {
			return false
		}
		// The claim: dispatch sees evicting and runs nothing, so no call
		// is cut by the close below.
		if !victim.inflight.CompareAndSwap(0, evicting) {
			continue
		}
		victim.close()
		s.evicted.Add(1)
		if logNow(&s.evictedLog) {
			s.log.Info("transport: at MaxConns; closed idle connections to make room for new ones",
				"max_conns", s.cfg.MaxConns, "closed", s.evicted.Swap(0))
		}
		return true
	}
	return false
}

// victimLocked returns the connection evict closes, or nil: the one
// accepted first among those with no valid frame yet, else the one idle
// longest among those with no call in flight. The caller holds s.mu.
func (s *Server) victimLocked() *serverConn {
	// One pass over the connections. Evictions happen only at MaxConns,
	// so the pass costs nothing while the server has room.
	var silent, idle *serverConn
	var idleSince int64
	for sc := range s.conns {
		if !sc.watch.valid.Load() {
			if silent == nil || sc.accepted < silent.accepted {
				silent = sc
			}
			continue
		}
		if silent != nil || sc.inflight.Load() != 0 {
			continue
		}
		if t := sc.idleSince.Load(); idle == nil || t < idleSince {
			idle, idleSince = sc, t
		}
	}
	if silent != nil {
		return silent
	}
	return idle
}

// logNow reports whether a rate-limited line may be logged now, at most
// once a second, and records that it was. last holds the time of the
// previous line in Unix nanoseconds.
func logNow(last *atomic.Int64) bool {
	now := time.Now().UnixNano()
	l := last.Load()
	return now-l >= int64(time.Second) && last.CompareAndSwap(l, now)
}
