// Package pb holds message types shared by the test cases.
package pb

import "github.com/dabbrpc/dabb/cmd/rpcgen/testdata/types/internal/hidden"

// Note is the name of a message of an internal package for those who may
// not import it.
type Note = hidden.Note

// DeductRequest asks to take Count units of SKU out of stock.
type DeductRequest struct {
	SKU   string
	Count int64
}

// DeductReply says what is left.
type DeductReply struct{ Left int64 }

// StockRequest asks for the stock of SKU.
type StockRequest struct{ SKU string }

// StockReply is the stock of an item.
type StockReply struct{ Count int64 }
