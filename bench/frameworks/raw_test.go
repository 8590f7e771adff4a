package frameworks

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/dabbrpc/dabb/internal/wait"

	benchpb "github.com/dabbrpc/dabb/bench/proto"
)

// silentServer accepts connections on a loopback port and reads them
// without ever answering. Each accepted connection is sent on accepted
// (dropped when full); read counts the bytes read.
type silentServer struct {
	l        net.Listener
	accepted chan struct{}
	read     atomic.Int64
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    []net.Conn
}

func startSilent(t *testing.T) *silentServer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &silentServer{l: l, accepted: make(chan struct{}, 16)}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, conn)
			s.mu.Unlock()
			signal(s.accepted)
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				buf := make([]byte, 4096)
				for {
					n, err := conn.Read(buf)
					s.read.Add(int64(n))
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// await waits up to 10 s for n signals on ch.
func await(t *testing.T, ch chan struct{}, n int, what string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for range n {
		select {
		case <-ch:
		case <-timeout:
			t.Fatalf("no %s within 10 s", what)
		}
	}
}

// testUnanswered checks a client made by dial against a server that never
// answers: a call ends with its context's error, callers calls blocked on
// their answers end with ErrRawClosed when the client closes, and the
// server has accepted wantConns connections.
func testUnanswered(t *testing.T, dial func(string) (Client, error), callers, wantConns int) {
	s := startSilent(t)
	c, err := dial(s.l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	req := benchpb.NewMessage(0)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.Echo(ctx, req); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Echo with a 50 ms deadline = %v, want context.DeadlineExceeded", err)
	}
	errs := make(chan error, callers)
	for range callers {
		go func() {
			_, err := c.Echo(context.Background(), req)
			errs <- err
		}()
	}
	await(t, s.accepted, wantConns, "connection accepted")
	frames := int64((callers + 1) * (rawHeader + proto.Size(req)))
	wait.Until(t, 10*time.Second, time.Millisecond, "the server to read every request", func() bool {
		return s.read.Load() >= frames
	})
	if err := c.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		t.Errorf("Close: %v", err)
	}
	for range callers {
		select {
		case err := <-errs:
			if !errors.Is(err, ErrRawClosed) {
				t.Errorf("a call in flight at Close ended with %v, want ErrRawClosed", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a call in flight at Close did not end within 10 s")
		}
	}
	if _, err := c.Echo(context.Background(), req); !errors.Is(err, ErrRawClosed) {
		t.Errorf("Echo after Close = %v, want ErrRawClosed", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.conns) != wantConns {
		t.Errorf("the server accepted %d connections, want %d", len(s.conns), wantConns)
	}
}

// TestRawUnanswered: one connection carries every call.
func TestRawUnanswered(t *testing.T) {
	testUnanswered(t, dialRaw, 3, 1)
}

// TestRawServerPartialFrame: the server answers the whole frames it has
// read without waiting for the rest of a frame the client is still
// writing, and then answers that one.
func TestRawServerPartialFrame(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := serveRaw(l)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	conn, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var frames []byte
	for id := uint64(1); id <= 2; id++ {
		start := len(frames)
		frames, err = proto.MarshalOptions{}.MarshalAppend(append(frames, make([]byte, rawHeader)...), benchpb.NewMessage(0))
		if err != nil {
			t.Fatal(err)
		}
		putHeader(frames[start:], id)
	}
	split := len(frames)/2 + 10 // the first frame and a part of the second
	br := bufio.NewReader(conn)
	var hdr [rawHeader]byte
	for i, part := range [][]byte{frames[:split], frames[split:]} {
		if _, err := conn.Write(part); err != nil {
			t.Fatal(err)
		}
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		id, payload, err := readFrame(br, &hdr, nil)
		if err != nil {
			t.Fatalf("answer %d: %v (within 10 s)", i+1, err)
		}
		reply := new(benchpb.BenchmarkMessage)
		if err := proto.Unmarshal(payload, reply); err != nil {
			t.Fatal(err)
		}
		if err := benchpb.Check(benchpb.NewMessage(0), reply); id != uint64(i+1) || err != nil {
			t.Errorf("answer %d: id %d, %v", i+1, id, err)
		}
	}
	// The server closes a connection that sends a bad frame.
	if _, err := conn.Write([]byte{0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0}); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("read after a bad frame = %v, want io.EOF", err)
	}
}
