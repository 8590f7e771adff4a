package codec_test

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/dabbrpc/dabb/codec"
)

// fake is a codec with a chosen id and name. The registry is global and
// has no Unregister, so tests take ids nobody holds (freeID) and unique
// names (fakeName); that keeps them correct under -count=N and alongside
// real codecs.
type fake struct {
	id   byte
	name string
}

func (f fake) ID() byte                                  { return f.id }
func (f fake) Name() string                              { return f.name }
func (f fake) Marshal(dst []byte, v any) ([]byte, error) { return dst, nil }
func (f fake) Unmarshal(data []byte, v any) error        { return nil }

var names atomic.Int64

func fakeName(t *testing.T) string {
	return "fake-" + t.Name() + "-" + strconv.FormatInt(names.Add(1), 10)
}

// freeID returns an id no codec holds yet. Each test registers at most one
// codec, so the 32 ids last for many -count repetitions; when they run
// out the test is skipped, not failed.
func freeID(t *testing.T) byte {
	t.Helper()
	for id := byte(31); ; id-- {
		if _, err := codec.ByID(id); err != nil {
			return id
		}
		if id == 0 {
			t.Skip("all 32 serialization ids are registered in this process")
		}
	}
}

func mustPanic(t *testing.T, want string, f func()) {
	t.Helper()
	defer func() {
		t.Helper()
		r := recover()
		if r == nil {
			t.Fatalf("no panic, want one mentioning %q", want)
		}
		if msg := fmt.Sprint(r); !strings.Contains(msg, want) {
			t.Fatalf("panic %q does not mention %q", msg, want)
		}
	}()
	f()
}

func TestRegisterAndLookup(t *testing.T) {
	c := fake{id: freeID(t), name: fakeName(t)}
	codec.Register(c)

	got, err := codec.ByID(c.id)
	if err != nil {
		t.Fatalf("ByID(%d): %v", c.id, err)
	}
	if got != codec.Codec(c) {
		t.Errorf("ByID(%d) = %v, want %v", c.id, got, c)
	}
	got, err = codec.ByName(c.name)
	if err != nil {
		t.Fatalf("ByName(%q): %v", c.name, err)
	}
	if got != codec.Codec(c) {
		t.Errorf("ByName(%q) = %v, want %v", c.name, got, c)
	}
}

func TestRegisterPanics(t *testing.T) {
	t.Run("nil", func(t *testing.T) {
		mustPanic(t, "nil", func() { codec.Register(nil) })
	})
	for _, id := range []byte{32, 100, 255} {
		t.Run("id "+strconv.Itoa(int(id)), func(t *testing.T) {
			name := fakeName(t)
			mustPanic(t, strconv.Itoa(int(id)), func() { codec.Register(fake{id: id, name: name}) })
			if _, err := codec.ByName(name); err == nil {
				t.Errorf("codec with id %d was registered after the panic", id)
			}
		})
	}

	// One codec is registered; the duplicates must panic and leave the
	// registry as it was.
	held := fake{id: freeID(t), name: fakeName(t)}
	codec.Register(held)

	t.Run("duplicate id", func(t *testing.T) {
		other := fake{id: held.id, name: fakeName(t)}
		mustPanic(t, strconv.Itoa(int(held.id)), func() { codec.Register(other) })
		if c, _ := codec.ByID(held.id); c != codec.Codec(held) {
			t.Errorf("ByID(%d) = %v after the duplicate, want the first codec", held.id, c)
		}
		if _, err := codec.ByName(other.name); err == nil {
			t.Errorf("the duplicate's name %q was registered", other.name)
		}
	})
	t.Run("duplicate name", func(t *testing.T) {
		other := fake{id: freeID(t), name: held.name}
		mustPanic(t, held.name, func() { codec.Register(other) })
		if _, err := codec.ByID(other.id); err == nil {
			t.Errorf("the duplicate's id %d was registered", other.id)
		}
		if c, _ := codec.ByName(held.name); c != codec.Codec(held) {
			t.Errorf("ByName(%q) = %v after the duplicate, want the first codec", held.name, c)
		}
	})
}

func TestUnknown(t *testing.T) {
	free := freeID(t)
	tests := []struct {
		name   string
		lookup func() (codec.Codec, error)
		want   string
	}{
		{"free id", func() (codec.Codec, error) { return codec.ByID(free) }, "id " + strconv.Itoa(int(free))},
		{"id over 31", func() (codec.Codec, error) { return codec.ByID(200) }, "id 200"},
		{"id 255", func() (codec.Codec, error) { return codec.ByID(255) }, "id 255"},
		{"name", func() (codec.Codec, error) { return codec.ByName("no-such-codec") }, `"no-such-codec"`},
		{"empty name", func() (codec.Codec, error) { return codec.ByName("") }, `name ""`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := tt.lookup()
			if c != nil {
				t.Errorf("got codec %v, want nil", c)
			}
			if !errors.Is(err, codec.ErrUnknown) {
				t.Fatalf("err = %v, want one wrapping ErrUnknown", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err %q does not contain %q", err, tt.want)
			}
		})
	}
}

// Lookups take no lock; run them against a Register under -race.
func TestLookupDuringRegister(t *testing.T) {
	c := fake{id: freeID(t), name: fakeName(t)}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			<-start
			for range 1000 {
				if got, err := codec.ByID(c.id); err == nil && got != codec.Codec(c) {
					t.Errorf("ByID(%d) = %v during Register", c.id, got)
					return
				}
				_, _ = codec.ByName(c.name)
			}
		})
	}
	close(start)
	codec.Register(c)
	wg.Wait()
	if got, err := codec.ByName(c.name); err != nil || got != codec.Codec(c) {
		t.Errorf("ByName(%q) = %v, %v after Register", c.name, got, err)
	}
}

// TestUnknownIDNamesItsPackage: an id of one of dabb's own codecs that
// was not imported says which package to import.
func TestUnknownIDNamesItsPackage(t *testing.T) {
	_, err := codec.ByID(16) // codec/json, not imported by this test
	if !errors.Is(err, codec.ErrUnknown) || !strings.Contains(err.Error(), "github.com/dabbrpc/dabb/codec/json") {
		t.Errorf("ByID(16) = %v; want ErrUnknown naming the codec/json package", err)
	}
	for id := byte(0); id < 32; id++ {
		if id == 16 || id == 22 {
			continue
		}
		if _, err := codec.ByID(id); err != nil && strings.Contains(err.Error(), "import") {
			t.Errorf("ByID(%d) = %v; want a plain ErrUnknown", id, err)
		}
	}
}

// TestUnknownNameNamesItsPackage: the same for a codec asked for by name
// (a client's proxy.WithCodec("json") without the import).
func TestUnknownNameNamesItsPackage(t *testing.T) {
	_, err := codec.ByName("json")
	if !errors.Is(err, codec.ErrUnknown) || !strings.Contains(err.Error(), `import _ "github.com/dabbrpc/dabb/codec/json"`) {
		t.Errorf("ByName(json) = %v; want ErrUnknown naming the codec/json package", err)
	}
	if _, err := codec.ByName("yaml"); err == nil || strings.Contains(err.Error(), "import") {
		t.Errorf("ByName(yaml) = %v; want a plain ErrUnknown", err)
	}
}

// TestKnown: registered codecs and dabb's own not imported are known; the
// ids of other protocols' serializations (hessian2, fastjson) are not.
func TestKnown(t *testing.T) {
	c := fake{id: freeID(t), name: fakeName(t)}
	if codec.Known(c.id) {
		t.Fatalf("Known(%d) before its Register", c.id)
	}
	codec.Register(c)
	for _, id := range []byte{c.id, 16, 22} {
		if !codec.Known(id) {
			t.Errorf("Known(%d) = false, want true", id)
		}
	}
	for _, id := range []byte{2, 6, 200} {
		if codec.Known(id) {
			t.Errorf("Known(%d) = true: no codec of dabb's has it", id)
		}
	}
}
