// Output: tables for people, JSON lines for scripts.

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/dabbrpc/dabb/registry"
)

// newTable returns a writer that aligns tab-separated columns; Flush it.
func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
}

// writeJSON writes v as one line of JSON.
func writeJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode output: %w", err)
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// instanceJSON is an instance as -o json prints it.
type instanceJSON struct {
	Service  string            `json:"service"`
	ID       string            `json:"id"`
	Addr     string            `json:"addr"`
	Weight   int               `json:"weight"`
	Metadata map[string]string `json:"metadata,omitempty"`
	// Health is set by ls -health: serving, not serving, unknown, or
	// error (Error says why).
	Health string `json:"health,omitempty"`
	Error  string `json:"error,omitempty"`
}

func toJSON(in registry.Instance) instanceJSON {
	return instanceJSON{Service: in.Service, ID: in.ID, Addr: in.Addr, Weight: in.EffectiveWeight(), Metadata: in.Metadata}
}

// metadataText formats metadata as k=v pairs, sorted by key, "-" for none.
func metadataText(md map[string]string) string {
	if len(md) == 0 {
		return "-"
	}
	var b strings.Builder
	for i, k := range slices.Sorted(maps.Keys(md)) {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k + "=" + md[k])
	}
	return b.String()
}
