// Exception: a Java exception in hessian2 bodies, as its class name and
// message.

package dubbo

import (
	"fmt"
	"reflect"
	"strings"

	hessian "github.com/apache/dubbo-go-hessian2"
	"github.com/apache/dubbo-go-hessian2/java_exception"
)

// Java exception classes that every Java consumer can load.
const (
	// RuntimeException is java.lang.RuntimeException.
	RuntimeException = "java.lang.RuntimeException"
	// IllegalArgumentException is java.lang.IllegalArgumentException.
	IllegalArgumentException = "java.lang.IllegalArgumentException"
	// GenericException is Dubbo's org.apache.dubbo.rpc.service.GenericException,
	// which a generic call ($invoke) throws around the provider's exception.
	GenericException = "org.apache.dubbo.rpc.service.GenericException"
)

// Exception is a Java exception: its class and detail message. For
// GenericException, WrappedClass and WrappedMessage are its
// exceptionClass and exceptionMessage fields, the exception it wraps.
type Exception struct {
	Class          string
	Message        string
	WrappedClass   string
	WrappedMessage string
}

// Error returns "Class: Message", as Java's Throwable.toString does.
func (e *Exception) Error() string {
	if e.Message == "" {
		return e.Class
	}
	return e.Class + ": " + e.Message
}

// NewGenericException wraps the exception of class and message as Java
// Dubbo 3.3's GenericFilter does for a generic call: the detail message
// is "class: message" and the wrapped fields hold the two parts.
func NewGenericException(class, message string) *Exception {
	inner := Exception{Class: class, Message: message}
	return &Exception{Class: GenericException, Message: inner.Error(), WrappedClass: class, WrappedMessage: message}
}

// genericException is GenericException's hessian2 form; registered, so
// that its field order is fixed and decoding keeps the wrapped fields.
type genericException struct {
	DetailMessage        string
	StackTrace           []java_exception.StackTraceElement
	SuppressedExceptions []java_exception.Throwabler
	Cause                java_exception.Throwabler
	ExceptionClass       string
	ExceptionMessage     string
}

func (genericException) JavaClassName() string { return GenericException }
func (e genericException) Error() string       { return e.DetailMessage }
func (e genericException) GetStackTrace() []java_exception.StackTraceElement {
	return e.StackTrace
}

func init() {
	hessian.RegisterPOJO(&genericException{})
}

// encodeException writes e as a Java Throwable: its class with the
// fields detailMessage, stackTrace (empty), suppressedExceptions and
// cause (null), as Caucho Hessian reads them into the JDK's Throwable.
func encodeException(enc *hessian.Encoder, e *Exception) error {
	if e.Class == GenericException {
		return enc.Encode(&genericException{
			DetailMessage: e.Message, StackTrace: []java_exception.StackTraceElement{},
			ExceptionClass: e.WrappedClass, ExceptionMessage: e.WrappedMessage,
		})
	}
	if !isClassName(e.Class) {
		return fmt.Errorf("dubbo: exception class %q is not a Java class name", e.Class)
	}
	// A class the hessian2 library knows (the JDK's common exceptions)
	// keeps its registered field order; another's follows the map's.
	return enc.EncodeMapAsClass(e.Class, map[string]any{
		"detailMessage":        e.Message,
		"stackTrace":           []java_exception.StackTraceElement{},
		"suppressedExceptions": nil,
		"cause":                nil,
	})
}

// isClassName says whether name can be a Java class's binary name.
func isClassName(name string) bool {
	_, err := MakeDesc(name)
	return err == nil && name != "" && letters[name] == 0 && !strings.HasSuffix(name, "[]")
}

// throwableFields are the fields every Java Throwable has; a class
// definition with all four is an exception.
var throwableFields = []string{"detailMessage", "stackTrace", "suppressedExceptions", "cause"}

// isThrowable says whether a class definition's fields are a Throwable's.
func isThrowable(fields []string) bool {
	n := 0
	for _, f := range fields {
		for _, t := range throwableFields {
			if f == t {
				n++
			}
		}
	}
	return n == len(throwableFields)
}

// toException converts a decoded Java Throwable.
func toException(v any) (*Exception, bool) {
	switch t := v.(type) {
	case *genericException:
		return &Exception{Class: GenericException, Message: t.DetailMessage, WrappedClass: t.ExceptionClass, WrappedMessage: t.ExceptionMessage}, true
	case *java_exception.DubboGenericException:
		return &Exception{Class: t.JavaClassName(), Message: t.ExceptionClass + ": " + t.ExceptionMessage, WrappedClass: t.ExceptionClass, WrappedMessage: t.ExceptionMessage}, true
	case java_exception.Throwabler:
		rv := reflect.ValueOf(t)
		if rv.Kind() == reflect.Pointer {
			if rv.IsNil() {
				return nil, false
			}
			rv = rv.Elem()
		}
		msg := t.Error()
		if f := rv.FieldByName("DetailMessage"); f.IsValid() && f.Kind() == reflect.String {
			msg = f.String()
		}
		return &Exception{Class: t.JavaClassName(), Message: msg}, true
	}
	return nil, false
}
