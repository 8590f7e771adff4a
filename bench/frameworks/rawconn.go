package frameworks

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	benchpb "github.com/dabbrpc/dabb/bench/proto"
)

// RawConn is the reference for one caller alone: no framework, one TCP
// connection per caller in flight (the client keeps the idle ones and dials
// a new one when none is idle), each call one blocking write of its frame
// and a read of the answer on the caller's goroutine, and one goroutine
// per connection on the server that reads a frame, runs the handler inline
// and writes the answer. Frames as raw's; same protobuf message as the
// others.
func RawConn() Framework {
	return Framework{
		Name:  "raw-conn",
		Setup: "raw TCP reference: 1 conn per caller, blocking write then read on the caller, 1 goroutine per conn on the server, inline handler",
		Serve: serveRawConn,
		Dial:  dialRawConn,
	}
}

func serveRawConn(l net.Listener) (io.Closer, error) {
	return serveConns(l, serveRawConnConnection), nil
}

// serveRawConnConnection answers the frames of conn one at a time until it
// fails.
func serveRawConnConnection(conn net.Conn) {
	br := bufio.NewReaderSize(conn, rawBufSize)
	var hdr [rawHeader]byte
	var in, out []byte
	msg := new(benchpb.BenchmarkMessage)
	for {
		id, payload, err := readFrame(br, &hdr, in)
		in = payload
		if err != nil {
			return
		}
		if err := proto.Unmarshal(payload, msg); err != nil {
			return
		}
		benchpb.Answer(msg)
		out, err = proto.MarshalOptions{}.MarshalAppend(append(out[:0], hdr[:]...), msg)
		if err != nil {
			return
		}
		putHeader(out, id)
		if _, err := conn.Write(out); err != nil {
			return
		}
	}
}

// rawConnConn is one connection of a raw-conn client with its buffers;
// one caller uses it at a time.
type rawConnConn struct {
	conn  net.Conn
	br    *bufio.Reader
	hdr   [rawHeader]byte
	frame []byte // request frame
	resp  []byte // reply payload
}

type rawConnClient struct {
	addr string

	mu     sync.Mutex // guards following
	idle   []*rawConnConn
	open   map[*rawConnConn]struct{} // idle and in use, closed by Close
	closed bool
}

func dialRawConn(addr string) (Client, error) {
	c := &rawConnClient{addr: addr, open: make(map[*rawConnConn]struct{})}
	// Dial one connection now, so that a wrong address fails here as it
	// does for the other frameworks.
	rc, err := c.dial()
	if err != nil {
		return nil, err
	}
	c.idle = append(c.idle, rc)
	return c, nil
}

func (c *rawConnClient) dial() (*rawConnConn, error) {
	conn, err := net.Dial("tcp", c.addr)
	if err != nil {
		return nil, fmt.Errorf("frameworks: raw-conn: dial %s: %w", c.addr, err)
	}
	rc := &rawConnConn{conn: conn, br: bufio.NewReaderSize(conn, rawBufSize)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		conn.Close()
		return nil, ErrRawClosed
	}
	c.open[rc] = struct{}{}
	return rc, nil
}

// get takes an idle connection, or dials one.
func (c *rawConnClient) get() (*rawConnConn, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrRawClosed
	}
	if n := len(c.idle); n > 0 {
		rc := c.idle[n-1]
		c.idle = c.idle[:n-1]
		c.mu.Unlock()
		return rc, nil
	}
	c.mu.Unlock()
	return c.dial()
}

// put gives rc back, or closes it when it failed or the client is closed.
func (c *rawConnClient) put(rc *rawConnConn, failed bool) {
	c.mu.Lock()
	if failed || c.closed {
		delete(c.open, rc)
		c.mu.Unlock()
		rc.conn.Close()
		return
	}
	c.idle = append(c.idle, rc)
	c.mu.Unlock()
}

// longAgo is a deadline in the past: it wakes a blocked read or write.
var longAgo = time.Unix(1, 0)

func (c *rawConnClient) Echo(ctx context.Context, req *benchpb.BenchmarkMessage) (*benchpb.BenchmarkMessage, error) {
	rc, err := c.get()
	if err != nil {
		return nil, err
	}
	if ctx.Done() != nil {
		// A cancelled call wakes its blocked write or read; the
		// connection is closed after it, its answer being unread.
		stop := context.AfterFunc(ctx, func() { rc.conn.SetDeadline(longAgo) })
		defer stop()
	}
	reply, err := rc.call(req)
	c.put(rc, err != nil)
	if err != nil && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return reply, err
}

// call writes req's frame and reads the answer.
func (rc *rawConnConn) call(req *benchpb.BenchmarkMessage) (*benchpb.BenchmarkMessage, error) {
	frame, err := proto.MarshalOptions{}.MarshalAppend(append(rc.frame[:0], make([]byte, rawHeader)...), req)
	if err != nil {
		return nil, fmt.Errorf("frameworks: raw-conn: encode: %w", err)
	}
	rc.frame = frame
	putHeader(frame, 1)
	if _, err := rc.conn.Write(frame); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrRawClosed, err)
	}
	_, resp, err := readFrame(rc.br, &rc.hdr, rc.resp)
	rc.resp = resp
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrRawClosed, err)
	}
	reply := new(benchpb.BenchmarkMessage)
	if err := proto.Unmarshal(resp, reply); err != nil {
		return nil, fmt.Errorf("frameworks: raw-conn: decode: %w", err)
	}
	return reply, nil
}

// Close closes every connection, idle or in use: a call in flight fails.
func (c *rawConnClient) Close() error {
	c.mu.Lock()
	c.closed = true
	open := c.open
	c.open = nil
	c.idle = nil
	c.mu.Unlock()
	for rc := range open {
		rc.conn.Close()
	}
	return nil
}
