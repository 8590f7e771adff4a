//go:build unix

// The snapshot file's advisory lock on unix (flock).

package registry

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// lockWait bounds how long a snapshot write waits for another writer's
// lock before it writes without it. A writer holds the lock for one read
// and one write of a small file; only a stuck one holds it longer.
var lockWait = 2 * time.Second

// lockSnapshot takes an exclusive advisory lock (flock) on the directory
// of the snapshot file, which serializes the read-merge-write of writers
// sharing it, in this process or others. The file itself cannot carry the
// lock, since each write renames a new file over it; the directory leaves
// nothing behind.
func lockSnapshot(path string) (unlock func(), err error) {
	f, err := os.Open(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("registry: lock snapshot: %w", err)
	}
	deadline := time.Now().Add(lockWait)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil // closing releases the lock
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("registry: lock snapshot: %w", err)
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("registry: lock snapshot: held by another writer for %v", lockWait)
		}
		time.Sleep(2 * time.Millisecond) // flock has no wait with a timeout: poll
	}
}
