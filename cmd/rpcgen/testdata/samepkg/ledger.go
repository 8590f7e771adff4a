// Package ledger declares its messages itself, and names that clash with the
// imports of the generated code.
package ledger

import "context"

// Entry is a ledger entry.
type Entry struct{ Amount int64 }

// Balance is an account balance.
type Balance struct{ Amount int64 }

// proxy and time are taken here, so the generated file must rename its
// imports of the same names.
var (
	proxy = "none"
	time  = 0
)

// Ledger records entries.
type Ledger interface {
	// Post records an entry.
	Post(ctx context.Context, req *Entry) (*Balance, error)
	//dabb:timeout 750ms
	Get(ctx context.Context, req *Entry) (*Balance, error)
}
