// The registry's sentinel errors.

package registry

import "errors"

// ErrInvalid is wrapped by the errors about malformed instances, service
// names, URLs and configurations; fix the input, retrying will not help.
var ErrInvalid = errors.New("registry: invalid")

// ErrUnavailable is wrapped by errors that say the registry could not be
// reached; retrying later may succeed. Backends wrap it in their own
// sentinels (etcd.ErrUnavailable), and [Cache.Instances] returns it when it
// knows no instances of a service and the registry does not answer.
var ErrUnavailable = errors.New("registry: unavailable")
