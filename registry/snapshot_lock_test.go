package registry

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
)

// TestSnapshotConcurrentWriters: two stores (two processes, as far as
// the file is concerned) saving different services at the same moments
// both find their last lists in the file: the read-merge-write of one
// never overlaps the other's.
func TestSnapshotConcurrentWriters(t *testing.T) {
	path := filepath.Join(t.TempDir(), "registry.json")
	log := slog.New(slog.DiscardHandler)
	const rounds, saves = 10, 40
	for round := range rounds {
		stores := []*snapshotStore{{path: path, log: log}, {path: path, log: log}}
		var wg sync.WaitGroup
		for i, s := range stores {
			svc := fmt.Sprintf("s%d.S", i)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := range saves {
					s.save(svc, []Instance{{Service: svc, ID: strconv.Itoa(n), Addr: "127.0.0.1:" + strconv.Itoa(1000+n)}})
				}
			}()
		}
		wg.Wait()
		got, err := readSnapshot(path)
		if err != nil {
			t.Fatal(err)
		}
		for i := range stores {
			svc := fmt.Sprintf("s%d.S", i)
			if ins := got[svc]; len(ins) != 1 || ins[0].ID != strconv.Itoa(saves-1) {
				t.Fatalf("round %d: the file holds %v for %s, want its last save (id %d): a concurrent write lost it", round, ins, svc, saves-1)
			}
		}
	}
}
