//go:build unix

package registry

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSnapshotWritesWithoutAStuckLock: a writer that cannot take the lock
// within lockWait (another writer stuck holding it) writes anyway and says
// so once, not on every save; once the lock is free again it is taken, and
// the next stuck spell is reported again.
func TestSnapshotWritesWithoutAStuckLock(t *testing.T) {
	defer func(d time.Duration) { lockWait = d }(lockWait)
	lockWait = 20 * time.Millisecond
	dir := t.TempDir()
	path := filepath.Join(dir, "registry.json")
	var logs bytes.Buffer
	s := &snapshotStore{path: path, log: slog.New(slog.NewTextHandler(&logs, nil))}
	warnings := func() int { return strings.Count(logs.String(), "writing the snapshot file without its lock") }

	hold := func() (release func()) {
		f, err := os.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			t.Fatal(err)
		}
		return func() { f.Close() }
	}
	saved := func(id string) {
		t.Helper()
		s.save("a.A", []Instance{{Service: "a.A", ID: id, Addr: "127.0.0.1:1"}})
		got, err := readSnapshot(path)
		if err != nil {
			t.Fatal(err)
		}
		if ins := got["a.A"]; len(ins) != 1 || ins[0].ID != id {
			t.Fatalf("after saving %s the file holds %v", id, ins)
		}
	}

	release := hold()
	saved("1")
	saved("2")
	if n := warnings(); n != 1 {
		t.Fatalf("%d warnings for two saves without the lock, want 1:\n%s", n, logs.String())
	}
	release()
	saved("3")
	if n := warnings(); n != 1 {
		t.Fatalf("a save with the lock free logged: %d warnings, want still 1", n)
	}
	release = hold()
	defer release()
	saved("4")
	if n := warnings(); n != 2 {
		t.Fatalf("%d warnings after a second stuck spell, want 2:\n%s", n, logs.String())
	}
}
