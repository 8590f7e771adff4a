// Package balancer chooses which instance of a service takes each attempt
// of a call.
//
// Make one Balancer per service, give it every instance list the registry
// delivers, and pick once per attempt:
//
//	b, err := balancer.New(balancer.Default, balancer.Config{Available: closedAndNotDraining})
//	b.Update(instances) // again on every change
//
//	in, done, err := b.Pick(ctx, key) // err wraps ErrNoInstance when none is left
//	start := time.Now()
//	err = attempt(ctx, in.Addr)
//	done(time.Since(start), err) // exactly once; nil err on success
//
// A retry asks for an instance it has not tried yet. It passes the
// addresses already tried, kept in a small array on the call so that
// nothing allocates:
//
//	tried := [3]string{in.Addr}
//	in, done, err = b.PickExcept(ctx, key, tried[:1])
//
// Exclusion is a method argument because it belongs to one call: a field of
// Config would be shared by every call of the balancer, a context value
// allocates and is found by walking the context chain, and variadic
// options escape to the heap.
//
// Which balancer when:
//
//   - p2c, the Default: most services. It compares two random instances by
//     latency and calls in flight and takes the cheaper, so slow, overloaded
//     or failing instances lose traffic within one answer and win it back
//     once they are fast again. It reacts to what callers see, needs no
//     tuning, and costs one clock read per pick.
//   - round_robin: instances that are alike and calls that cost the same,
//     when an exact, predictable share per instance matters more than
//     latency (a load test, weights used for a gradual rollout). Smooth
//     weighted: weights 5, 1, 1 give a a b a c a a.
//   - random: the same shares as round_robin without shared state between
//     picks; fine for many clients each making few calls.
//   - least_active: long or uneven calls (streams of work, batch jobs)
//     where the count in flight is the best signal of load; O(instances)
//     per pick.
//   - consistent_hash: calls that should land on the instance that already
//     has their data (per-user caches, in-memory sessions). The key comes
//     from the call; removing one of N instances moves only the keys it
//     owned. The empty key is routed at random.
//
// Weights (registry.Instance.EffectiveWeight) set the shares of random,
// round_robin and consistent_hash, divide p2c's cost and break
// least_active's ties. Every balancer skips the instances Config.Available
// rejects; Pick never blocks, and when nothing is left it returns an error
// wrapping ErrNoInstance, never an empty Instance.
package balancer
