// Package pb has the same name as ../pb, to force an import alias.
package pb

// Order is an order.
type Order struct{ ID string }

// Receipt confirms an order.
type Receipt struct{ ID string }
