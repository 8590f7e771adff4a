// The timeout attachment: a call's remaining budget as whole milliseconds on the wire.

package protocol

import (
	"fmt"
	"time"
)

// timeoutMillis is the timeout attachment's value for d: milliseconds,
// rounded up, so the server's deadline is never earlier than the caller's
// (the caller gives up first).
func timeoutMillis(d time.Duration) int64 {
	switch {
	case d > maxTimeout:
		return maxTimeoutMillis
	case d > 0:
		return int64((d + time.Millisecond - 1) / time.Millisecond)
	}
	return 0
}

// maxTimeoutMillis is the largest budget the wire carries (twelve digits,
// about 31 years); a longer timeout is sent as this.
const (
	maxTimeoutMillis = 999_999_999_999
	maxTimeout       = maxTimeoutMillis * time.Millisecond
)

// parseMillis reads a non-negative decimal count of milliseconds; 0 means
// the budget is spent and comes back as -1ns.
func parseMillis[T string | []byte](b T) (time.Duration, error) {
	if len(b) == 0 || len(b) > len("999999999999") {
		return 0, fmt.Errorf("timeout %q is not a millisecond count", b)
	}
	var ms int64
	for i := range len(b) {
		c := b[i]
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("timeout %q is not a millisecond count", b)
		}
		ms = ms*10 + int64(c-'0')
	}
	if ms == 0 {
		return -1, nil
	}
	return time.Duration(ms) * time.Millisecond, nil
}
