// Package dabbtest serves a dabb.Server on loopback for the tests of the
// packages above the root package.
package dabbtest

import (
	"errors"
	"net"
	"testing"

	"github.com/dabbrpc/dabb"
)

// Serve serves s on a loopback port and returns the address. When the
// test ends it closes s and fails the test unless Serve returned
// ErrServerClosed.
func Serve(t testing.TB, s *dabb.Server) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(l) }()
	t.Cleanup(func() {
		s.Close()
		if err := <-done; !errors.Is(err, dabb.ErrServerClosed) {
			t.Errorf("Serve returned %v, want ErrServerClosed", err)
		}
	})
	return l.Addr().String()
}
