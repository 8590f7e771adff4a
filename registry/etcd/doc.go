// Package etcd is a [registry.Registry] backed by etcd v3.
//
// Each instance is the key <prefix>/<service>/<id> holding the Instance as
// JSON, bound to a lease that this registry keeps alive. A provider that
// dies stops renewing the lease and its keys vanish after the TTL; a
// provider that loses its lease (a partition longer than the TTL, a revoke)
// grants a new one and puts its keys again, on its own.
//
//	r, err := etcd.New(etcd.Config{Endpoints: []string{"127.0.0.1:2379"}})
//	if err != nil { ... }
//	defer r.Close() // revokes the lease: the instances disappear at once
//	err = r.Register(ctx, registry.Instance{Service: "inventory.Inventory", ID: "10.0.0.7:20880", Addr: "10.0.0.7:20880"})
//
//	w, err := r.Watch(ctx, "inventory.Inventory")
//	for {
//		set, err := w.Next(ctx) // the full set, each time it changes
//		...
//	}
//
// Or by URL, after import _ "github.com/dabbrpc/dabb/registry/etcd":
//
//	r, err := registry.Open(ctx, "etcd://h1:2379,h2:2379/services?ttl=10s&timeout=3s")
//
// The host lists the endpoints, the path is the prefix; the query may set
// ttl, timeout and dial_timeout as Go durations (Config.TTL, RequestTimeout
// and DialTimeout: 10 s, 3 s and 2 s by default; the last of a repeated
// parameter counts), and user:pass@ before the hosts authenticates.
// Unknown parameters are errors.
//
// A watcher lists the prefix, then watches it from the listed revision + 1;
// after a compaction or a broken watch it lists again. When the client loses
// its connection to every endpoint, Next returns an error wrapping
// [ErrUnavailable] once; the call after that returns the full set as soon
// as etcd answers again. Every call is bounded by Config.RequestTimeout, so
// an etcd that is down makes calls fail, never hang.
//
// A Registry implements [registry.Reachability]: a [registry.Cache] whose
// first lookup got no answer says whether etcd could not be reached.
package etcd
