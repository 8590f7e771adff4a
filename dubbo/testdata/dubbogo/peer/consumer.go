package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"dubbo.apache.org/dubbo-go/v3/client"
	"dubbo.apache.org/dubbo-go/v3/common/constant"
	"dubbo.apache.org/dubbo-go/v3/global"
	"dubbo.apache.org/dubbo-go/v3/registry"
	hessian "github.com/apache/dubbo-go-hessian2"
	"github.com/apache/dubbo-go-hessian2/java_exception"
)

// findTimeout bounds how long a consumer may take to find a provider.
const findTimeout = 30 * time.Second

// consumer calls one interface, typed or generically.
type consumer struct {
	conn    *client.Connection
	generic bool // calls are Dubbo's $invoke
	timeout time.Duration
}

// result is one call as printed: the call, its result or its error.
type result struct {
	Step       string `json:"step"`
	Method     string `json:"method"`
	Generic    bool   `json:"generic"`
	Result     any    `json:"result,omitempty"`
	ResultType string `json:"result_type,omitempty"`
	// ErrorClass is the Java class of a thrown exception, or "" for an
	// error that is not one (a timeout, no provider).
	ErrorClass string `json:"error_class,omitempty"`
	Error      string `json:"error,omitempty"`
}

func runConsumer(args []string) error {
	fs := flag.NewFlagSet("consumer", flag.ContinueOnError)
	var c common
	c.register(fs, "dubbogo-peer-consumer")
	script := fs.String("script", "", "calls to make and print: inventory or greeter")
	load := fs.String("load", "", "method to call under load: deduct or stock")
	n := fs.Int("n", 1000, "calls in load mode; 0: until SIGTERM")
	k := fs.Int("k", 8, "goroutines in load mode")
	sku := fs.Int64("sku", 10086, "sku of load mode")
	requestID := fs.String("request-id", fmt.Sprintf("peer-%d", time.Now().UnixNano()), "requestId of the script's deductOnce calls")
	timeout := fs.Duration("timeout", 5*time.Second, "timeout of each call")
	generic := fs.Bool("generic", false, "make the script's calls with Dubbo's $invoke")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := c.setup(); err != nil {
		return err
	}
	if (*script == "") == (*load == "") {
		return errors.New("give one of -script and -load")
	}
	iface := inventoryInterface
	switch *script {
	case "", "inventory":
	case "greeter":
		iface = greeterInterface
	default:
		return fmt.Errorf("unknown script %q: want inventory or greeter", *script)
	}
	cons, err := dial(c, iface, *generic, *timeout)
	if err != nil {
		return err
	}
	// A provider is known only once the registry has notified the
	// directory, so the first read-only call is retried until it is
	// answered.
	probe := func() result { return cons.call("probe", "stock", []string{"long"}, new(int64), *sku) }
	if iface == greeterInterface {
		probe = func() result {
			return cons.call("probe", "sayHello", []string{"java.lang.String"}, new(string), "probe")
		}
	}
	deadline := time.Now().Add(findTimeout)
	for r := probe(); r.Error != "" && r.ErrorClass == ""; r = probe() {
		if time.Now().After(deadline) {
			return fmt.Errorf("no provider of %s answered within %v: %s", iface, findTimeout, r.Error)
		}
		time.Sleep(50 * time.Millisecond)
	}
	emit(map[string]any{"event": "ready", "interface": iface})
	switch {
	case *script == "inventory":
		cons.inventoryScript(*requestID)
	case *script == "greeter":
		cons.greeterScript()
	default:
		if err := cons.load(*load, *sku, *n, *k); err != nil {
			return err
		}
	}
	emit(map[string]any{"event": "done"})
	return nil
}

// dial makes a connection to iface, found in ZooKeeper's interface-level
// layout: a generic one (Dubbo's $invoke) or a typed one. One process
// cannot hold both: dubbo-go registers each reference as a consumer node
// and refuses a second one of the same interface, group and version.
func dial(c common, iface string, generic bool, timeout time.Duration) (*consumer, error) {
	app := global.DefaultApplicationConfig()
	app.Name = c.app
	shutdown := global.DefaultShutdownConfig()
	off := false
	shutdown.InternalSignal = &off
	cli, err := client.NewClient(
		client.SetClientApplication(app),
		client.SetClientShutdown(shutdown),
		client.WithClientRegistry(
			registry.WithZookeeper(),
			registry.WithAddress(c.zk),
			registry.WithRegisterInterface(),
		),
	)
	if err != nil {
		return nil, fmt.Errorf("new client: %w", err)
	}
	opts := []client.ReferenceOption{
		client.WithProtocolDubbo(),
		client.WithSerialization(constant.Hessian2Serialization),
		client.WithRequestTimeout(timeout),
	}
	if c.group != "" {
		opts = append(opts, client.WithGroup(c.group))
	}
	if c.version != "" {
		opts = append(opts, client.WithVersion(c.version))
	}
	if generic {
		opts = append(opts, client.WithGeneric())
	}
	conn, err := cli.Dial(iface, opts...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", iface, err)
	}
	return &consumer{conn: conn, generic: generic, timeout: timeout}, nil
}

// call calls method with args: typed, decoding the result into reply (a
// pointer), or as Dubbo's $invoke with the Java parameter types and the
// arguments, POJOs as maps with a "class" key. Retries are off for every
// call but stock: failover retries any error, and a deduction retried
// after a timeout may deduct twice.
func (c *consumer) call(step, method string, types []string, reply any, args ...any) result {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	// A call without its own timeout sends an empty "timeout"
	// attachment, which dubbo-go reads as no timeout at all.
	opts := []client.CallOption{client.WithCallRequestTimeout(c.timeout)}
	if method != "stock" || c.generic {
		opts = append(opts, client.WithCallRetries(0))
	}
	var err error
	if c.generic {
		objs := make([]hessian.Object, len(args))
		for i, a := range args {
			objs[i] = genericArg(a)
		}
		var generic any // a POJO comes back as a map with a "class" key
		reply = &generic
		err = c.conn.CallUnary(ctx, []any{method, types, objs}, reply, "$invoke", opts...)
	} else {
		err = c.conn.CallUnary(ctx, args, reply, method, opts...)
	}
	return outcome(step, method, c.generic, reply, err)
}

// genericArg turns a POJO into the map a generic call carries.
func genericArg(a any) any {
	switch v := a.(type) {
	case *DeductRequest:
		return map[string]any{"class": deductRequestClass, "sku": v.Sku, "count": v.Count, "requestId": v.RequestId}
	case *HelloRequest:
		return map[string]any{"class": helloRequestClass, "name": v.Name}
	}
	return a
}

func outcome(step, method string, generic bool, reply any, err error) result {
	r := result{Step: step, Method: method, Generic: generic}
	if err != nil {
		r.Error = err.Error()
		var t java_exception.Throwabler
		if errors.As(err, &t) {
			r.ErrorClass = t.JavaClassName()
			r.Error = t.Error()
		}
		return r
	}
	v := deref(reply)
	r.ResultType = fmt.Sprintf("%T", v)
	r.Result = jsonable(v)
	return r
}

func (c *consumer) inventoryScript(requestID string) {
	const sku = int64(10086)
	long, longInt, pojo := []string{"long"}, []string{"long", "int"}, []string{deductRequestClass}
	req := func(id string, count int32) *DeductRequest {
		return &DeductRequest{Sku: "10086", Count: count, RequestId: id}
	}
	if c.generic {
		requestID += "-generic" // the provider remembers the typed run's ids
	}
	emit(c.call("stock", "stock", long, new(int64), sku))
	emit(c.call("deduct", "deduct", longInt, new(bool), sku, int32(5)))
	emit(c.call("stock-after-deduct", "stock", long, new(int64), sku))
	emit(c.call("deduct-short", "deduct", longInt, new(bool), sku, int32(2_000_000_000)))
	emit(c.call("deduct-zero", "deduct", longInt, new(bool), sku, int32(0)))
	emit(c.call("deduct-unknown", "deduct", longInt, new(bool), int64(99999), int32(1)))
	emit(c.call("stock-unknown", "stock", long, new(int64), int64(99999)))
	emit(c.call("deduct-once", "deductOnce", pojo, new(DeductReply), req(requestID, 3)))
	emit(c.call("deduct-once-again", "deductOnce", pojo, new(DeductReply), req(requestID, 3)))
	emit(c.call("deduct-once-zero", "deductOnce", pojo, new(DeductReply), req(requestID+"-zero", 0)))
}

func (c *consumer) greeterScript() {
	str := []string{"java.lang.String"}
	emit(c.call("say-hello", "sayHello", str, new(string), "world"))
	emit(c.call("greet", "greet", []string{helloRequestClass}, new(HelloReply), &HelloRequest{Name: "pojo"}))
	emit(c.call("fail", "fail", str, new(string), "always fails"))
}

// loadSummary is what load mode prints when it ends.
type loadSummary struct {
	Event       string   `json:"event"` // "load"
	Method      string   `json:"method"`
	Calls       int64    `json:"calls"`
	OK          int64    `json:"ok"`           // calls answered without an error
	False       int64    `json:"false"`        // deduct answered false
	Failures    int64    `json:"failures"`     // calls answered with an error
	Errors      []string `json:"errors"`       // the first few errors
	StockBefore int64    `json:"stock_before"` // -1 when stock failed
	StockAfter  int64    `json:"stock_after"`
	Seconds     float64  `json:"seconds"`
}

// loadProgress is what load mode prints every progressEvery while it runs.
type loadProgress struct {
	Event    string `json:"event"` // "progress"
	Calls    int64  `json:"calls"`
	OK       int64  `json:"ok"`
	Failures int64  `json:"failures"`
}

// progressEvery is how often load mode prints its progress.
const progressEvery = 100 * time.Millisecond

// maxErrors is how many errors a load summary lists.
const maxErrors = 10

// load makes n calls of method (or, with n 0, calls until SIGTERM) from
// k goroutines and prints a summary; deductions take one unit of sku.
func (c *consumer) load(method string, sku int64, n, k int) error {
	if c.generic {
		return errors.New("load mode makes typed calls only")
	}
	if method != "deduct" && method != "stock" {
		return fmt.Errorf("unknown load method %q: want deduct or stock", method)
	}
	if k < 1 || n < 0 {
		return fmt.Errorf("load needs -k ≥ 1 and -n ≥ 0, got %d and %d", k, n)
	}
	stock := func() int64 {
		var v int64
		if r := c.call("stock", "stock", nil, &v, sku); r.Error != "" {
			return -1
		}
		return v
	}
	s := loadSummary{Event: "load", Method: method, StockBefore: stock()}
	stop := make(chan struct{})
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sig)
	go func() {
		select {
		case <-sig:
			close(stop)
		case <-time.After(24 * time.Hour):
		}
	}()
	// "started" follows the first call's answer, so a load stopped right
	// after it has made at least one call.
	var started sync.Once
	var next, calls, ok, falses, failures atomic.Int64
	finished := make(chan struct{})
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for range k {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if n > 0 && next.Add(1) > int64(n) {
					return
				}
				var r result
				if method == "deduct" {
					var deducted bool
					r = c.call("load", "deduct", nil, &deducted, sku, int32(1))
					if r.Error == "" && !deducted {
						falses.Add(1)
					}
				} else {
					r = c.call("load", "stock", nil, new(int64), sku)
				}
				calls.Add(1)
				started.Do(func() { emit(map[string]any{"event": "started", "method": method}) })
				if r.Error != "" {
					failures.Add(1)
					mu.Lock()
					if len(s.Errors) < maxErrors {
						s.Errors = append(s.Errors, r.ErrorClass+": "+r.Error)
					}
					mu.Unlock()
					continue
				}
				ok.Add(1)
			}
		}()
	}
	// Progress lines let a test follow the load while it runs.
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		tick := time.NewTicker(progressEvery)
		defer tick.Stop()
		for {
			select {
			case <-finished:
				return
			case <-tick.C:
				emit(loadProgress{Event: "progress", Calls: calls.Load(), OK: ok.Load(), Failures: failures.Load()})
			}
		}
	}()
	wg.Wait()
	close(finished)
	<-progressDone
	s.Seconds = time.Since(start).Seconds()
	s.Calls, s.OK, s.False, s.Failures = calls.Load(), ok.Load(), falses.Load(), failures.Load()
	s.StockAfter = stock()
	emit(s)
	return nil
}
