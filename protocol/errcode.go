// Error codes and details: the documented codes, NewError, and their place in a response's attachments.

package protocol

import (
	"errors"
	"strconv"
	"strings"
)

// Codes of the documented set. An application may use any other short
// snake_case string. A code never makes a call retryable that was not.
const (
	CodeUnauthenticated    = "unauthenticated"     // the caller's credentials are missing or wrong
	CodePermissionDenied   = "permission_denied"   // the caller is known and not allowed
	CodeNotFound           = "not_found"           // an entity the call names does not exist
	CodeAlreadyExists      = "already_exists"      // an entity the call creates exists already
	CodeFailedPrecondition = "failed_precondition" // the system is not in a state the call needs
	CodeResourceExhausted  = "resource_exhausted"  // a quota or limit of the caller's is spent
	CodeInvalidArgument    = "invalid_argument"    // an argument is wrong whatever the state
	// CodeUnimplemented is the code of a dabb server's own 60: it has no
	// such service or method. A handler's 60 carries the handler's code
	// (CodeNotFound, say) or none, so the two are told apart.
	CodeUnimplemented = "unimplemented"
)

// Sentinels matched by errors.Is against an [*Error] of the code listed
// with each, whatever its status. Such an error matches no sentinel of a
// status (ErrBadRequest among them): a refusal is a class of its own.
// dabb's client never retries them, and they never count against a
// circuit breaker.
var (
	// ErrUnauthenticated: the server refused the caller's credentials
	// (CodeUnauthenticated).
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrPermissionDenied: the server knows the caller and does not
	// allow the call (CodePermissionDenied).
	ErrPermissionDenied = errors.New("permission denied")
)

// Attachment keys of an error response. A response whose status is not OK
// carries its code under AttachErrorCode. Detail i, counted from 0,
// travels under AttachErrorDetail followed by i in decimal:
// "error-detail-0", "error-detail-1", and so on. A peer that does not know
// them still reads the status byte and the message in the payload.
const (
	AttachErrorCode   = "error-code"
	AttachErrorDetail = "error-detail-"
)

// MaxErrorDetails is the most details one error response carries.
// [Message.SetError] sends the first MaxErrorDetails and drops the rest. A
// reader stops at the first missing index or at this bound. Their bytes
// share the body limit with the message: a dabb server answers 50 for a
// response over its MaxBody.
const MaxErrorDetails = 64

// NewError returns a local error of status s with an application code,
// a message and details, as a handler returns it:
//
//	return nil, protocol.NewError(protocol.StatusServiceNotFound, "payment_not_found",
//		"no payment "+id, "payment_id="+id)
//
// The caller gets all four back through errors.As on a remote [*Error].
// An empty code means none. The details are used as given, not copied.
func NewError(s Status, code, msg string, details ...string) *Error {
	return &Error{Status: s, Code: code, Msg: msg, Details: details}
}

// SetError makes m the error response of e. The status byte is e.Status,
// the payload e.Msg as text. e.Code and e.Details become attachments:
// AttachErrorCode and AttachErrorDetail followed by the index. It sends at
// most MaxErrorDetails details. Error keys m.Attachments held already are
// replaced; other attachments stay. m.Payload is reused.
func (m *Message) SetError(e *Error) {
	m.Header.SetStatus(e.Status)
	m.Payload = append(m.Payload[:0], e.Msg...)
	for k := range m.Attachments {
		if k == AttachErrorCode || strings.HasPrefix(k, AttachErrorDetail) {
			delete(m.Attachments, k)
		}
	}
	details := e.Details[:min(len(e.Details), MaxErrorDetails)]
	if e.Code == "" && len(details) == 0 {
		return
	}
	if m.Attachments == nil {
		m.Attachments = make(map[string]string, 1+len(details))
	}
	if e.Code != "" {
		m.Attachments[AttachErrorCode] = e.Code
	}
	for i, d := range details {
		m.Attachments[detailKey(i)] = d
	}
}

// detailKey is the attachment key of detail i.
func detailKey(i int) string { return AttachErrorDetail + strconv.Itoa(i) }

// readErrorAttachments fills e's code and details from the attachments of
// the response it was read from.
func readErrorAttachments(e *Error, att map[string]string) {
	if len(att) == 0 {
		return
	}
	e.Code = att[AttachErrorCode]
	for i := range MaxErrorDetails {
		d, ok := att[detailKey(i)]
		if !ok {
			break
		}
		e.Details = append(e.Details, d)
	}
}
