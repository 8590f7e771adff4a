// Package hidden declares a message that only packages below testdata/types
// may import; pb exports it through an alias.
package hidden

// Note is a message.
type Note struct{ Text string }
