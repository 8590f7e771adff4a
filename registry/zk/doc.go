// Package zk is the ZooKeeper backend of [registry.Registry].
//
// A server publishes itself and a client follows a service:
//
//	r, err := zk.New(zk.Config{Servers: []string{"10.0.0.1:2181", "10.0.0.2:2181"}})
//	if err != nil { ... }
//	defer r.Close() // removes what r registered
//	err = r.Register(ctx, registry.Instance{Service: "inventory.Inventory", ID: "10.0.0.7:20880", Addr: "10.0.0.7:20880"})
//	w, err := r.Watch(ctx, "inventory.Inventory")
//	set, err := w.Next(ctx) // the full set, now and after each change
//
// or, by URL, after importing this package:
//
//	r, err := registry.Open(ctx, "zk://10.0.0.1:2181,10.0.0.2:2181/services?session_timeout=10s")
//
// The host lists the servers, the path is the prefix; the query may set
// session_timeout and request_timeout as Go durations (Config.SessionTimeout
// and RequestTimeout: 10 s and 3 s by default). Unknown or repeated
// parameters, and credentials in the URL, are errors.
//
// The layout: a persistent node per service, <prefix>/<service>, and under
// it one EPHEMERAL node per instance, <prefix>/<service>/<instance-id>,
// holding the [registry.Instance] as JSON. An instance therefore disappears
// when its owner's session ends, whether by Close, by a crash (after the
// session timeout) or by a partition longer than the session timeout. When
// a session expires, the owner gets a new one and re-creates its nodes on
// its own; a node left by an older session of the same instance ID is
// replaced. A node that someone else deletes while the session lives is
// re-created at once: the owner watches each of its nodes. A node's data is
// never changed in place: a new version of an instance replaces the node in
// one transaction, so watchers, which watch the children of the service
// node, see every change.
//
// New does no I/O: the connection is made on first use. Every call waits
// for a live session at most until its context ends or
// [Config.RequestTimeout] passes. A ZooKeeper that is down thus makes
// calls fail, never hang. A watcher keeps its last set while ZooKeeper is
// unreachable, and resumes when the session is back.
//
// The session may stay down for the session timeout ZooKeeper granted
// ([Registry.SessionTimeout]). By then ZooKeeper has expired it, unless
// only this client was cut off, and the set may have changed unseen. Next
// then returns an error wrapping [ErrNoSession], and so
// registry.ErrUnavailable, once. The call after that returns the full set
// as soon as a session is back and the set has been read again.
//
// A Registry implements [registry.Reachability]: a [registry.Cache] whose
// first lookup got no answer says whether ZooKeeper could not be reached.
package zk
