package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"time"

	"dubbo.apache.org/dubbo-go/v3/common/constant"
	"dubbo.apache.org/dubbo-go/v3/global"
	"dubbo.apache.org/dubbo-go/v3/protocol"
	"dubbo.apache.org/dubbo-go/v3/remoting/getty"
	"dubbo.apache.org/dubbo-go/v3/server"
)

// readyTimeout bounds how long the service may take to be exported.
const readyTimeout = 30 * time.Second

// maxMsgLen is the largest frame either side takes: getty's default,
// 1,024,000 bytes, is under the 1 MiB calls of dabbbench's -mix point.
const maxMsgLen = 4 << 20

// EchoService is com.example.bench.EchoService.
type EchoService struct{}

// Reference names the service inside dubbo-go.
func (*EchoService) Reference() string { return "EchoService" }

// MethodMapper gives the Java method name.
func (*EchoService) MethodMapper() map[string]string { return map[string]string{"Echo": "echo"} }

// Echo is BenchmarkMessage echo(BenchmarkMessage req): field1 = "OK",
// field2 = 100 and every other field echoed.
func (*EchoService) Echo(_ context.Context, req *BenchmarkMessage) (*BenchmarkMessage, error) {
	if req == nil {
		return nil, fmt.Errorf("request is null")
	}
	req.Field1 = "OK"
	req.Field2 = 100
	return req, nil
}

// serve exports EchoService on a free port of 127.0.0.1, prints its
// address and answers samples until stdin closes.
func serve(stdin io.Reader, out *lines) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	conf := getty.GetDefaultServerConfig()
	conf.GettySessionParam.MaxMsgLen = maxMsgLen
	getty.SetServerConfig(*conf)
	app := global.DefaultApplicationConfig()
	app.Name = "dabbbench-dubbogo"
	// With the default "local", dubbo-go also exports its MetadataService
	// on the protocol's port (0.0.0.0), which collides with the listener
	// on 127.0.0.1; "remote" exports none.
	app.MetadataType = constant.RemoteMetadataStorageType
	srv, err := server.NewServer(
		server.SetServerApplication(app),
		server.WithServerProtocol(
			protocol.WithDubbo(),
			protocol.WithIp("127.0.0.1"),
			protocol.WithPort(port),
		),
	)
	if err != nil {
		return fmt.Errorf("new server: %w", err)
	}
	err = srv.RegisterService(&EchoService{},
		server.WithInterface(echoInterface),
		server.WithSerialization(constant.Hessian2Serialization),
		server.WithNotRegister(),
		// dubbo-go's default chain names filters (token, accesslog, tps,
		// execute) this program does not link, and a filter missing from
		// the chain panics on every call, which goes unanswered.
		server.WithFilter("echo"),
	)
	if err != nil {
		return fmt.Errorf("register: %w", err)
	}
	// Serve holds the server's lock for good once it has exported, so
	// the service's options are taken before it runs.
	svc := srv.GetServiceOptionsByInterfaceName(echoInterface)
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve() }()
	deadline := time.Now().Add(readyTimeout)
	for svc == nil || !svc.IsExport() {
		select {
		case err := <-serveErr:
			return fmt.Errorf("serve: %w", err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not exported within %v", echoInterface, readyTimeout)
		}
	}
	out.printf("addr 127.0.0.1:%d", port)
	err = commands(stdin, out, nil)
	svc.Unexport()
	return err
}

// freePort returns a port of 127.0.0.1 that was free a moment ago:
// dubbo-go listens on the port its options name, and reports no other.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
