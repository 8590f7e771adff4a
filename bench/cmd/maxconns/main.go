// Command maxconns runs a dabb server at MaxConns under a connection flood
// and measures whether new clients still get in. scripts/maxconns.sh runs
// it; docs/performance.md ("Connections at MaxConns") has the result.
//
//	maxconns -serve -max 10000                  # prints its address, runs until SIGTERM
//	maxconns -addr 127.0.0.1:PORT -half 1000 -idle 10000
//
// The attacker holds -half connections that send half a header and -idle
// ones that send one heartbeat and then nothing; each one the server
// closes is reopened after -pause. A running client, connected before
// the attack, calls every millisecond throughout. Once the attacker has
// held its connections for -settle, -newcomers new clients connect one
// after another, each making 3 calls within 1 s. The server and the
// attacker run as separate processes, so each stays under its own
// descriptor limit.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/transport"
)

func main() {
	serve := flag.Bool("serve", false, "run the server")
	maxConns := flag.Int("max", 10000, "the server's MaxConns")
	addr := flag.String("addr", "", "the server's address (attacker)")
	half := flag.Int("half", 1000, "connections that send half a header")
	idle := flag.Int("idle", 10000, "connections that send a heartbeat, then nothing")
	pause := flag.Duration("pause", 20*time.Millisecond, "the wait before a closed attacker connection is reopened")
	settle := flag.Duration("settle", 5*time.Second, "how long the attack holds before the first newcomer")
	newcomers := flag.Int("newcomers", 20, "new clients, one after another")
	flag.Parse()
	var err error
	if *serve {
		err = runServer(*maxConns)
	} else {
		err = runAttack(*addr, *half, *idle, *pause, *settle, *newcomers)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "maxconns:", err)
		os.Exit(1)
	}
}

// observer counts the connections the server opens, closes and refuses.
type observer struct{ opened, closed, refused atomic.Int64 }

func (o *observer) Rejected(r transport.Rejection) {
	if r == transport.RejectMaxConns {
		o.refused.Add(1)
	}
}
func (o *observer) ConnOpened() { o.opened.Add(1) }
func (o *observer) ConnClosed() { o.closed.Add(1) }

var echo = transport.HandlerFunc(func(_ context.Context, req, resp *protocol.Message) {
	resp.Payload = append(resp.Payload[:0], req.Payload...)
})

func runServer(maxConns int) error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	obs := &observer{}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	srv := transport.NewServer(echo, transport.ServerConfig{MaxConns: maxConns, Observer: obs, Logger: log})
	fmt.Println(l.Addr())
	began := time.Now()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() { <-sig; _ = srv.Close() }()
	if err := srv.Serve(l); !errors.Is(err, transport.ErrServerClosed) {
		return err
	}
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	opened := obs.opened.Load()
	fmt.Printf("server: MaxConns %d; connections opened %d, closed %d, refused at accept (max_conns) %d; CPU %v in %v (%.1f µs per connection opened)\n",
		maxConns, opened, obs.closed.Load(), obs.refused.Load(), cpu.Round(time.Millisecond),
		time.Since(began).Round(time.Millisecond), float64(cpu.Microseconds())/float64(max(opened, 1)))
	return nil
}

// attacker holds connections that the server may close.
type attacker struct {
	addr     string
	pause    time.Duration
	stop     chan struct{}
	wg       sync.WaitGroup
	mu       sync.Mutex // guards the fields below
	ended    bool
	conns    map[net.Conn]struct{}
	open     atomic.Int64
	reopened atomic.Int64
}

func (a *attacker) start(n int, pre []byte) {
	for range n {
		a.wg.Go(func() { a.hold(pre) })
	}
}

func (a *attacker) hold(pre []byte) {
	d := net.Dialer{Timeout: 5 * time.Second}
	for {
		if c, err := d.Dial("tcp", a.addr); err == nil {
			a.mu.Lock()
			ended := a.ended
			if !ended {
				a.conns[c] = struct{}{}
			}
			a.mu.Unlock()
			if ended {
				_ = c.Close()
				return
			}
			a.open.Add(1)
			_, _ = c.Write(pre)
			_, _ = io.Copy(io.Discard, c)
			a.open.Add(-1)
			a.mu.Lock()
			delete(a.conns, c)
			a.mu.Unlock()
			_ = c.Close()
			a.reopened.Add(1)
		}
		t := time.NewTimer(a.pause)
		select {
		case <-a.stop:
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func (a *attacker) end() {
	a.mu.Lock()
	a.ended = true
	close(a.stop)
	for c := range a.conns {
		_ = c.Close()
	}
	a.mu.Unlock()
	a.wg.Wait()
}

func request(payload string) *protocol.Message {
	req := &protocol.Message{Service: "bench.Echo", Method: "Echo", Payload: []byte(payload)}
	req.Header.SetFlags(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, 22))
	return req
}

func call(ctx context.Context, p *transport.Pool, addr string) error {
	resp, err := p.RoundTrip(ctx, addr, request("hello"))
	if err != nil {
		return err
	}
	p.Release(resp)
	return nil
}

func runAttack(addr string, half, idle int, pause, settle time.Duration, newcomers int) error {
	if addr == "" {
		return errors.New("-addr is required")
	}
	quiet := slog.New(slog.DiscardHandler)
	running := transport.NewPool(transport.Config{ConnsPerAddr: 1, Logger: quiet})
	defer running.Close()
	if err := call(context.Background(), running, addr); err != nil {
		return fmt.Errorf("the running client's first call: %w", err)
	}
	var runCalls, runFails atomic.Int64
	var runErr atomic.Value
	stopRun := make(chan struct{})
	var runWG sync.WaitGroup
	runWG.Go(func() {
		for {
			select {
			case <-stopRun:
				return
			case <-time.After(time.Millisecond):
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err := call(ctx, running, addr)
			cancel()
			runCalls.Add(1)
			if err != nil {
				runFails.Add(1)
				runErr.CompareAndSwap(nil, err.Error())
			}
		}
	})

	a := &attacker{addr: addr, pause: pause, stop: make(chan struct{}), conns: make(map[net.Conn]struct{})}
	began := time.Now()
	a.start(half, protocol.AppendHeartbeat(nil, 1)[:8])
	a.start(idle, protocol.AppendHeartbeat(nil, 1))
	time.Sleep(settle)
	fmt.Printf("attack: %d half headers + %d idle; after %v, %d open, %d closed by the server so far\n",
		half, idle, time.Since(began).Round(time.Millisecond), a.open.Load(), a.reopened.Load())

	var firsts []time.Duration
	failed := 0
	for i := range newcomers {
		p := transport.NewPool(transport.Config{ConnsPerAddr: 1, Logger: quiet})
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		start := time.Now()
		for j := range 3 {
			if err := call(ctx, p, addr); err != nil {
				failed++
				fmt.Printf("newcomer %d, call %d: failed after %v: %v\n", i, j, time.Since(start), err)
				break
			}
			if j == 0 {
				firsts = append(firsts, time.Since(start))
			}
		}
		cancel()
		_ = p.Close()
		time.Sleep(250 * time.Millisecond)
	}
	held := a.open.Load()
	close(stopRun)
	runWG.Wait()
	a.end()

	slices.Sort(firsts)
	fmt.Printf("newcomers: %d of %d made 3 calls within 1 s", newcomers-failed, newcomers)
	if len(firsts) > 0 {
		fmt.Printf("; connect + first answer: min %v, median %v, max %v",
			firsts[0].Round(time.Microsecond), firsts[len(firsts)/2].Round(time.Microsecond),
			firsts[len(firsts)-1].Round(time.Microsecond))
	}
	fmt.Println()
	fmt.Printf("running client: %d calls, %d failed", runCalls.Load(), runFails.Load())
	if e := runErr.Load(); e != nil {
		fmt.Printf(" (first: %v)", e)
	}
	fmt.Println()
	fmt.Printf("attack: %d connections open at the end, %d closed by the server in %v\n",
		held, a.reopened.Load(), time.Since(began).Round(time.Millisecond))
	if failed > 0 || runFails.Load() > 0 {
		return errors.New("calls failed")
	}
	return nil
}
