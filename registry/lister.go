// Lister: the optional interface of a Registry that names the services it holds.

package registry

import "context"

// Lister is an optional interface of a Registry that can name the services
// it holds, for tools that browse a registry (cmd/dabbctl). registry/zk,
// registry/etcd and registry/static implement it.
type Lister interface {
	// Services returns the names of the services that have at least one
	// instance now, sorted, without duplicates. It honours ctx's deadline
	// as the Registry's methods do, and fails when the registry cannot be
	// reached.
	Services(ctx context.Context) ([]string, error)
}
