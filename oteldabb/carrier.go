// Carriers: the trace context and baggage in a request's attachments.

package oteldabb

import (
	"maps"
	"slices"

	"github.com/dabbrpc/dabb/proxy"
)

// callCarrier writes the propagated fields into a client call's
// attachments, which every attempt carries.
type callCarrier struct{ call *proxy.Call }

func (c callCarrier) Get(key string) string { return c.call.Attachments[key] }
func (c callCarrier) Set(key, value string) { c.call.SetAttachment(key, value) }
func (c callCarrier) Keys() []string        { return slices.Collect(maps.Keys(c.call.Attachments)) }

// attachmentsCarrier reads the propagated fields from a request's
// attachments. It never writes: the map is the request's own.
type attachmentsCarrier map[string]string

func (c attachmentsCarrier) Get(key string) string { return c[key] }
func (attachmentsCarrier) Set(string, string)      {}
func (c attachmentsCarrier) Keys() []string        { return slices.Collect(maps.Keys(c)) }
