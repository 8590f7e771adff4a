// JSON calls without a stub: Via, Describe, InvokeJSON and ErrNoReflection.

package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dabbrpc/dabb/codec"
	jsoncodec "github.com/dabbrpc/dabb/codec/json"
	protocodec "github.com/dabbrpc/dabb/codec/proto"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/reflection"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// ErrNoReflection matches the error of Describe and InvokeJSON when the
// server that answered serves no reflection (dabb.WithoutReflection).
var ErrNoReflection = errors.New("reflection disabled on that server")

// DescribeTTL is how long Describe keeps a service's description: 30 s.
// A description older than that is asked for again. Servers of one
// service are expected to agree on its methods; during a rolling upgrade
// a description may speak for another instance for that long.
const DescribeTTL = 30 * time.Second

type viaOption string

func (v viaOption) apply(c *Call) { c.route = string(v) }

// Via makes the call balance over the instances of service while the wire
// names the call's own service. Balancing, circuit breakers and the
// registry lookup are those of service. It is how a client reaches the
// built-in services every instance serves:
//
//	c.Invoke(ctx, reflection.ServiceName, reflection.MethodList, &reflection.ListRequest{}, &reply,
//		proxy.Via("inventory.Inventory"))
//
// An empty service is ignored: the call balances over its own service.
func Via(service string) CallOption { return viaOption(service) }

// codecOption overrides the client's codec for one call.
type codecOption struct{ c codec.Codec }

func (o codecOption) apply(c *Call) {
	if o.c != nil {
		c.codec = o.c
	}
}

// payloadOption sends bytes already encoded: Req is not read.
type payloadOption []byte

func (p payloadOption) apply(c *Call) { c.payload = p }

// The codecs of JSON calls, whatever the client's own.
var (
	jsonCodec  codec.Codec = jsoncodec.Codec{}
	protoCodec codec.Codec = protocodec.Codec{}
)

// described is a service's description as Describe keeps it.
type described struct {
	svc *reflection.Service
	at  time.Time

	once  sync.Once
	files *protoregistry.Files // from svc.Files, made on first use
	types *dynamicpb.Types
	err   error
}

// describeCache is the client's descriptions, by service.
type describeCache struct {
	mu sync.Mutex
	m  map[string]*described
}

// Describe returns the description of service: its methods with their
// directives and their request and response types. It asks
// dabb.Reflection on an instance of service, chosen as a call to service
// would be (Via), with the JSON codec and the client's default timeout.
// The call goes through the client's middlewares.
//
// A description is kept for DescribeTTL; a later Describe within that
// time answers from memory. The result is the caller's to modify.
//
// A server that serves no reflection fails with an error matching
// ErrNoReflection and ErrNotFound. A service the server does not have
// fails with ErrNotFound (code not_found). Other errors are those of any
// call: ErrUnavailable when no instance is listed, ErrTimeout, and so on.
func (c *Client) Describe(ctx context.Context, service string) (*reflection.Service, error) {
	d, err := c.describe(ctx, service)
	if err != nil {
		return nil, err
	}
	out := *d.svc
	out.Methods = slices.Clone(d.svc.Methods)
	out.Files = slices.Clone(d.svc.Files)
	return &out, nil
}

// describe returns the kept description of service, asking for it when
// there is none younger than DescribeTTL.
// opts are added to that call after its own.
func (c *Client) describe(ctx context.Context, service string, opts ...CallOption) (*described, error) {
	now := time.Now()
	c.described.mu.Lock()
	d := c.described.m[service]
	c.described.mu.Unlock()
	if d != nil && now.Sub(d.at) < DescribeTTL {
		return d, nil
	}
	svc := new(reflection.Service)
	all := append([]CallOption{Idempotent(), Via(service), codecOption{jsonCodec}}, opts...)
	err := c.Invoke(ctx, reflection.ServiceName, reflection.MethodDescribe,
		&reflection.DescribeRequest{Service: service}, svc, all...)
	if err != nil {
		return nil, describeError(err)
	}
	d = &described{svc: svc, at: now}
	c.described.mu.Lock()
	if c.described.m == nil {
		c.described.m = make(map[string]*described)
	}
	c.described.m[service] = d
	c.described.mu.Unlock()
	return d, nil
}

// describeError is the error of a Describe that failed with err. The server's own 60 for dabb.Reflection (code unimplemented) means
// it serves no reflection: the result then matches ErrNoReflection.
func describeError(err error) error {
	pe := asError(err)
	if pe != nil && pe.Remote && pe.Status == protocol.StatusServiceNotFound && pe.Code == protocol.CodeUnimplemented {
		return &protocol.Error{Status: pe.Status, Code: pe.Code, Details: pe.Details, Remote: true,
			Msg: pe.Msg, Err: ErrNoReflection}
	}
	return err
}

// protoFiles returns the files of d's FileDescriptorSet, and the message
// types they declare, parsing them on first use.
func (d *described) protoFiles() (*protoregistry.Files, *dynamicpb.Types, error) {
	d.once.Do(func() {
		var set descriptorpb.FileDescriptorSet
		if err := proto.Unmarshal(d.svc.Files, &set); err != nil {
			d.err = fmt.Errorf("parse the FileDescriptorSet of %s: %w", d.svc.Name, err)
			return
		}
		files, err := protodesc.NewFiles(&set)
		if err != nil {
			d.err = fmt.Errorf("build the descriptors of %s: %w", d.svc.Name, err)
			return
		}
		d.files, d.types = files, dynamicpb.NewTypes(files)
	})
	return d.files, d.types, d.err
}

// message returns the descriptor of the protobuf message named name in
// d's files.
func (d *described) message(name string) (protoreflect.MessageDescriptor, *dynamicpb.Types, error) {
	files, types, err := d.protoFiles()
	if err != nil {
		return nil, nil, err
	}
	desc, err := files.FindDescriptorByName(protoreflect.FullName(name))
	if err != nil {
		return nil, nil, fmt.Errorf("message %s is not in the descriptors of %s: %w", name, d.svc.Name, err)
	}
	md, ok := desc.(protoreflect.MessageDescriptor)
	if !ok {
		return nil, nil, fmt.Errorf("%s in the descriptors of %s is not a message", name, d.svc.Name)
	}
	return md, types, nil
}

// InvokeJSON calls service.method with req, a JSON request, and returns
// the reply as JSON. It needs no stub: it learns the method from Describe
// (so the server must serve reflection; see ErrNoReflection).
//
// A protobuf method's request is converted with protojson (field names as
// in the .proto or in lowerCamelCase) through the reflected descriptors
// and sent with the protobuf codec. Its reply comes back in protojson's
// form, with lowerCamelCase names and unset fields left out. A JSON-codec
// method's request goes as it is, compacted, and its reply comes back as
// the server wrote it. A method whose types the server does not record is
// called as a JSON-codec method.
//
// The call is a stub's call: the method's directives from Describe
// (idempotent, timeout) apply first, then opts, then the client's
// configuration and the context's options, as with Invoke. It has the
// same budget, retries, balancing, breakers and middlewares. The
// Describe, when not kept from before, is a call of its own before it,
// with its own budget. It carries the attachments among opts (Attachment;
// not IdempotencyKey), so a server that requires credentials answers it.
//
// A method the service does not have fails before sending, with status 60
// (matching ErrNotFound and ErrNotSent). So does a request that is not
// valid JSON, or that does not fit the method's request message, with
// status 90 (ErrBadRequest, ErrNotSent).
func (c *Client) InvokeJSON(ctx context.Context, service, method string, req []byte, opts ...CallOption) ([]byte, error) {
	if !json.Valid(req) {
		return nil, protocol.NotSent(protocol.StatusClientError,
			"encode "+service+"."+method+" request: not valid JSON", jsonSyntaxError(req))
	}
	d, err := c.describe(ctx, service, attachmentsOf(opts)...)
	if err != nil {
		return nil, err
	}
	i := slices.IndexFunc(d.svc.Methods, func(m reflection.Method) bool { return m.Name == method })
	if i < 0 {
		names := make([]string, len(d.svc.Methods))
		for j, m := range d.svc.Methods {
			names[j] = m.Name
		}
		e := protocol.NotSent(protocol.StatusServiceNotFound,
			"method "+service+"."+method+" not found; "+service+" has "+strings.Join(names, ", "), nil)
		e.Code = protocol.CodeUnimplemented
		return nil, e
	}
	m := d.svc.Methods[i]
	all := make([]CallOption, 0, 4+len(opts))
	if m.Idempotent {
		all = append(all, Idempotent())
	}
	if m.Timeout != "" {
		if t, err := time.ParseDuration(m.Timeout); err == nil {
			all = append(all, Timeout(t))
		}
	}
	if m.Request.Proto != "" && m.Response.Proto != "" {
		return c.invokeProtoJSON(ctx, d, service, m, req, append(all, opts...))
	}
	all = append(all, codecOption{jsonCodec}, payloadOption(compactJSON(req)))
	var reply json.RawMessage
	if err := c.Invoke(ctx, service, method, nil, &reply, append(all, opts...)...); err != nil {
		return nil, err
	}
	return reply, nil
}

// attachmentsOf returns the attachments among opts but the idempotency
// key: those a Describe made for the call carries too, credentials among
// them.
func attachmentsOf(opts []CallOption) []CallOption {
	var out []CallOption
	for _, o := range opts {
		if a, ok := o.(attachmentOption); ok && a.key != protocol.AttachIdempotencyKey {
			out = append(out, a)
		}
	}
	return out
}

// invokeProtoJSON makes InvokeJSON's call of a protobuf method m.
func (c *Client) invokeProtoJSON(ctx context.Context, d *described, service string, m reflection.Method, req []byte, opts []CallOption) ([]byte, error) {
	reqMD, types, err := d.message(m.Request.Proto)
	if err == nil {
		var respMD protoreflect.MessageDescriptor
		if respMD, _, err = d.message(m.Response.Proto); err == nil {
			in, out := dynamicpb.NewMessage(reqMD), dynamicpb.NewMessage(respMD)
			if err := (protojson.UnmarshalOptions{Resolver: types}).Unmarshal(req, in); err != nil {
				return nil, protocol.NotSent(protocol.StatusClientError,
					"encode "+service+"."+m.Name+" request as "+m.Request.Proto, err)
			}
			opts = append([]CallOption{codecOption{protoCodec}}, opts...)
			if err := c.Invoke(ctx, service, m.Name, in, out, opts...); err != nil {
				return nil, err
			}
			b, err := (protojson.MarshalOptions{Resolver: types}).Marshal(out)
			if err != nil {
				return nil, &protocol.Error{Status: protocol.StatusBadResponse,
					Msg: "write " + service + "." + m.Name + " reply as JSON", Err: err}
			}
			return compactJSON(b), nil
		}
	}
	return nil, protocol.NotSent(protocol.StatusClientError, "describe "+service+"."+m.Name, err)
}

// compactJSON returns valid JSON b without insignificant space, in a new
// slice. protojson varies its spacing on purpose; a caller comparing
// replies gets one form.
func compactJSON(b []byte) []byte {
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		return slices.Clone(b)
	}
	return out.Bytes()
}

// jsonSyntaxError returns encoding/json's account of what is wrong with b.
func jsonSyntaxError(b []byte) error {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	return errors.New("not one JSON value")
}
