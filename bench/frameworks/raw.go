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

// Raw is the reference for what this machine can do: no framework, one
// shared TCP connection carrying length-prefixed frames tagged with request
// ids, a single writer goroutine per side that batches whatever frames are
// queued into one write, and the handler run inline on the server's reader
// goroutine. Same protobuf message as the others.
func Raw() Framework {
	return Framework{
		Name:  "raw",
		Setup: "raw TCP reference: 1 shared conn, [len][id][protobuf] frames, batching writer, inline handler",
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

// batchWrite writes the frames arriving on q until quit closes: each write
// takes every frame queued at that moment. done, if not nil, gets each
// frame after it is written. It closes conn on a write error.
func batchWrite(conn net.Conn, q <-chan []byte, quit <-chan struct{}, done func([]byte)) {
	bw := bufio.NewWriterSize(conn, rawBufSize)
	for {
		var frame []byte
		select {
		case frame = <-q:
		case <-quit:
			return
		}
		_, err := bw.Write(frame)
		if done != nil {
			done(frame)
		}
	drain:
		for err == nil {
			select {
			case frame = <-q:
				_, err = bw.Write(frame)
				if done != nil {
					done(frame)
				}
			default:
				break drain
			}
		}
		if err == nil {
			err = bw.Flush()
		}
		if err != nil {
			conn.Close()
			return
		}
	}
}

type rawServer struct {
	l     net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	bufs  sync.Pool // *[]byte reply frames
}

func serveRaw(l net.Listener) (io.Closer, error) {
	s := &rawServer{l: l, conns: make(map[net.Conn]struct{})}
	s.bufs.New = func() any { b := make([]byte, 0, 1024); return &b }
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
			go s.serveConn(conn)
		}
	}()
	return s, nil
}

func (s *rawServer) serveConn(conn net.Conn) {
	defer s.wg.Done()
	q := make(chan []byte, 1024)
	quit := make(chan struct{})
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		batchWrite(conn, q, quit, func(frame []byte) {
			frame = frame[:0]
			s.bufs.Put(&frame)
		})
	}()
	defer func() {
		close(quit)
		<-writerDone
		conn.Close()
		s.mu.Lock()
		delete(s.conns, conn)
		s.mu.Unlock()
	}()
	br := bufio.NewReaderSize(conn, rawBufSize)
	var hdr [rawHeader]byte
	var buf []byte
	msg := new(benchpb.BenchmarkMessage)
	for {
		id, payload, err := readFrame(br, &hdr, buf)
		buf = payload
		if err != nil {
			return
		}
		// The handler, inline: decode, answer, encode.
		if err := proto.Unmarshal(payload, msg); err != nil {
			return
		}
		benchpb.Answer(msg)
		bp := s.bufs.Get().(*[]byte)
		frame, err := proto.MarshalOptions{}.MarshalAppend(append((*bp)[:0], hdr[:]...), msg)
		if err != nil {
			return
		}
		putHeader(frame, id)
		select {
		case q <- frame:
		case <-writerDone:
			return
		}
	}
}

func (s *rawServer) Close() error {
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

// rawCall is one call in flight; pooled with its buffers.
type rawCall struct {
	frame []byte // request frame
	resp  []byte // reply payload
	err   error
	done  chan struct{} // capacity 1
}

type rawClient struct {
	conn net.Conn
	q    chan []byte
	quit chan struct{}
	wg   sync.WaitGroup

	mu      sync.Mutex // guards following
	pending map[uint64]*rawCall
	next    uint64
	err     error

	calls sync.Pool // *rawCall
}

func dialRaw(addr string) (Client, error) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("frameworks: raw: dial %s: %w", addr, err)
	}
	c := &rawClient{conn: conn, q: make(chan []byte, 1024), quit: make(chan struct{}), pending: make(map[uint64]*rawCall)}
	c.calls.New = func() any { return &rawCall{done: make(chan struct{}, 1)} }
	c.wg.Add(2)
	go func() { defer c.wg.Done(); batchWrite(conn, c.q, c.quit, nil) }()
	go func() { defer c.wg.Done(); c.read() }()
	return c, nil
}

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
	c.mu.Unlock()
	putHeader(frame, id)
	select {
	case c.q <- frame:
	case <-c.quit:
		return nil, ErrRawClosed // call stays in pending; the reader fails it
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
		// The writer may still hold the frame: drop the call.
		return nil, ctx.Err()
	}
	if call.err != nil {
		return nil, call.err
	}
	reply := new(benchpb.BenchmarkMessage)
	err = proto.Unmarshal(call.resp, reply)
	call.err = nil
	c.calls.Put(call)
	if err != nil {
		return nil, fmt.Errorf("frameworks: raw: decode: %w", err)
	}
	return reply, nil
}

func (c *rawClient) Close() error {
	close(c.quit)
	err := c.conn.Close()
	c.wg.Wait()
	return err
}
