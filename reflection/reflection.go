// Package reflection defines dabb's reflection service on the wire: its
// name, its methods and its messages. A dabb.Server serves it unless
// dabb.WithoutReflection is given.
//
// The service is called like any other, with the JSON codec:
//
//	dabb.Reflection/List     {}                                → ListReply
//	dabb.Reflection/Describe {"service":"inventory.Inventory"} → Service
package reflection

// ServiceName is the reflection service's name on the wire.
const ServiceName = "dabb.Reflection"

// The reflection service's methods.
const (
	MethodList     = "List"
	MethodDescribe = "Describe"
)

// ListRequest asks for the server's services. It has no fields.
type ListRequest struct{}

// ListReply names the server's services, sorted, built-in ones included.
type ListReply struct {
	Services []string `json:"services"`
}

// DescribeRequest asks for one service.
type DescribeRequest struct {
	Service string `json:"service"`
}

// Service describes one service: its methods and, for protobuf messages,
// the descriptors of their types.
type Service struct {
	Name    string   `json:"name"`
	Methods []Method `json:"methods"`
	// Files is a serialized google.protobuf.FileDescriptorSet holding the
	// files of every protobuf message the methods take or return, with
	// their dependencies. It is empty when no method uses protobuf.
	Files []byte `json:"files,omitempty"`
}

// Method describes one method, with its directives.
type Method struct {
	Name string `json:"name"`
	// Idempotent records //dabb:idempotent.
	Idempotent bool `json:"idempotent,omitempty"`
	// Timeout records //dabb:timeout as a Go duration ("200ms"); empty
	// for the client's default.
	Timeout  string `json:"timeout,omitempty"`
	Request  Type   `json:"request"`
	Response Type   `json:"response"`
}

// Type describes a method's request or response type. Every field is
// empty when the server's ServiceDesc does not record the type
// (MethodDesc.Request or Response is nil): the type is unknown.
type Type struct {
	// GoType is the Go type's name, e.g. "*inventorypb.DeductRequest".
	GoType string `json:"go_type"`
	// Proto is the protobuf message's full name, e.g.
	// "inventory.DeductRequest"; empty for a type that is not a protobuf
	// message. Its descriptor is in Service.Files.
	Proto string `json:"proto,omitempty"`
	// Skeleton is a JSON value with every field at its zero value: a
	// request template. For protobuf messages it uses protojson's names.
	// Empty when the type has no JSON form the server can write.
	Skeleton string `json:"skeleton,omitempty"`
}
