// The errors a call returns: the sentinels and the sentences that explain them.

package proxy

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"

	"github.com/dabbrpc/dabb/protocol"
)

// Errors a call can return, matched with errors.Is. Every error from Invoke
// is a *protocol.Error (errors.As). It holds the status, whether the peer
// sent it (Remote), and the handler's Code and Details, if any.
var (
	// ErrTimeout: the call's budget ran out.
	ErrTimeout = protocol.ErrTimeout
	// ErrUnavailable: no instance could take the call, or the connection
	// was lost.
	ErrUnavailable = protocol.ErrUnavailable
	// ErrNotFound: the server has no such service or method (code
	// unimplemented), or a handler answered 60 with a code of its own.
	ErrNotFound = protocol.ErrNotFound
	// ErrOverloaded: the server rejected the call without running it.
	ErrOverloaded = protocol.ErrOverloaded
	// ErrBadRequest: the request or reply could not be encoded or
	// understood. A refusal by credentials is not one, though its
	// status is 40: it matches ErrUnauthenticated or
	// ErrPermissionDenied.
	ErrBadRequest = protocol.ErrBadRequest
	// ErrServiceError: the method ran and returned an error.
	ErrServiceError = protocol.ErrServiceError
	// ErrCanceled: the caller gave up. Its context was cancelled, or it
	// called after Close. A call in flight when Close runs fails with its
	// connection instead (35): the server may have acted.
	ErrCanceled = protocol.ErrCanceled
	// ErrNotSent: the request provably never left this process. No
	// instance took it, no connection was up, or the budget ran out
	// first. It is safe to try again, whatever the method.
	ErrNotSent = protocol.ErrNotSent
	// ErrUnauthenticated: the server refused the call's credentials (code
	// unauthenticated, whatever the status). No sentinel of a status
	// matches it. Never retried; never counted against a breaker.
	ErrUnauthenticated = protocol.ErrUnauthenticated
	// ErrPermissionDenied: the server knows the caller and does not allow
	// the call (code permission_denied). No sentinel of a status
	// matches it. Never retried; never counted against a breaker.
	ErrPermissionDenied = protocol.ErrPermissionDenied
)

// asError returns err as a *protocol.Error, or nil.
func asError(err error) *protocol.Error {
	if err == nil {
		return nil
	}
	// The client's own errors are never wrapped: they cost no errors.As.
	if pe, ok := err.(*protocol.Error); ok {
		return pe
	}
	var pe *protocol.Error
	if errors.As(err, &pe) {
		return pe
	}
	return nil
}

// refused reports an error whose code says the server refused the caller:
// unauthenticated or permission denied. Retrying cannot change that, and
// it says nothing of the instance's health.
func refused(pe *protocol.Error) bool {
	return pe.Code == protocol.CodeUnauthenticated || pe.Code == protocol.CodePermissionDenied
}

// asCallError makes every error a call returns a *protocol.Error, as the
// package promises. A middleware's own error becomes the cause of a local
// 90, or 31 at a deadline. errors.Is still finds the middleware's error.
func asCallError(err error) error {
	if _, ok := err.(*protocol.Error); ok {
		return err
	}
	var pe *protocol.Error
	if errors.As(err, &pe) {
		return err
	}
	status := protocol.StatusClientError
	if errors.Is(err, context.DeadlineExceeded) {
		// Not 30: the call may have been sent before the middleware
		// failed it.
		status = protocol.StatusServerTimeout
	}
	return &protocol.Error{Status: status, Err: err}
}

// noInstance is the error of a call that found no instance for its first
// attempt; perr is the balancer's. Its one sentence names the service, the
// instances known and why none could take the call. It matches
// ErrUnavailable, ErrNotSent and balancer.ErrNoInstance.
func (c *Client) noInstance(ctx context.Context, service string, perr error) error {
	msg := "no instance of " + service + " can take the call: " + c.whyNone(ctx, service, nil)
	return protocol.NotSent(protocol.StatusChannelInactive, msg, &quietError{msg, []error{perr}})
}

// noneLeft is the error of a call that found no instance for attempt next.
// err is the error the call returns, of the attempt call.Addr and
// call.Attempt name. noneLeft keeps err's status and cause. Its message
// first says why the call went no further. An err that is not a
// *protocol.Error is returned as it is.
func (c *Client) noneLeft(ctx context.Context, call *Call, err error, next int, tried []string) error {
	pe, ok := err.(*protocol.Error)
	if !ok {
		return err
	}
	msg := "no instance of " + call.balanced() + " can take attempt " + strconv.Itoa(next) + ": " +
		c.whyNone(ctx, call.balanced(), tried) + "; attempt " + strconv.Itoa(call.Attempt)
	if !strings.Contains(pe.Error(), call.Addr) { // a dial error names it already
		msg += ", on " + call.Addr + ","
	}
	msg += " failed"
	// The attempt's own message, unless it is its cause's text, which
	// Error prints after the message.
	if pe.Msg != "" && (pe.Err == nil || pe.Err.Error() != pe.Msg) {
		msg += ": " + pe.Msg
	}
	out := *pe
	out.Msg = msg
	return &out
}

// quietError carries the causes of an error whose message already says
// what they would. protocol.Error prints a cause whose text equals its
// message once.
type quietError struct {
	msg  string
	errs []error
}

func (e *quietError) Error() string   { return e.msg }
func (e *quietError) Unwrap() []error { return e.errs }

// whyNone says why no known instance of service could take an attempt:
//
//	none is known
//	both known instances have an open circuit breaker
//	of its 3 known instances, 2 are shutting down and 1 was already tried
//
// An instance counts once, for the first of: shutting down, breaker open,
// in tried. One that is none of them is "unavailable": its state changed
// since the pick.
func (c *Client) whyNone(ctx context.Context, service string, tried []string) string {
	ins, err := c.cache.Instances(ctx, service)
	if err != nil || len(ins) == 0 {
		return "none is known"
	}
	var n [4]int // shutting down, breaker open, tried, other
	for i := range ins {
		switch addr := ins[i].Addr; {
		case c.pool.ReadOnly(addr):
			n[0]++
		case c.breakers.open(addr):
			n[1]++
		case slices.Contains(tried, addr):
			n[2]++
		default:
			n[3]++
		}
	}
	verbs := [4][2]string{
		{"is shutting down", "are shutting down"},
		{"has an open circuit breaker", "have an open circuit breaker"},
		{"was already tried", "were already tried"},
		{"is unavailable", "are unavailable"},
	}
	verb := func(k, count int) string {
		if count == 1 {
			return verbs[k][0]
		}
		return verbs[k][1]
	}
	var parts []string
	for k, count := range n {
		if count == len(ins) { // one reason for all
			switch count {
			case 1:
				return "its only known instance " + verb(k, 1)
			case 2:
				return "both known instances " + verb(k, 2)
			}
			return "all " + strconv.Itoa(count) + " known instances " + verb(k, count)
		}
		if count > 0 {
			parts = append(parts, strconv.Itoa(count)+" "+verb(k, count))
		}
	}
	last := len(parts) - 1
	list := strings.Join(parts[:last], ", ") + " and " + parts[last]
	return "of its " + strconv.Itoa(len(ins)) + " known instances, " + list
}

// encodeError is the error of a request the codec could not marshal.
func encodeError(call *Call, err error) error {
	return protocol.NotSent(protocol.StatusClientError, "encode "+call.Service+"."+call.Method+" request", err)
}
