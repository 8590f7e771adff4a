package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"dubbo.apache.org/dubbo-go/v3/common/constant"
	"dubbo.apache.org/dubbo-go/v3/global"
	"dubbo.apache.org/dubbo-go/v3/protocol"
	"dubbo.apache.org/dubbo-go/v3/registry"
	"dubbo.apache.org/dubbo-go/v3/server"
	"github.com/apache/dubbo-go-hessian2/java_exception"
)

// readyTimeout bounds how long the services may take to be exported and
// registered.
const readyTimeout = 30 * time.Second

// initialStock is the stock of sku 10086 when the provider starts.
const initialStock = 1_000_000

func runProvider(args []string) error {
	fs := flag.NewFlagSet("provider", flag.ContinueOnError)
	var c common
	c.register(fs, "dubbogo-peer-provider")
	port := fs.Int("port", 20880, "port to serve the dubbo protocol on, on 127.0.0.1")
	services := fs.String("services", "inventory,greeter", "comma-separated services to export: inventory, greeter")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := c.setup(); err != nil {
		return err
	}
	app := global.DefaultApplicationConfig()
	app.Name = c.app
	// With the default "local", dubbo-go also exports its MetadataService
	// on the protocol's port of every interface (0.0.0.0), which collides
	// with the listener on 127.0.0.1; "remote" exports none.
	app.MetadataType = constant.RemoteMetadataStorageType
	shutdown := global.DefaultShutdownConfig()
	// SIGTERM is handled below, so dubbo-go's own handler (which waits
	// out its graceful-shutdown steps before exiting) stays off.
	off := false
	shutdown.InternalSignal = &off
	srv, err := server.NewServer(
		server.SetServerApplication(app),
		server.SetServerShutdown(shutdown),
		server.WithServerRegistry(
			registry.WithZookeeper(),
			registry.WithAddress(c.zk),
			registry.WithRegisterInterface(),
		),
		server.WithServerProtocol(
			protocol.WithDubbo(),
			protocol.WithIp("127.0.0.1"),
			protocol.WithPort(*port),
		),
	)
	if err != nil {
		return fmt.Errorf("new server: %w", err)
	}
	opts := func(iface string) []server.ServiceOption {
		o := []server.ServiceOption{
			server.WithInterface(iface),
			server.WithSerialization(constant.Hessian2Serialization),
			// dubbo-go's default chain names filters (token, accesslog,
			// tps, execute) the peer does not link, and a filter missing
			// from the chain panics on every call, which goes unanswered.
			server.WithFilter("echo,generic_service"),
		}
		if c.group != "" {
			o = append(o, server.WithGroup(c.group))
		}
		if c.version != "" {
			o = append(o, server.WithVersion(c.version))
		}
		return o
	}
	var ifaces []string
	for _, name := range strings.Split(*services, ",") {
		switch name {
		case "inventory":
			err = srv.RegisterService(newInventory(), opts(inventoryInterface)...)
			ifaces = append(ifaces, inventoryInterface)
		case "greeter":
			err = srv.RegisterService(&Greeter{}, opts(greeterInterface)...)
			ifaces = append(ifaces, greeterInterface)
		default:
			err = fmt.Errorf("unknown service %q: want inventory or greeter", name)
		}
		if err != nil {
			return err
		}
	}

	// Serve holds the server's lock for good once it has exported, so
	// the services' options are taken before it runs.
	svcs := make([]*server.ServiceOptions, len(ifaces))
	for i, iface := range ifaces {
		svcs[i] = srv.GetServiceOptionsByInterfaceName(iface)
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve() }()
	deadline := time.Now().Add(readyTimeout)
	for !exported(svcs) {
		select {
		case err := <-serveErr:
			return fmt.Errorf("serve: %w", err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("services %v not exported within %v", ifaces, readyTimeout)
		}
	}
	emit(map[string]any{"event": "ready", "port": *port, "interfaces": ifaces, "pid": os.Getpid()})

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sig:
	case err := <-serveErr:
		return fmt.Errorf("serve: %w", err)
	}
	// Unexport removes the providers nodes from ZooKeeper and closes
	// the listener.
	for _, o := range svcs {
		o.Unexport()
	}
	emit(map[string]any{"event": "stopped"})
	return nil
}

// exported reports whether every service in svcs is exported (served and
// registered).
func exported(svcs []*server.ServiceOptions) bool {
	for _, o := range svcs {
		if o == nil || !o.IsExport() {
			return false
		}
	}
	return true
}

// Inventory is com.example.inventory.InventoryService over an in-memory
// store.
type Inventory struct {
	mu    sync.Mutex
	stock map[int64]int64
	seen  map[string]*DeductReply // deductOnce replies by request id
}

func newInventory() *Inventory {
	return &Inventory{stock: map[int64]int64{10086: initialStock}, seen: map[string]*DeductReply{}}
}

// Reference names the service inside dubbo-go.
func (*Inventory) Reference() string { return "InventoryService" }

// MethodMapper gives the Java method names.
func (*Inventory) MethodMapper() map[string]string {
	return map[string]string{"Deduct": "deduct", "Stock": "stock", "DeductOnce": "deductOnce"}
}

func badArgument(format string, args ...any) error {
	return java_exception.NewIllegalArgumentException(fmt.Sprintf(format, args...))
}

// Deduct is boolean deduct(long sku, int count).
func (s *Inventory) Deduct(_ context.Context, sku int64, count int32) (bool, error) {
	if count <= 0 {
		return false, badArgument("count must be positive, got %d", count)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	have, ok := s.stock[sku]
	if !ok {
		return false, badArgument("unknown sku %d", sku)
	}
	if have < int64(count) {
		return false, nil
	}
	s.stock[sku] = have - int64(count)
	return true, nil
}

// Stock is long stock(long sku).
func (s *Inventory) Stock(_ context.Context, sku int64) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	have, ok := s.stock[sku]
	if !ok {
		return 0, badArgument("unknown sku %d", sku)
	}
	return have, nil
}

// DeductOnce is DeductReply deductOnce(DeductRequest req).
func (s *Inventory) DeductOnce(_ context.Context, req *DeductRequest) (*DeductReply, error) {
	if req == nil {
		return nil, badArgument("request is null")
	}
	if req.Count <= 0 {
		return nil, badArgument("count must be positive, got %d", req.Count)
	}
	sku, err := strconv.ParseInt(req.Sku, 10, 64)
	if err != nil {
		return nil, badArgument("unknown sku %s", req.Sku)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if first, ok := s.seen[req.RequestId]; ok && req.RequestId != "" {
		return &DeductReply{Remaining: first.Remaining, Duplicate: true}, nil
	}
	have, ok := s.stock[sku]
	if !ok {
		return nil, badArgument("unknown sku %d", sku)
	}
	if have < int64(req.Count) {
		return nil, java_exception.NewRuntimeException(fmt.Sprintf("insufficient stock: %d has %d, asked for %d", sku, have, req.Count))
	}
	s.stock[sku] = have - int64(req.Count)
	reply := &DeductReply{Remaining: have - int64(req.Count)}
	if req.RequestId != "" {
		s.seen[req.RequestId] = reply
	}
	return reply, nil
}

// Greeter is com.example.Greeter.
type Greeter struct{}

// Reference names the service inside dubbo-go.
func (*Greeter) Reference() string { return "Greeter" }

// MethodMapper gives the Java method names.
func (*Greeter) MethodMapper() map[string]string {
	return map[string]string{"SayHello": "sayHello", "Greet": "greet", "Fail": "fail"}
}

// SayHello is String sayHello(String name).
func (*Greeter) SayHello(_ context.Context, name string) (string, error) {
	return "hello " + name, nil
}

// Greet is HelloReply greet(HelloRequest req).
func (*Greeter) Greet(_ context.Context, req *HelloRequest) (*HelloReply, error) {
	if req == nil {
		return nil, badArgument("request is null")
	}
	msg := "hello " + req.Name
	return &HelloReply{Message: msg, Length: int32(len(msg))}, nil
}

// Fail is String fail(String why): it always throws a
// java.lang.RuntimeException whose message is why.
func (*Greeter) Fail(_ context.Context, why string) (string, error) {
	return "", java_exception.NewRuntimeException(why)
}
