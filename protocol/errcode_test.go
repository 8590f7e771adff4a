package protocol_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"testing"

	"github.com/dabbrpc/dabb/protocol"
)

// errorResponse returns the frame of an error response of e, as a server
// writes it.
func errorResponse(id uint64, e *protocol.Error) []byte {
	var m protocol.Message
	m.Header.Init(protocol.MakeFlags(0, 22), 0, id)
	m.SetError(e)
	return encode(&m)
}

// readErr reads frame and returns its Err as an *Error.
func readErr(t *testing.T, frame []byte) *protocol.Error {
	t.Helper()
	var m protocol.Message
	mustRead(t, reader(frame), &m)
	var e *protocol.Error
	if !errors.As(m.Err(), &e) {
		t.Fatalf("Err() = %v, want an *Error", m.Err())
	}
	return e
}

func TestErrorCodeRoundTrip(t *testing.T) {
	sent := protocol.NewError(protocol.StatusServiceNotFound, "payment_not_found", "no payment 7",
		"payment_id=7", "")
	got := readErr(t, errorResponse(3, sent))
	want := &protocol.Error{Status: protocol.StatusServiceNotFound, Code: "payment_not_found", Msg: "no payment 7",
		Details: []string{"payment_id=7", ""}, Remote: true}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("read back %#v, want %#v", got, want)
	}

	t.Run("no code, no details", func(t *testing.T) {
		var m protocol.Message
		m.SetError(&protocol.Error{Status: protocol.StatusServiceError, Msg: "out of stock"})
		if m.Attachments != nil || string(m.Payload) != "out of stock" || m.Header.Status() != protocol.StatusServiceError {
			t.Errorf("SetError without code: attachments %v, payload %q, status %v", m.Attachments, m.Payload, m.Header.Status())
		}
		got := readErr(t, errorResponse(1, &protocol.Error{Status: protocol.StatusServiceError, Msg: "out of stock"}))
		if got.Code != "" || got.Details != nil {
			t.Errorf("read back code %q, details %q; want none", got.Code, got.Details)
		}
	})

	t.Run("earlier error keys are replaced, others kept", func(t *testing.T) {
		var m protocol.Message
		m.SetError(protocol.NewError(protocol.StatusBadRequest, "a", "first", "d0", "d1", "d2"))
		m.Attachments["trace-id"] = "t-1"
		m.SetError(protocol.NewError(protocol.StatusBadRequest, "", "second", "x"))
		want := map[string]string{"trace-id": "t-1", "error-detail-0": "x"}
		if !reflect.DeepEqual(m.Attachments, want) {
			t.Errorf("attachments %q, want %q", m.Attachments, want)
		}
	})

	t.Run("details stop at the first gap", func(t *testing.T) {
		var m protocol.Message
		m.Header.Init(protocol.MakeFlags(0, 22), protocol.StatusServiceError, 1)
		m.Attachments = map[string]string{"error-detail-0": "a", "error-detail-2": "c"}
		got := readErr(t, encode(&m))
		if !reflect.DeepEqual(got.Details, []string{"a"}) {
			t.Errorf("details %q, want [a]", got.Details)
		}
	})
}

// TestErrorDetailsBound: a handler's long detail list is cut to
// MaxErrorDetails, so a response stays far inside MaxAttachments, and a
// reader takes no more than that bound from a peer that sends more.
func TestErrorDetailsBound(t *testing.T) {
	many := make([]string, protocol.MaxErrorDetails+10)
	for i := range many {
		many[i] = strconv.Itoa(i)
	}
	var m protocol.Message
	m.Header.Init(protocol.MakeFlags(0, 22), 0, 1)
	m.SetError(protocol.NewError(protocol.StatusServiceError, "too_many", "boom", many...))
	if n := len(m.Attachments); n != 1+protocol.MaxErrorDetails {
		t.Fatalf("%d details make %d attachments, want %d", len(many), n, 1+protocol.MaxErrorDetails)
	}
	if err := protocol.CheckAttachments(&m); err != nil {
		t.Fatal(err)
	}
	got := readErr(t, encode(&m))
	if !reflect.DeepEqual(got.Details, many[:protocol.MaxErrorDetails]) {
		t.Errorf("read back %d details, want the first %d", len(got.Details), protocol.MaxErrorDetails)
	}

	// A peer that sends more than the bound: the reader keeps the bound.
	for i := protocol.MaxErrorDetails; i < len(many); i++ {
		m.Attachments[protocol.AttachErrorDetail+strconv.Itoa(i)] = many[i]
	}
	if got := readErr(t, encode(&m)); len(got.Details) != protocol.MaxErrorDetails {
		t.Errorf("reader took %d details, want %d", len(got.Details), protocol.MaxErrorDetails)
	}
}

// TestErrorResponseForAPeerWithoutCodes decodes an error response with
// code and details by hand, as a Dubbo-style peer that skips attachments
// does: the status byte and the message are where they always were.
func TestErrorResponseForAPeerWithoutCodes(t *testing.T) {
	frame := errorResponse(9, protocol.NewError(protocol.StatusServiceNotFound, protocol.CodeNotFound,
		"no payment 7", "payment_id=7", "region=eu"))
	if frame[0] != 0xda || frame[1] != 0xbb || frame[3] != byte(protocol.StatusServiceNotFound) {
		t.Fatalf("header % x: magic or status byte moved", frame[:16])
	}
	if id := binary.BigEndian.Uint64(frame[4:12]); id != 9 {
		t.Fatalf("request id %d, want 9", id)
	}
	body := frame[16:]
	if n := binary.BigEndian.Uint32(frame[12:16]); int(n) != len(body) {
		t.Fatalf("body length %d, frame has %d", n, len(body))
	}
	field := func() []byte {
		n, k := binary.Uvarint(body)
		if k <= 0 || int(n) > len(body)-k {
			t.Fatalf("truncated field in % x", body)
		}
		f := body[k : k+int(n)]
		body = body[k+int(n):]
		return f
	}
	field() // service
	field() // method
	count, k := binary.Uvarint(body)
	body = body[k:]
	for range 2 * count { // keys and values, skipped
		field()
	}
	if count != 3 {
		t.Errorf("%d attachments, want 3: the code and two details", count)
	}
	if string(body) != "no payment 7" {
		t.Errorf("payload %q, want the message", body)
	}
}

func TestCodeSentinels(t *testing.T) {
	tests := []struct {
		code   string
		status protocol.Status
		want   error
	}{
		{protocol.CodeUnauthenticated, protocol.StatusBadRequest, protocol.ErrUnauthenticated},
		{protocol.CodeUnauthenticated, protocol.StatusServerThreadpoolExhausted, protocol.ErrUnauthenticated},
		{protocol.CodePermissionDenied, protocol.StatusBadRequest, protocol.ErrPermissionDenied},
		{protocol.CodePermissionDenied, protocol.StatusServiceError, protocol.ErrPermissionDenied},
		{protocol.CodeNotFound, protocol.StatusServiceNotFound, nil},
		{"", protocol.StatusBadRequest, nil},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s/%d", tt.code, tt.status), func(t *testing.T) {
			err := fmt.Errorf("call: %w", &protocol.Error{Status: tt.status, Code: tt.code, Remote: true})
			for _, s := range []error{protocol.ErrUnauthenticated, protocol.ErrPermissionDenied} {
				if got := errors.Is(err, s); got != (s == tt.want) {
					t.Errorf("errors.Is(code %q, %v) = %v", tt.code, s, got)
				}
			}
			// Another code leaves the status's own sentinel to match.
			if tt.want == nil && tt.status == protocol.StatusBadRequest && !errors.Is(err, protocol.ErrBadRequest) {
				t.Error("a 40 with a code no longer matches ErrBadRequest")
			}
		})
	}
}

// TestRefusalsAreTheirOwnClass holds a refusal by credentials apart from
// every sentinel of a status, whatever the status, while it keeps the
// status a Dubbo peer reads.
func TestRefusalsAreTheirOwnClass(t *testing.T) {
	statuses := []error{protocol.ErrTimeout, protocol.ErrUnavailable, protocol.ErrNotFound,
		protocol.ErrOverloaded, protocol.ErrBadRequest, protocol.ErrServiceError, protocol.ErrCanceled}
	for _, code := range []string{protocol.CodeUnauthenticated, protocol.CodePermissionDenied} {
		for _, status := range []protocol.Status{protocol.StatusBadRequest, protocol.StatusServiceError,
			protocol.StatusServerThreadpoolExhausted, protocol.StatusServerTimeout, protocol.StatusClientError} {
			for _, remote := range []bool{true, false} {
				pe := &protocol.Error{Status: status, Code: code, Remote: remote, Err: context.Canceled}
				err := fmt.Errorf("call: %w", pe)
				for _, s := range statuses {
					if errors.Is(err, s) {
						t.Errorf("code %s, status %d, remote %v: matches %v", code, status, remote, s)
					}
				}
				if protocol.StatusOf(err) != status {
					t.Errorf("code %s: StatusOf = %d, want %d", code, protocol.StatusOf(err), status)
				}
			}
		}
	}
	// What the token check answers: a 40 on the wire, its own class in Go.
	err := &protocol.Error{Status: protocol.StatusBadRequest, Code: protocol.CodeUnauthenticated, Remote: true}
	if errors.Is(err, protocol.ErrBadRequest) || !errors.Is(err, protocol.ErrUnauthenticated) {
		t.Errorf("%v: want ErrUnauthenticated and not ErrBadRequest", err)
	}
	// ErrNotSent is no class of a status: it still matches by its field.
	local := protocol.NotSent(protocol.StatusClientError, "no", nil)
	local.Code = protocol.CodePermissionDenied
	if !errors.Is(local, protocol.ErrNotSent) || !errors.Is(local, protocol.ErrPermissionDenied) {
		t.Errorf("%v: want ErrNotSent and ErrPermissionDenied", local)
	}
}
