// Store, the inventory service's implementation: stock per sku, and deductions once per request id.

package inventory

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dabbrpc/dabb"
	pb "github.com/dabbrpc/dabb/internal/inventory/inventorypb"
	"github.com/dabbrpc/dabb/protocol"
)

// ErrInsufficientStock is returned by Deduct when sku has fewer units than
// asked for; nothing is deducted. It reaches callers as a service error
// (status 70) with this text.
var ErrInsufficientStock = fmt.Errorf("inventory: insufficient stock")

// ErrRequestIDReused is returned by Deduct when a request id it remembers
// comes back with a different sku or count: a client bug (an id reused for
// another deduction), not a retry, so it is neither deducted nor answered
// with the first deduction's figures. It reaches callers as a bad request
// (status 40) with this text.
var ErrRequestIDReused = errors.New("inventory: request id reused for a different deduction")

// Store is an in-memory Inventory. It never deducts twice for one request
// id: the first answer for an id is recorded in the same critical section
// as the deduction, and a repeat gets that answer back with Duplicate set.
// A repeat must ask for the same sku and count; one that does not is
// refused with ErrRequestIDReused.
//
// Records are kept for Retention (DefaultRetention unless set before the
// first call), then forgotten, so memory stays bounded under steady
// traffic. The retention must outlast every retry of a call: dabb retries
// only within the call's one budget (1 s by default), so ten minutes
// leaves a wide margin for clients with long timeouts and for requests
// re-sent by hand with the same request id.
//
// A real store would write the record and the stock change in one
// database transaction and expire records the same way; the shape of the
// rule is the same.
type Store struct {
	// Retention is how long the answer for a request id is remembered.
	Retention time.Duration
	now       func() time.Time // the clock; tests replace it

	mu      sync.Mutex // guards following
	stock   map[string]int64
	done    map[string]deduction // request id -> what it asked for and the first answer
	expiry  []record             // the ids of done, oldest first
	expired int                  // records dropped from the head of expiry

	deducted   atomic.Int64 // units actually deducted
	duplicates atomic.Int64 // repeated request ids answered from the record
	calls      atomic.Int64 // Deduct and Stock calls served
}

// DefaultRetention is how long a Store remembers a request id by default.
const DefaultRetention = 10 * time.Minute

// deduction is a remembered request: what it asked for and its answer.
type deduction struct {
	sku   string
	count int32
	reply *pb.DeductReply
}

// record is one remembered request id and when it was recorded.
type record struct {
	id string
	at time.Time
}

// NewStore returns a store holding the given stock per SKU.
func NewStore(stock map[string]int64) *Store {
	s := &Store{
		Retention: DefaultRetention,
		now:       time.Now,
		stock:     make(map[string]int64, len(stock)),
		done:      map[string]deduction{},
	}
	for k, v := range stock {
		s.stock[k] = v
	}
	return s
}

var _ Inventory = (*Store)(nil)

// Deduct implements Inventory. The request id is the request's request_id,
// or the call's idempotency key when the request has none.
func (s *Store) Deduct(ctx context.Context, req *pb.DeductRequest) (*pb.DeductReply, error) {
	s.calls.Add(1)
	if req.GetCount() <= 0 {
		return nil, protocol.Errorf(protocol.StatusBadRequest, "count must be positive, got %d", req.GetCount())
	}
	id := req.GetRequestId()
	if id == "" {
		id = dabb.IdempotencyKey(ctx)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	s.forgetLocked(now)
	if id != "" {
		if prev, ok := s.done[id]; ok {
			if prev.sku != req.GetSku() || prev.count != req.GetCount() {
				return nil, &protocol.Error{Status: protocol.StatusBadRequest,
					Msg: fmt.Sprintf("request id %q was used for %d of %s, now %d of %s", id, prev.count, prev.sku, req.GetCount(), req.GetSku()),
					Err: ErrRequestIDReused}
			}
			s.duplicates.Add(1)
			return &pb.DeductReply{Remaining: prev.reply.GetRemaining(), Duplicate: true}, nil
		}
	}
	have, ok := s.stock[req.GetSku()]
	if !ok {
		return nil, protocol.Errorf(protocol.StatusBadRequest, "unknown sku %s", req.GetSku())
	}
	if have < int64(req.GetCount()) {
		return nil, fmt.Errorf("%w: %s has %d, asked for %d", ErrInsufficientStock, req.GetSku(), have, req.GetCount())
	}
	have -= int64(req.GetCount())
	s.stock[req.GetSku()] = have
	s.deducted.Add(int64(req.GetCount()))
	reply := &pb.DeductReply{Remaining: have}
	if id != "" {
		s.done[id] = deduction{sku: req.GetSku(), count: req.GetCount(), reply: reply}
		s.expiry = append(s.expiry, record{id, now})
	}
	return reply, nil
}

// forgetLocked drops the records older than the retention. Records are
// appended in time order, so the old ones are at the head.
func (s *Store) forgetLocked(now time.Time) {
	cut := now.Add(-s.Retention)
	i := 0
	for i < len(s.expiry) && s.expiry[i].at.Before(cut) {
		delete(s.done, s.expiry[i].id)
		i++
	}
	if i == 0 {
		return
	}
	s.expiry = s.expiry[i:]
	s.expired += i
	if s.expired > len(s.expiry) { // compact: the dropped head is the larger part
		s.expiry = append([]record(nil), s.expiry...)
		s.expired = 0
	}
}

// Remembered returns how many request ids the store remembers.
func (s *Store) Remembered() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.done)
}

// Stock implements Inventory.
func (s *Store) Stock(ctx context.Context, req *pb.StockRequest) (*pb.StockReply, error) {
	s.calls.Add(1)
	s.mu.Lock()
	n, ok := s.stock[req.GetSku()]
	s.mu.Unlock()
	if !ok {
		return nil, protocol.Errorf(protocol.StatusBadRequest, "unknown sku %s", req.GetSku())
	}
	return &pb.StockReply{Sku: req.GetSku(), Count: n}, nil
}

// Stats reports what the store did: calls served, units deducted, repeated
// request ids answered without deducting.
func (s *Store) Stats() (calls, deducted, duplicates int64) {
	return s.calls.Load(), s.deducted.Load(), s.duplicates.Load()
}
