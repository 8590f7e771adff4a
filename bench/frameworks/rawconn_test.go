package frameworks

import "testing"

// TestRawConnUnanswered: each caller in flight has a connection of its
// own, dialed when no idle one is left; the connection of a cancelled call
// is closed, its answer being unread. Dial's connection, which the
// cancelled call took, and one for each of 3 callers make 4.
func TestRawConnUnanswered(t *testing.T) {
	testUnanswered(t, dialRawConn, 3, 4)
}
