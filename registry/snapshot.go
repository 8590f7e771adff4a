// The snapshot file: the last known instances, saved so a new process can call while the registry is down.

package registry

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// snapshotVersion is the format version of the snapshot file.
const snapshotVersion = 1

// snapshotFile is the snapshot's JSON form:
//
//	{"version":1,"saved":"2026-01-02T15:04:05Z","services":{"inventory.Inventory":[{...Instance...}]}}
type snapshotFile struct {
	Version  int                   `json:"version"`
	Saved    time.Time             `json:"saved"`
	Services map[string][]Instance `json:"services"`
}

// snapshotStore holds the snapshot file's services in memory: read once,
// at the first need, and written back whole on every change. Before each
// write the file is read again, and the services this store never saved
// are taken as the file has them: another Cache or process sharing the
// path keeps what it wrote. A lock on its directory (flock, on Unix)
// keeps two writers' read-and-write from overlapping.
type snapshotStore struct {
	path string
	log  *slog.Logger

	mu       sync.Mutex // guards following
	loaded   bool
	services map[string][]Instance
	mine     map[string]bool // services this store saved
	failing  bool            // the last write failed (logged once)
	// lockFailing: the last write could not take the lock (logged once).
	lockFailing bool
}

// loadLocked reads the file once; a missing or unreadable file leaves an
// empty store (and is logged, unless it is merely missing).
func (s *snapshotStore) loadLocked() {
	if s.loaded {
		return
	}
	s.loaded = true
	s.services = make(map[string][]Instance)
	services, err := readSnapshot(s.path)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			s.log.Warn("ignoring the snapshot file", "path", s.path, "err", err)
		}
		return
	}
	s.services = services
}

// lookup returns the snapshot's instances of service, if it has any.
func (s *snapshotStore) lookup(service string) ([]Instance, bool) {
	if s.path == "" {
		return nil, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.loadLocked()
	ins := s.services[service]
	return ins, len(ins) > 0
}

// save records the instances of service and rewrites the file.
func (s *snapshotStore) save(service string, ins []Instance) {
	if s.path == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.loadLocked()
	// Other writers (Caches, processes) wait while this one reads the
	// file and writes it back; without the lock, write anyway.
	if unlock, err := lockSnapshot(s.path); err != nil {
		if !s.lockFailing {
			s.log.Warn("writing the snapshot file without its lock", "path", s.path, "err", err)
		}
		s.lockFailing = true
	} else {
		s.lockFailing = false
		defer unlock()
	}
	if cur, err := readSnapshot(s.path); err == nil {
		for svc := range s.services {
			if _, ok := cur[svc]; !ok && !s.mine[svc] {
				delete(s.services, svc)
			}
		}
		for svc, list := range cur {
			if !s.mine[svc] {
				s.services[svc] = list
			}
		}
	}
	if s.mine == nil {
		s.mine = make(map[string]bool)
	}
	s.mine[service] = true
	if len(ins) == 0 {
		delete(s.services, service)
	} else {
		s.services[service] = ins
	}
	if err := writeSnapshot(s.path, s.services); err != nil {
		if !s.failing {
			s.log.Error("cannot write the snapshot file", "path", s.path, "err", err)
		}
		s.failing = true
		return
	}
	s.failing = false
}

// readSnapshot reads a snapshot file, checking what it holds.
func readSnapshot(path string) (map[string][]Instance, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("registry: read snapshot: %w", err)
	}
	var f snapshotFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("registry: snapshot %s: %w", path, err)
	}
	if f.Version != snapshotVersion {
		return nil, fmt.Errorf("registry: snapshot %s: version %d, want %d", path, f.Version, snapshotVersion)
	}
	services := make(map[string][]Instance, len(f.Services))
	for name, ins := range f.Services {
		if ValidateService(name) != nil {
			continue
		}
		valid := make([]Instance, 0, len(ins))
		for _, in := range ins {
			in.Service = name
			if in.Validate() == nil {
				valid = append(valid, in)
			}
		}
		if len(valid) > 0 {
			services[name] = SortedCopy(valid)
		}
	}
	return services, nil
}

// writeSnapshot writes the file atomically: a temporary file in the same
// directory, synced, then renamed over the old one, so a reader (or a
// crash) sees the old file or the new one, never a part.
func writeSnapshot(path string, services map[string][]Instance) error {
	data, err := json.MarshalIndent(snapshotFile{
		Version:  snapshotVersion,
		Saved:    time.Now().UTC(),
		Services: services,
	}, "", "\t")
	if err != nil {
		return fmt.Errorf("registry: encode snapshot: %w", err)
	}
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return fmt.Errorf("registry: write snapshot: %w", err)
	}
	defer os.Remove(tmp.Name()) // after a successful rename, a no-op
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("registry: write snapshot: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("registry: write snapshot: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("registry: write snapshot: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("registry: write snapshot: %w", err)
	}
	return nil
}
