package inventory

import "time"

// SetClock replaces the store's clock, for tests of the retention.
func SetClock(s *Store, now func() time.Time) { s.now = now }
