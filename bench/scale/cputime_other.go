//go:build !unix

package scale

import "time"

// CPUTime returns 0: getrusage is Unix's.
func CPUTime() time.Duration { return 0 }
