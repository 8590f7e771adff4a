// The body format and codec of serialization id 2: Dubbo 2 bodies in
// hessian2 mapped to dabb's messages, registered in init.

package dubbo

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/dabbrpc/dabb/codec"
	"github.com/dabbrpc/dabb/protocol"
)

// Hessian2ID is the serialization id of hessian2 in Dubbo's header.
const Hessian2ID byte = 2

// Attachment keys the format sets on a request from the body's fields, as
// Java's DecodeableRpcInvocation does; an entry of the body's attachments
// map with the same key wins.
const (
	// AttachDubboVersion holds the request's Dubbo protocol version.
	AttachDubboVersion = "dubbo"
	// AttachPath holds the service path, the Java interface.
	AttachPath = "path"
	// AttachVersion holds the service version; absent for none.
	AttachVersion = "version"
	// AttachGroup is where a consumer puts the service group.
	AttachGroup = "group"
	// AttachInterface is where a consumer puts the Java interface.
	AttachInterface = "interface"
)

func init() {
	protocol.RegisterBodyFormat(Format{})
	codec.Register(Codec{})
}

// Args is the payload of a request in hessian2: its parameter-types
// descriptor and its arguments, one per type. A handler decodes a request
// into an *Args.
type Args struct {
	// Types is the JVM descriptor, such as "JI"; empty for none.
	Types string
	// Values are the arguments as hessian2 decodes them (int32 for int,
	// int64 for long, a pointer to a registered POJO's struct).
	Values []any
}

// Codec is the codec of serialization id 2, named "hessian2". Marshal
// takes an *Args (a request's payload), a *Response (a result, as
// AppendResponse writes it) or any other value (a result whose value it
// is). Unmarshal fills an *Args or a *Response from such bytes.
type Codec struct{}

// ID returns 2.
func (Codec) ID() byte { return Hessian2ID }

// Name returns "hessian2".
func (Codec) Name() string { return "hessian2" }

// Marshal appends v's hessian2 payload to dst.
func (Codec) Marshal(dst []byte, v any) ([]byte, error) {
	switch v := v.(type) {
	case *Args:
		desc := v.Types
		if desc == "" && len(v.Values) > 0 {
			var err error
			if desc, err = DescOf(v.Values...); err != nil {
				return dst, err
			}
		}
		types, err := ParseDesc(desc)
		if err != nil {
			return dst, err
		}
		if len(types) != len(v.Values) {
			return dst, fmt.Errorf("%w: descriptor %q names %d parameters for %d arguments", ErrDescriptor, desc, len(types), len(v.Values))
		}
		vals := append([]any{desc}, v.Values...)
		return appendValues(dst, vals, nil)
	case *Response:
		return AppendResponse(dst, v)
	}
	return AppendResponse(dst, &Response{Value: v})
}

// Unmarshal decodes data into v, an *Args or a *Response.
func (Codec) Unmarshal(data []byte, v any) error {
	switch v := v.(type) {
	case *Args:
		return decodeArgs(data, v)
	case *Response:
		r, err := DecodeResponse(data, Limits{})
		if err != nil {
			return err
		}
		*v = *r
		return nil
	}
	return fmt.Errorf("dubbo: hessian2 payloads decode into *dubbo.Args or *dubbo.Response, not %T", v)
}

// decodeArgs decodes a descriptor and the arguments it names; nothing
// may follow them.
func decodeArgs(data []byte, a *Args) error {
	s := &scanner{buf: data, maxDepth: Limits{}.depth(), allow: requestClass}
	head, err := s.values(1, "parameter types")
	if err != nil {
		return err
	}
	desc, ok := head[0].(string)
	if !ok && head[0] != nil {
		return fmt.Errorf("%w: the parameter types are a %T, not a string", ErrMalformed, head[0])
	}
	types, err := ParseDesc(desc)
	if err != nil {
		return err
	}
	start := s.off
	for i := range types {
		if s.off == len(data) {
			return fmt.Errorf("%w: descriptor %q names %d parameters; the payload holds %d arguments", ErrDescriptor, desc, len(types), i)
		}
		if err := s.value(0); err != nil {
			return err
		}
	}
	if s.off != len(data) {
		return fmt.Errorf("%w: descriptor %q names %d parameters; more values follow them", ErrDescriptor, desc, len(types))
	}
	vals, err := decodeValues(data[start:], len(types))
	if err != nil {
		return err
	}
	for i, t := range types {
		if !checkArg(t, vals[i]) {
			return fmt.Errorf("%w: argument %d is a %T, not a %s", ErrDescriptor, i, vals[i], t)
		}
	}
	a.Types, a.Values = desc, vals
	return nil
}

// Format is the body format of serialization id 2, named
// "dubbo-hessian2": Dubbo 2 request and response bodies.
//
// A request's Service is the body's path, its Method the method name, and
// its Payload the descriptor and the arguments, an [Args] for the codec.
// Its attachments are the body's map, with string values (integers and
// booleans in decimal and "true"/"false"; other values are left out),
// beside AttachDubboVersion, AttachPath and AttachVersion from the body's
// fields. A "timeout" attachment becomes the call's budget; "0" and ""
// are no budget (the server's default applies), as dubbo-go sends them.
//
// A response of status 20 is its Payload, a result body as the codec
// writes it. A response of another status is written as Java's provider
// answers:
//   - a handler's error whose text is a Java exception's, "Class: message"
//     with a package-qualified class, becomes status 20 with that
//     exception (Service's handlers give every error such a text);
//   - status 70 otherwise (a panic, an interceptor's error) becomes status
//     20 with a java.lang.RuntimeException;
//   - the server's own 60 (no such service or method) becomes 70 with
//     Java's text;
//   - any other status keeps its code, with the text as one string.
type Format struct{}

var _ protocol.BodyFormat = Format{}

// ID returns 2.
func (Format) ID() byte { return Hessian2ID }

// Name returns "dubbo-hessian2".
func (Format) Name() string { return "dubbo-hessian2" }

// DecodeBody fills m from a request or response body.
func (Format) DecodeBody(m *protocol.Message, body []byte) error {
	if !m.Header.Flags().IsRequest() {
		return decodeResponseBody(m, body)
	}
	s := &scanner{buf: body, maxDepth: Limits{}.depth(), allow: requestClass}
	head, err := s.values(4, "request header")
	if err != nil {
		return err
	}
	var fields [4]string
	for i, v := range head {
		switch v := v.(type) {
		case string:
			fields[i] = v
		case nil:
		default:
			return fmt.Errorf("%w: request field %d is a %T, not a string", ErrMalformed, i+1, v)
		}
	}
	start := s.off
	desc, err := s.values(1, "request header")
	if err != nil {
		return err
	}
	d, ok := desc[0].(string)
	if !ok && desc[0] != nil {
		return fmt.Errorf("%w: request field 5 is a %T, not a string", ErrMalformed, desc[0])
	}
	types, err := ParseDesc(d)
	if err != nil {
		return err
	}
	for i := range types {
		if s.off == len(body) {
			return fmt.Errorf("%w: descriptor %q names %d parameters; the body holds %d values after it, not %d with the attachments",
				ErrDescriptor, d, len(types), i, len(types)+1)
		}
		if err := s.value(0); err != nil {
			return err
		}
	}
	end := s.off
	if end == len(body) {
		return fmt.Errorf("%w: descriptor %q names %d parameters; no attachments map follows them", ErrDescriptor, d, len(types))
	}
	tail, err := s.values(1, "attachments")
	if err != nil {
		return err
	}
	att, err := stringMap(tail[0])
	if err != nil {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if len(att) > protocol.MaxAttachments {
		return fmt.Errorf("%w: %d attachments, limit %d", protocol.ErrTooManyAttachments, len(att), protocol.MaxAttachments)
	}
	m.Service, m.Method, m.Payload = fields[1], fields[3], body[start:end]
	m.Attachments = make(map[string]string, len(att)+3)
	m.Attachments[AttachDubboVersion] = fields[0]
	m.Attachments[AttachPath] = fields[1]
	if fields[2] != "" {
		m.Attachments[AttachVersion] = fields[2]
	}
	for k, v := range att {
		s, ok := attachmentString(v)
		// dubbo-go v3.3.1 sends "timeout" "0" on its failover retries,
		// and "" from a call without a timeout: neither is a spent
		// budget, so the call runs under the server's default.
		if !ok || k == protocol.AttachTimeout && strings.TrimLeft(s, "0") == "" {
			continue
		}
		m.Attachments[k] = s
	}
	return nil
}

// attachmentString is an attachment's value as text, when it has one.
func attachmentString(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case int32:
		return strconv.FormatInt(int64(v), 10), true
	case int64:
		return strconv.FormatInt(v, 10), true
	case bool:
		return strconv.FormatBool(v), true
	}
	return "", false
}

// decodeResponseBody fills m from a response body: the result body as the
// payload for status 20, else the error message as text.
func decodeResponseBody(m *protocol.Message, body []byte) error {
	if m.Header.Status() != protocol.StatusOK {
		msg, err := DecodeErrorMessage(body, Limits{})
		if err != nil {
			return err
		}
		m.Payload = append(body[:0], msg...)
		notFound(m)
		return nil
	}
	exc, err := responseException(body, Limits{})
	if err != nil {
		return err
	}
	if exc != nil {
		m.Header.SetStatus(protocol.StatusServiceError)
		m.Payload = append(body[:0], exc.Error()...)
		notFound(m)
		return nil
	}
	m.Payload = body
	return nil
}

// notFound gives a response of status 70 that says the provider has no
// such service or method status 60, which dabb's callers match with
// protocol.ErrNotFound. Dubbo has no status of its own for either: Java
// answers 70 with "Not found exported service: ..." or an exception
// naming the missing method, dubbo-go 70 with "... method is not found".
func notFound(m *protocol.Message) {
	if m.Header.Status() != protocol.StatusServiceError {
		return
	}
	if msg := string(m.Payload); strings.Contains(msg, "Not found exported service") || noSuchMethod(msg) {
		m.Header.SetStatus(protocol.StatusServiceNotFound)
	}
}

// AppendBody appends m's body: a request's fields, or a response's result
// or error as the type's doc says.
func (Format) AppendBody(h *protocol.Header, dst []byte, m *protocol.Message) []byte {
	if h.Flags().IsRequest() {
		return appendRequestBody(dst, m)
	}
	status := h.Status()
	if status == protocol.StatusOK {
		if len(m.Payload) == 0 {
			out, _ := AppendResponse(dst, &Response{})
			return out
		}
		return append(dst, m.Payload...)
	}
	text := string(m.Payload)
	exc := parseException(text)
	switch {
	case exc == nil && status == protocol.StatusServiceError:
		exc = &Exception{Class: RuntimeException, Message: text}
	case exc == nil && status == protocol.StatusServiceNotFound && m.Attachments[protocol.AttachErrorCode] == protocol.CodeUnimplemented:
		h.SetStatus(protocol.StatusServiceError)
		return AppendErrorMessage(dst, notFoundText(text))
	}
	if exc == nil {
		return AppendErrorMessage(dst, text)
	}
	out, err := AppendResponse(dst, &Response{Exception: exc})
	if err != nil {
		// Only a class name that is no Java name fails, and parseException
		// lets none through; the text still reaches the consumer.
		return AppendErrorMessage(dst, text)
	}
	h.SetStatus(protocol.StatusOK)
	return out
}

// appendRequestBody writes a request: its fields, its payload (an Args as
// the codec writes it) and its attachments.
func appendRequestBody(dst []byte, m *protocol.Message) []byte {
	version := m.Attachments[AttachDubboVersion]
	if version == "" {
		version = DubboVersion
	}
	att := map[string]any{AttachPath: m.Service, AttachInterface: m.Service}
	for k, v := range m.WireAttachments() {
		if k != AttachDubboVersion {
			att[k] = v
		}
	}
	out, err := appendValues(dst, []any{version, m.Service, m.Attachments[AttachVersion], m.Method}, nil)
	if err != nil { // strings always encode
		panic(err)
	}
	if len(m.Payload) == 0 {
		out, _ = appendValues(out, []any{""}, nil)
	}
	out = append(out, m.Payload...)
	out, err = appendValues(out, []any{att}, nil)
	if err != nil { // a map of strings always encodes
		panic(err)
	}
	return out
}

// parseException reads a Java exception from text in Throwable.toString's
// form, "Class: message" or "Class", with a package-qualified class. A
// GenericException's message is read as the exception it wraps. It
// returns nil for any other text.
func parseException(text string) *Exception {
	class, msg, _ := strings.Cut(text, ": ")
	if !strings.Contains(class, ".") || !isClassName(class) {
		return nil
	}
	if class == GenericException {
		if inner := parseException(msg); inner != nil {
			return NewGenericException(inner.Class, inner.Message)
		}
		return NewGenericException(RuntimeException, msg)
	}
	return &Exception{Class: class, Message: msg}
}

// notFoundText turns the server's own "service S not found" and "method
// S.M not found" into Java's words for them.
func notFoundText(text string) string {
	rest, ok := strings.CutSuffix(text, " not found")
	if !ok {
		return text
	}
	if svc, ok := strings.CutPrefix(rest, "service "); ok {
		return "Not found exported service: " + svc
	}
	if full, ok := strings.CutPrefix(rest, "method "); ok {
		if i := strings.LastIndexByte(full, '.'); i > 0 {
			return "No such method " + full[i+1:] + " in service " + full[:i]
		}
	}
	return text
}
