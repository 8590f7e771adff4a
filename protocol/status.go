// Status codes and Error, the error type every layer of dabb creates and inspects.

package protocol

import (
	"context"
	"errors"
	"fmt"
	"strconv"
)

// Status is the fourth header byte of a response, with Apache Dubbo's codes.
// Requests carry 0.
//
// Who makes 30, 31 and 35 matters. Made by the client itself, 30 says the
// request was never sent, so the server did nothing. A local 31 says it
// was sent and the server may have acted. A local 35 may be either: no
// connection, or a connection lost after sending. errors.Is(err,
// ErrNotSent) tells them apart; it is the test to use before retrying a
// call that is not idempotent, whatever the status. A 31 received from a
// dabb server says the opposite of a local one: the budget was spent
// before the handler ran, so nothing was done. [Error.Remote] tells the
// two apart.
type Status byte

const (
	// StatusOK: the call succeeded.
	StatusOK Status = 20
	// StatusSerializationError: a payload could not be encoded or
	// decoded. Not retryable as is.
	StatusSerializationError Status = 25
	// StatusClientTimeout: the budget ran out before the request was
	// sent; the server never saw it. Safe to retry while budget remains.
	StatusClientTimeout Status = 30
	// StatusServerTimeout: made by the client, the budget ran out after
	// sending and the server may have acted. Received from a dabb server,
	// the budget was spent before the handler ran: nothing was done.
	StatusServerTimeout Status = 31
	// StatusChannelInactive: the connection was lost. Before sending, the
	// request never left; after, the server may have acted.
	StatusChannelInactive Status = 35
	// StatusBadRequest: the server could not understand the request
	// (unknown serialization id, undecodable payload). Do not retry.
	StatusBadRequest Status = 40
	// StatusBadResponse: the client could not understand the response.
	StatusBadResponse Status = 50
	// StatusServiceNotFound: no such service or method on the server
	// (code CodeUnimplemented), or a handler's "not found" (its own code).
	StatusServiceNotFound Status = 60
	// StatusServiceError: the handler returned an error or panicked. The
	// handler ran: only an idempotent method is safe to call again (dabb's
	// client does not retry it on its own).
	StatusServiceError Status = 70
	// StatusServerError: the server failed outside the handler. A dabb
	// server does not send it (a draining one answers 100); Dubbo peers
	// may.
	StatusServerError Status = 80
	// StatusClientError: the client failed on its own (bad argument,
	// closed client, call cancelled).
	StatusClientError Status = 90
	// StatusServerThreadpoolExhausted: the server was at its concurrency
	// limit and rejected the request without running it. Safe to retry
	// elsewhere.
	StatusServerThreadpoolExhausted Status = 100
)

// String returns the status's name, as Dubbo spells it in lower case.
func (s Status) String() string {
	switch s {
	case 0:
		return "none"
	case StatusOK:
		return "ok"
	case StatusSerializationError:
		return "serialization error"
	case StatusClientTimeout:
		return "client timeout"
	case StatusServerTimeout:
		return "server timeout"
	case StatusChannelInactive:
		return "channel inactive"
	case StatusBadRequest:
		return "bad request"
	case StatusBadResponse:
		return "bad response"
	case StatusServiceNotFound:
		return "service not found"
	case StatusServiceError:
		return "service error"
	case StatusServerError:
		return "server error"
	case StatusClientError:
		return "client error"
	case StatusServerThreadpoolExhausted:
		return "server threadpool exhausted"
	}
	return "status(" + strconv.Itoa(int(s)) + ")"
}

// Sentinels matched by errors.Is against any [*Error] of the statuses
// listed with each. They say what a caller may do next. A refusal by
// credentials (code CodeUnauthenticated or CodePermissionDenied) matches
// none of them, whatever its status: it matches ErrUnauthenticated or
// ErrPermissionDenied instead.
var (
	// ErrTimeout: the call's budget ran out (30, 31).
	ErrTimeout = errors.New("timeout")
	// ErrUnavailable: no connection or instance could take the call, or
	// the connection was lost (35, 80).
	ErrUnavailable = errors.New("unavailable")
	// ErrNotFound: the server has no such service or method (60). A
	// handler's own 60 matches too: its Code tells them apart, as the
	// server's own is CodeUnimplemented.
	ErrNotFound = errors.New("not found")
	// ErrOverloaded: the server rejected the call without running it
	// (100). Safe to retry on another instance.
	ErrOverloaded = errors.New("overloaded")
	// ErrBadRequest: the request could not be encoded or understood
	// (25, 40, 50, 90). Retrying will not help. A 90 that says the caller
	// gave up (ErrCanceled) is not one, nor a 40 that refuses the
	// caller's credentials (ErrUnauthenticated, ErrPermissionDenied).
	ErrBadRequest = errors.New("bad request")
	// ErrServiceError: the handler ran and returned an error (70).
	ErrServiceError = errors.New("service error")
	// ErrCanceled: the caller gave up, not the request or the server.
	// Its context was cancelled, or it called a closed client: a 90 with
	// such a cause. A call in flight when its client closes fails with
	// its connection instead (35).
	ErrCanceled = errors.New("canceled")
	// ErrNotSent: the request provably never left this process, so the
	// server did nothing. Safe to retry whatever the method. Matched by
	// an [*Error] whose NotSent field is set.
	ErrNotSent = errors.New("request not sent")
)

// Error is the error type every layer of dabb creates and inspects: a
// status, a message, where it was made, and an optional cause.
type Error struct {
	Status Status
	Msg    string
	// Code is the application's name for the error: a short snake_case
	// string such as "payment_not_found", or one of the Code constants.
	// Empty means none. It travels beside the status, which stays
	// Dubbo's: a peer that does not know codes still reads status and Msg.
	// It never makes a call retryable that was not.
	Code string
	// Details are strings the handler attached for the caller, in order.
	// At most MaxErrorDetails travel. Nil means none.
	Details []string
	// Remote is true when the status arrived in a response from the
	// peer, false when this process made it.
	Remote bool
	// NotSent is true when the request provably never left this process.
	// errors.Is(err, ErrNotSent) reports it; the message says it, not
	// Error's format. Build such errors with [NotSent].
	NotSent bool
	// Err is the underlying cause, if any (a network error, a context
	// error); errors.Is and errors.As see through it.
	Err error
}

// Error formats the error as "status 60 (service not found): msg", with
// "remote " in front when the peer sent the status. A code follows the
// status: "status 60 (service not found), code not_found: msg". Details
// are left out.
func (e *Error) Error() string {
	b := make([]byte, 0, 64+len(e.Msg)+len(e.Code))
	if e.Remote {
		b = append(b, "remote "...)
	}
	b = append(b, "status "...)
	b = strconv.AppendInt(b, int64(e.Status), 10)
	b = append(b, " ("...)
	b = append(b, e.Status.String()...)
	b = append(b, ')')
	if e.Code != "" {
		b = append(b, ", code "...)
		b = append(b, e.Code...)
	}
	if e.Msg != "" {
		b = append(b, ": "...)
		b = append(b, e.Msg...)
	}
	if e.Err != nil && e.Err.Error() != e.Msg {
		b = append(b, ": "...)
		b = append(b, e.Err.Error()...)
	}
	return string(b)
}

// NotSent returns a local error of status s for a request that provably
// never left this process; cause may be nil.
func NotSent(s Status, msg string, cause error) *Error {
	return &Error{Status: s, Msg: msg, NotSent: true, Err: cause}
}

// ContextError turns a context error into the error of a call: 30 (not
// sent) or 31 for a deadline, 90 for a cancellation. sent tells whether
// the request may have left this process.
func ContextError(err error, sent bool) *Error {
	if errors.Is(err, context.DeadlineExceeded) {
		if !sent {
			return NotSent(StatusClientTimeout, "deadline exceeded before sending", err)
		}
		return &Error{Status: StatusServerTimeout, Msg: "deadline exceeded waiting for the response", Err: err}
	}
	if !sent {
		return NotSent(StatusClientError, "call cancelled before sending", err)
	}
	return &Error{Status: StatusClientError, Msg: "call cancelled", Err: err}
}

// Errorf returns an error of status s with a message formatted as
// fmt.Errorf formats it. A cause wrapped with %w stays reachable through
// errors.Is and errors.As in this process. Only the status, the message,
// the code and the details travel. It is how a handler chooses its
// status, as gRPC's status.Errorf:
//
//	return nil, protocol.Errorf(protocol.StatusBadRequest, "count must be positive, got %d", n)
//
// Set Code and Details on the result, or use [NewError], to send them too.
//
// A dabb server passes 25, 40, 60 and 70 from a handler as they are and
// answers 70 for any other status (see docs/design.md).
func Errorf(s Status, format string, args ...any) *Error {
	err := fmt.Errorf(format, args...)
	e := &Error{Status: s, Msg: err.Error()}
	if errors.Unwrap(err) != nil {
		e.Err = err
	} else if m, ok := err.(interface{ Unwrap() []error }); ok && len(m.Unwrap()) > 0 {
		e.Err = err
	}
	return e
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Is matches the sentinels by status, so errors.Is(err, ErrTimeout) is true
// for a status 30 or 31 error. ErrUnauthenticated and ErrPermissionDenied
// match by Code instead, and an error of either code matches no sentinel
// of a status. ErrNotSent matches by the NotSent field.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrUnauthenticated:
		return e.Code == CodeUnauthenticated
	case ErrPermissionDenied:
		return e.Code == CodePermissionDenied
	case ErrNotSent:
		return e.NotSent
	}
	if e.Code == CodeUnauthenticated || e.Code == CodePermissionDenied {
		// The refusals keep Dubbo's status 40 on the wire, for peers
		// that read no code; in Go the code is their class, so a
		// credentials problem is never taken for a malformed request.
		return false
	}
	switch target {
	case ErrTimeout:
		return e.Status == StatusClientTimeout || e.Status == StatusServerTimeout
	case ErrUnavailable:
		return e.Status == StatusChannelInactive || e.Status == StatusServerError
	case ErrNotFound:
		return e.Status == StatusServiceNotFound
	case ErrOverloaded:
		return e.Status == StatusServerThreadpoolExhausted
	case ErrBadRequest:
		switch e.Status {
		case StatusSerializationError, StatusBadRequest, StatusBadResponse:
			return true
		case StatusClientError:
			return !e.canceled()
		}
	case ErrServiceError:
		return e.Status == StatusServiceError
	case ErrCanceled:
		return e.canceled()
	}
	return false
}

// canceled reports a 90 whose cause says the caller gave up.
func (e *Error) canceled() bool {
	return e.Status == StatusClientError && !e.Remote &&
		(errors.Is(e.Err, context.Canceled) || errors.Is(e.Err, ErrCanceled))
}

// StatusOf returns the status an error stands for. It is StatusOK for nil
// and the status of an [*Error] found with errors.As. It is
// StatusClientTimeout for context.DeadlineExceeded, StatusClientError for
// context.Canceled, and StatusServiceError for any other error.
func StatusOf(err error) Status {
	if err == nil {
		return StatusOK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return StatusClientTimeout
	case errors.Is(err, context.Canceled):
		return StatusClientError
	}
	return StatusServiceError
}
