// Package proxy has the name of the dabb runtime's proxy package.
package proxy

// Route asks for a route.
type Route struct{ To string }
