//go:build !unix

package scale

import "time"

// cpuTime returns 0: getrusage is Unix's.
func cpuTime() time.Duration { return 0 }
