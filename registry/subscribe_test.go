// Tests of Cache.Subscribe.

package registry_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
)

func TestCacheUnsubscribeFromCallback(t *testing.T) {
	st := static.New(inst("a.A", "1"))
	defer st.Close()
	c := newCache(t, st, registry.CacheConfig{})
	lookup(t, c, "a.A")
	var calls atomic.Int32
	var unsub func()
	done := make(chan struct{})
	unsub, err := c.Subscribe("a.A", func([]registry.Instance) {
		if calls.Add(1) == 2 {
			unsub()
			close(done)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	mustRegister(t, st, inst("a.A", "2"))
	select {
	case <-done:
	case <-time.After(waitTimeout):
		t.Fatal("no second call")
	}
	mustRegister(t, st, inst("a.A", "3"))
	eventually(t, "the cache to see the third instance", func() bool { return idsOf(lookup(t, c, "a.A")) == "1,2,3" })
	if n := calls.Load(); n != 2 {
		t.Fatalf("callback called %d times, want 2 (none after unsubscribing)", n)
	}
}
