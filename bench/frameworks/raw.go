package frameworks

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"google.golang.org/protobuf/proto"

	benchpb "github.com/dabbrpc/dabb/bench/proto"
)

// Raw is the reference for what this machine can do with one shared
// connection: no framework, length-prefixed frames tagged with request ids,
// no writer goroutine on either side. The server runs the handler inline on
// the connection's reading goroutine and answers every request of a read
// burst with one write. A client's callers append their frames to a shared
// buffer, and the first of them writes it for all; one reader goroutine
// hands each answer to its caller. Same protobuf message as the others.
func Raw() Framework {
	return Framework{
		Name:  "raw",
		Setup: "raw TCP reference: 1 shared conn, [len][id][protobuf] frames, callers write in turn, inline handler answering each read burst with one write",
		Serve: serveRaw,
		Dial:  dialRaw,
	}
}

// A raw frame is a 4-byte big-endian length of what follows, an 8-byte
// request id and the marshaled message.
const (
	rawHeader   = 12
	rawMaxFrame = 64 << 20
	rawBufSize  = 64 << 10
)

// ErrRawClosed reports a raw client whose connection is closed or broken.
var ErrRawClosed = errors.New("frameworks: raw: connection closed")

// readFrame reads one frame into buf (grown as needed) and returns its id
// and payload.
func readFrame(r *bufio.Reader, hdr *[rawHeader]byte, buf []byte) (uint64, []byte, error) {
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, buf, err
	}
	n := binary.BigEndian.Uint32(hdr[:4])
	if n < 8 || n > rawMaxFrame {
		return 0, buf, fmt.Errorf("frameworks: raw: bad frame length %d", n)
	}
	size := int(n - 8)
	if cap(buf) < size {
		buf = make([]byte, size)
	}
	buf = buf[:size]
	_, err := io.ReadFull(r, buf)
	return binary.BigEndian.Uint64(hdr[4:]), buf, err
}

// putHeader fills the header of a frame built after rawHeader reserved
// bytes.
func putHeader(frame []byte, id uint64) {
	binary.BigEndian.PutUint32(frame[:4], uint32(len(frame)-4))
	binary.BigEndian.PutUint64(frame[4:rawHeader], id)
}

// frameBuffered reports whether r holds a whole frame, so that reading it
// does not block.
func frameBuffered(r *bufio.Reader) bool {
	n := r.Buffered()
	if n < rawHeader {
		return false
	}
	hdr, err := r.Peek(rawHeader)
	return err == nil && n >= 4+int(binary.BigEndian.Uint32(hdr[:4]))
}

// connServer accepts connections on l and serves each on a goroutine of
// its own with serve, until Close.
type connServer struct {
	l     net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

// serveConns starts a connServer that runs serve for each connection.
func serveConns(l net.Listener, serve func(net.Conn)) *connServer {
	s := &connServer{l: l, conns: make(map[net.Conn]struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns[conn] = struct{}{}
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.done(conn)
				serve(conn)
			}()
		}
	}()
	return s
}

// done closes and forgets conn after its serve returned.
func (s *connServer) done(conn net.Conn) {
	conn.Close()
	s.mu.Lock()
	delete(s.conns, conn)
	s.mu.Unlock()
	s.wg.Done()
}

// Close closes the listener and every connection, and waits for their
// goroutines.
func (s *connServer) Close() error {
	err := s.l.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

func serveRaw(l net.Listener) (io.Closer, error) {
	return serveConns(l, serveRawConnection), nil
}

// serveRawConnection answers the frames of conn until it fails: each request's
// answer is appended to out, and out is written once no whole frame is
// left in the read buffer.
func serveRawConnection(conn net.Conn) {
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
		start := len(out)
		out, err = proto.MarshalOptions{}.MarshalAppend(append(out, hdr[:]...), msg)
		if err != nil {
			return
		}
		putHeader(out[start:], id)
		// Write at the end of the burst: when the next read would block.
		// A part of a frame counts as nothing buffered, so no answer waits
		// on a frame the client is still writing.
		if frameBuffered(br) && len(out) < rawBufSize {
			continue
		}
		if _, err := conn.Write(out); err != nil {
			return
		}
		out = out[:0]
	}
}

// rawCall is one call in flight; pooled with its buffers.
type rawCall struct {
	frame []byte // request frame
	resp  []byte // reply payload
	err   error
	done  chan struct{} // capacity 1
}

type rawClient struct {
	conn net.Conn
	wg   sync.WaitGroup // the reader

	mu       sync.Mutex // guards following
	pending  map[uint64]*rawCall
	next     uint64
	err      error  // set once the reader has stopped
	wbuf     []byte // frames waiting to be written
	spare    []byte // the other write buffer, while not being written
	flushing bool   // a caller is writing wbuf

	calls sync.Pool // *rawCall
}

func dialRaw(addr string) (Client, error) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("frameworks: raw: dial %s: %w", addr, err)
	}
	c := &rawClient{conn: conn, pending: make(map[uint64]*rawCall)}
	c.calls.New = func() any { return &rawCall{done: make(chan struct{}, 1)} }
	c.wg.Add(1)
	go func() { defer c.wg.Done(); c.read() }()
	return c, nil
}

// read hands each answer to its call until the connection fails, then
// fails every call still pending.
func (c *rawClient) read() {
	br := bufio.NewReaderSize(c.conn, rawBufSize)
	var hdr [rawHeader]byte
	var scratch []byte
	var err error
	for {
		if _, err = io.ReadFull(br, hdr[:]); err != nil {
			break
		}
		n := binary.BigEndian.Uint32(hdr[:4])
		if n < 8 || n > rawMaxFrame {
			err = fmt.Errorf("frameworks: raw: bad frame length %d", n)
			break
		}
		id := binary.BigEndian.Uint64(hdr[4:])
		c.mu.Lock()
		call := c.pending[id]
		delete(c.pending, id)
		c.mu.Unlock()
		size := int(n - 8)
		if call == nil { // the caller gave up
			if cap(scratch) < size {
				scratch = make([]byte, size)
			}
			if _, err = io.ReadFull(br, scratch[:size]); err != nil {
				break
			}
			continue
		}
		if cap(call.resp) < size {
			call.resp = make([]byte, size)
		}
		call.resp = call.resp[:size]
		_, call.err = io.ReadFull(br, call.resp)
		err = call.err
		call.done <- struct{}{}
		if err != nil {
			break
		}
	}
	c.conn.Close()
	c.mu.Lock()
	c.err = fmt.Errorf("%w: %w", ErrRawClosed, err)
	for id, call := range c.pending {
		call.err = c.err
		call.done <- struct{}{}
		delete(c.pending, id)
	}
	c.mu.Unlock()
}

// flush writes wbuf until no frame is left; the caller holds mu and has
// set flushing, and flush returns with mu unlocked. Frames appended while
// it writes go out with its next write. A write error closes the
// connection: the reader then fails every pending call.
func (c *rawClient) flush() {
	for len(c.wbuf) > 0 {
		buf := c.wbuf
		c.wbuf = c.spare[:0]
		c.mu.Unlock()
		_, err := c.conn.Write(buf)
		c.mu.Lock()
		c.spare = buf[:0]
		if err != nil {
			c.conn.Close()
			c.wbuf = c.wbuf[:0]
		}
	}
	c.flushing = false
	c.mu.Unlock()
}

func (c *rawClient) Echo(ctx context.Context, req *benchpb.BenchmarkMessage) (*benchpb.BenchmarkMessage, error) {
	call := c.calls.Get().(*rawCall)
	frame, err := proto.MarshalOptions{}.MarshalAppend(append(call.frame[:0], make([]byte, rawHeader)...), req)
	if err != nil {
		return nil, fmt.Errorf("frameworks: raw: encode: %w", err)
	}
	call.frame = frame
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		c.calls.Put(call)
		return nil, err
	}
	c.next++
	id := c.next
	c.pending[id] = call
	putHeader(frame, id)
	c.wbuf = append(c.wbuf, frame...)
	if c.flushing {
		c.mu.Unlock()
	} else {
		// No caller is writing: this one writes, its frame and whatever
		// others append meanwhile.
		c.flushing = true
		c.flush()
	}
	select {
	case <-call.done:
	case <-ctx.Done():
		c.mu.Lock()
		_, mine := c.pending[id]
		delete(c.pending, id)
		c.mu.Unlock()
		if !mine { // the reply is being delivered: wait for it
			<-call.done
		}
		call.err = nil
		c.calls.Put(call)
		return nil, ctx.Err()
	}
	if call.err != nil {
		return nil, call.err
	}
	reply := new(benchpb.BenchmarkMessage)
	err = proto.Unmarshal(call.resp, reply)
	c.calls.Put(call)
	if err != nil {
		return nil, fmt.Errorf("frameworks: raw: decode: %w", err)
	}
	return reply, nil
}

func (c *rawClient) Close() error {
	err := c.conn.Close()
	c.wg.Wait()
	return err
}
