// Dubbo 2 request and response bodies in hessian2, both directions, in the
// field order of Java Dubbo's DubboCodec.

package dubbo

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	hessian "github.com/apache/dubbo-go-hessian2"
)

// Errors of decoding, for errors.Is; ErrDescriptor is in javatype.go.
var (
	// ErrMalformed reports a body that is not the hessian2 values a Dubbo
	// body holds.
	ErrMalformed = errors.New("dubbo: malformed hessian2 body")
	// ErrTooLarge reports a value past the decoding limits: a list or
	// string longer than the rest of the body could hold, or nesting
	// deeper than Limits.MaxDepth.
	ErrTooLarge = errors.New("dubbo: hessian2 body past its limits")
	// ErrUnknownClass reports an object of a Java class that is not
	// registered with RegisterPOJO.
	ErrUnknownClass = errors.New("dubbo: unknown Java class")
)

// DubboVersion is the Dubbo protocol version dabb writes in requests and
// response attachments, as Java Dubbo 2.7 and 3.x and dubbo-go do.
const DubboVersion = "2.0.2"

// SupportsResponseAttachments says whether a consumer whose request
// carries the protocol version v reads responses with attachments, as
// Java's Version.isSupportResponseAttachment decides: from 2.0.2 up to
// 2.0.99. A response to such a request sets Response.Attachments, with
// "dubbo" set to DubboVersion.
func SupportsResponseAttachments(v string) bool {
	parts := strings.Split(v, ".")
	if v == "" || len(parts) > 4 {
		return false
	}
	n := 0
	for _, p := range parts {
		// Java reads each part's leading digits: "2-SNAPSHOT" is 2.
		digits := 0
		for digits < len(p) && p[digits] >= '0' && p[digits] <= '9' {
			digits++
		}
		d, err := strconv.Atoi(p[:digits])
		if err != nil || d > 99 {
			return false
		}
		n = n*100 + d
	}
	if len(parts) == 3 {
		n *= 100
	}
	return n >= 2000200 && n <= 2009900
}

// Result flags, the int that starts a response body (Java's DubboCodec).
const (
	ResponseWithException                byte = 0
	ResponseValue                        byte = 1
	ResponseNullValue                    byte = 2
	ResponseWithExceptionWithAttachments byte = 3
	ResponseValueWithAttachments         byte = 4
	ResponseNullValueWithAttachments     byte = 5
)

// Limits bound what decoding accepts. The body's own size is the frame's,
// bounded by the transport.
type Limits struct {
	// MaxDepth is how deeply lists, maps and objects may nest; 0 means
	// 64, the range is 1 to 10000.
	MaxDepth int
}

func (l Limits) depth() int {
	switch {
	case l.MaxDepth <= 0:
		return 64
	case l.MaxDepth > 10000:
		return 10000
	}
	return l.MaxDepth
}

// Request is the body of a Dubbo 2 request: an invocation.
type Request struct {
	// DubboVersion is the protocol version; AppendRequest writes
	// DubboVersion ("2.0.2") when it is empty.
	DubboVersion string
	// Path is the service's Java interface name.
	Path string
	// Version is the service version, empty for none.
	Version string
	// Method is the Java method name, "$invoke" for a generic call.
	Method string
	// ParamTypes is the JVM descriptor of the parameter types, such as
	// "JI"; AppendRequest derives it from Args with DescOf when empty.
	ParamTypes string
	// Args are the arguments, one per parameter type.
	Args []any
	// Attachments are the invocation's attachments: path, interface,
	// version, group, timeout and the application's own.
	Attachments map[string]any
}

// Response is the body of a Dubbo 2 response of status 20 (OK).
type Response struct {
	// Value is the method's result; nil is Java's null.
	Value any
	// Exception, when not nil, is what the method threw; Value is then
	// ignored.
	Exception *Exception
	// Attachments, when not nil (even empty), are written after the
	// result with the *WithAttachments flags; a consumer of protocol
	// version 2.0.2 and later expects them, with "dubbo" set to the
	// version.
	Attachments map[string]any
}

// AppendRequest appends r's hessian2 body to dst.
func AppendRequest(dst []byte, r *Request) (out []byte, err error) {
	desc := r.ParamTypes
	if desc == "" && len(r.Args) > 0 {
		if desc, err = DescOf(r.Args...); err != nil {
			return dst, err
		}
	}
	types, err := ParseDesc(desc)
	if err != nil {
		return dst, err
	}
	if len(types) != len(r.Args) {
		return dst, fmt.Errorf("%w: descriptor %q names %d parameters for %d arguments", ErrDescriptor, desc, len(types), len(r.Args))
	}
	version := r.DubboVersion
	if version == "" {
		version = DubboVersion
	}
	vals := make([]any, 0, 6+len(r.Args))
	vals = append(vals, version, r.Path, r.Version, r.Method, desc)
	vals = append(vals, r.Args...)
	vals = append(vals, attachments(r.Attachments))
	return appendValues(dst, vals, nil)
}

// attachments returns m, or an empty map for nil: Java reads a map.
func attachments(m map[string]any) map[string]any {
	if m == nil {
		return map[string]any{}
	}
	return m
}

// AppendResponse appends r's hessian2 body to dst.
func AppendResponse(dst []byte, r *Response) ([]byte, error) {
	var flag byte
	var vals []any
	var exc *Exception
	switch {
	case r.Exception != nil:
		flag, exc = ResponseWithException, r.Exception
	case r.Value == nil:
		flag = ResponseNullValue
	default:
		flag, vals = ResponseValue, []any{r.Value}
	}
	if r.Attachments != nil {
		flag += 3 // each flag's *WithAttachments variant
	}
	vals = append([]any{int32(flag)}, vals...)
	if r.Attachments != nil {
		vals = append(vals, r.Attachments)
	}
	return appendValues(dst, vals, exc)
}

// AppendErrorMessage appends the body of a response whose status is not
// 20: one hessian2 string.
func AppendErrorMessage(dst []byte, msg string) []byte {
	out, err := appendValues(dst, []any{msg}, nil)
	if err != nil { // a string always encodes
		panic(err)
	}
	return out
}

// appendValues encodes vals in order; exc, when set, is written after the
// first value (the result flag).
func appendValues(dst []byte, vals []any, exc *Exception) (out []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			out, err = dst, fmt.Errorf("dubbo: the hessian2 encoder panicked: %v", p)
		}
	}()
	enc := hessian.NewEncoder()
	for i, v := range vals {
		if err := enc.Encode(v); err != nil {
			return dst, fmt.Errorf("dubbo: encode %T: %w", v, err)
		}
		if i == 0 && exc != nil {
			if err := encodeException(enc, exc); err != nil {
				return dst, err
			}
		}
	}
	return append(dst, enc.Buffer()...), nil
}

// requestClass allows the classes a request may hold: registered POJOs.
func requestClass(name string, _ []string) bool {
	_, ok := pojoClasses.Load(name)
	return ok
}

// maxExceptionClasses bounds how many exception classes responses may
// name over the life of the process.
const maxExceptionClasses = 1024

// exceptionClasses are the exception classes responses named so far: the
// hessian2 library registers each one it does not know, for good, so a
// peer that invents names must not grow that registry without a bound.
var exceptionClasses = struct {
	sync.Mutex
	names map[string]bool
}{names: map[string]bool{}}

// responseClass allows what requestClass does, exceptions (up to
// maxExceptionClasses names) and their stack trace elements.
func responseClass(name string, fields []string) bool {
	if requestClass(name, fields) || name == "java.lang.StackTraceElement" {
		return true
	}
	if !isThrowable(fields) {
		return false
	}
	exceptionClasses.Lock()
	defer exceptionClasses.Unlock()
	if !exceptionClasses.names[name] {
		if len(exceptionClasses.names) >= maxExceptionClasses {
			return false
		}
		exceptionClasses.names[name] = true
	}
	return true
}

// DecodeRequest decodes a request body. Bytes after the attachments are
// ignored. Errors match ErrMalformed, ErrTooLarge, ErrUnknownClass or
// ErrDescriptor.
func DecodeRequest(body []byte, lim Limits) (*Request, error) {
	s := &scanner{buf: body, maxDepth: lim.depth(), allow: requestClass}
	head, err := s.values(5, "request header")
	if err != nil {
		return nil, err
	}
	fields := make([]string, 5)
	for i, v := range head {
		switch v := v.(type) {
		case string:
			fields[i] = v
		case nil:
		default:
			return nil, fmt.Errorf("%w: request field %d is a %T, not a string", ErrMalformed, i+1, v)
		}
	}
	r := &Request{DubboVersion: fields[0], Path: fields[1], Version: fields[2], Method: fields[3], ParamTypes: fields[4]}
	types, err := ParseDesc(r.ParamTypes)
	if err != nil {
		return nil, err
	}
	start := s.off
	for i := 0; i <= len(types); i++ {
		if s.off == len(body) {
			return nil, fmt.Errorf("%w: descriptor %q names %d parameters; the body holds %d values after it, not %d with the attachments",
				ErrDescriptor, r.ParamTypes, len(types), i, len(types)+1)
		}
		if err := s.value(0); err != nil {
			return nil, err
		}
	}
	vals, err := decodeValues(body[start:s.off], len(types)+1)
	if err != nil {
		return nil, err
	}
	r.Args = vals[:len(types)]
	r.Attachments, err = stringMap(vals[len(types)])
	if err != nil {
		return nil, fmt.Errorf("%w: descriptor %q names %d parameters, and the value after them is no attachments map: %w",
			ErrDescriptor, r.ParamTypes, len(types), err)
	}
	for i, t := range types {
		if !checkArg(t, r.Args[i]) {
			return nil, fmt.Errorf("%w: argument %d is a %T, not a %s", ErrDescriptor, i, r.Args[i], t)
		}
	}
	return r, nil
}

// DecodeResponse decodes the body of a response of status 20. Bytes after
// its last field are ignored. Errors match ErrMalformed, ErrTooLarge or
// ErrUnknownClass.
func DecodeResponse(body []byte, lim Limits) (*Response, error) {
	s, flag, n, err := scanResponse(body, lim)
	if err != nil {
		return nil, err
	}
	return s.decodeResponse(flag, n)
}

// responseException checks the body of a response of status 20 as
// DecodeResponse does, and decodes only an exception; nil means a value or
// null. The transport's read loop asks this; the codec decodes the value
// once, into the caller's type.
func responseException(body []byte, lim Limits) (*Exception, error) {
	s, flag, n, err := scanResponse(body, lim)
	if err != nil || flag%3 != ResponseWithException {
		return nil, err
	}
	r, err := s.decodeResponse(flag, n)
	if err != nil {
		return nil, err
	}
	return r.Exception, nil
}

// scanResponse reads a response's result flag and checks the n values
// that follow it; s is left at their end, its start at their start.
func scanResponse(body []byte, lim Limits) (s *scanner, flag byte, n int, err error) {
	s = &scanner{buf: body, maxDepth: lim.depth(), allow: responseClass}
	head, err := s.values(1, "result flag")
	if err != nil {
		return nil, 0, 0, err
	}
	f, ok := head[0].(int32)
	if !ok || f < 0 || f > 5 {
		return nil, 0, 0, fmt.Errorf("%w: result flag %v is none of 0 to 5", ErrMalformed, head[0])
	}
	flag = byte(f)
	if flag%3 != ResponseNullValue {
		n++
	}
	if flag >= ResponseWithExceptionWithAttachments {
		n++
	}
	s.start = s.off
	s.first = -1
	for i := range n {
		if s.off == len(body) {
			return nil, 0, 0, fmt.Errorf("%w: result flag %d needs %d values after it; the body holds %d", ErrMalformed, flag, n, i)
		}
		if err := s.value(0); err != nil {
			return nil, 0, 0, err
		}
	}
	return s, flag, n, nil
}

// decodeResponse decodes the n values scanResponse checked.
func (s *scanner) decodeResponse(flag byte, n int) (*Response, error) {
	vals, err := decodeValues(s.buf[s.start:s.off], n)
	if err != nil {
		return nil, err
	}
	r := &Response{}
	switch flag % 3 {
	case ResponseWithException:
		exc, ok := toException(vals[0])
		if !ok {
			return nil, fmt.Errorf("%w: an exception result holds a %T, not a Java Throwable", ErrMalformed, vals[0])
		}
		// The library decodes every class it does not know into one Go
		// type that forgets the name; the wire has it.
		if s.first >= 0 {
			exc.Class = s.names[s.first]
		}
		if !isClassName(exc.Class) {
			return nil, fmt.Errorf("%w: exception class %q is not a Java class name", ErrMalformed, exc.Class)
		}
		r.Exception = exc
	case ResponseValue:
		r.Value = vals[0]
	}
	if flag >= ResponseWithExceptionWithAttachments {
		if r.Attachments, err = stringMap(vals[n-1]); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
		}
	}
	return r, nil
}

// DecodeErrorMessage decodes the body of a response whose status is not
// 20: one string (null reads as empty).
func DecodeErrorMessage(body []byte, lim Limits) (string, error) {
	s := &scanner{buf: body, maxDepth: lim.depth(), allow: requestClass}
	vals, err := s.values(1, "error message")
	if err != nil {
		return "", err
	}
	switch v := vals[0].(type) {
	case string:
		return v, nil
	case nil:
		return "", nil
	default:
		return "", fmt.Errorf("%w: an error message is a %T, not a string", ErrMalformed, v)
	}
}

// values scans and decodes the next n values.
func (s *scanner) values(n int, what string) ([]any, error) {
	start := s.off
	for i := range n {
		if s.off == len(s.buf) {
			return nil, fmt.Errorf("%w: the body ends after %d of the %d values of the %s", ErrMalformed, i, n, what)
		}
		if err := s.value(0); err != nil {
			return nil, err
		}
	}
	return decodeValues(s.buf[start:s.off], n)
}

// decodeValues decodes n values from seg, which the scan has checked.
// Class definitions and references do not cross from one segment into the
// next: the request header before the arguments holds only strings.
func decodeValues(seg []byte, n int) (vals []any, err error) {
	// The scan leaves little for the library to trip on, but a panic on
	// input it did not foresee must stay an error of this body.
	defer func() {
		if p := recover(); p != nil {
			vals, err = nil, fmt.Errorf("%w: the hessian2 decoder panicked: %v", ErrMalformed, p)
		}
	}()
	// The library's own constructor gives each decoder a 4 KiB read
	// buffer; the segment is in memory, so a buffer of its size does.
	d := hessian.NewDecoderSize(seg, min(max(len(seg), 16), 4096))
	d.Strict = true
	vals = make([]any, n)
	for i := range vals {
		if vals[i], err = d.Decode(); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
		}
	}
	return vals, nil
}

// stringMap converts a decoded attachments map; null is an empty map.
func stringMap(v any) (map[string]any, error) {
	out := map[string]any{}
	switch m := v.(type) {
	case nil:
	case map[any]any:
		for k, val := range m {
			ks, ok := k.(string)
			if !ok {
				return nil, fmt.Errorf("an attachment key is a %T, not a string", k)
			}
			out[ks] = val
		}
	case map[string]any:
		for k, val := range m {
			out[k] = val
		}
	default:
		return nil, fmt.Errorf("a %T where the attachments map belongs", v)
	}
	return out, nil
}
