// Module dabbctl is dabb's operator command. It is a module of its own so
// that it can import modules beside the library (dubbo) without their
// requirements entering the library's go.mod.
module github.com/dabbrpc/dabb/cmd/dabbctl

go 1.26.0

require (
	github.com/dabbrpc/dabb v0.0.0-00010101000000-000000000000
	github.com/dabbrpc/dabb/dubbo v0.0.0-00010101000000-000000000000
	go.uber.org/goleak v1.3.0
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/apache/dubbo-go-hessian2 v1.13.2 // indirect
	github.com/coreos/go-semver v0.3.1 // indirect
	github.com/coreos/go-systemd/v22 v22.7.0 // indirect
	github.com/dubbogo/gost v1.14.4 // indirect
	github.com/go-zookeeper/zk v1.0.4 // indirect
	github.com/golang/protobuf v1.5.4 // indirect
	github.com/grpc-ecosystem/grpc-gateway/v2 v2.29.0 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/sony/gobreaker/v2 v2.4.0 // indirect
	go.etcd.io/etcd/api/v3 v3.7.3 // indirect
	go.etcd.io/etcd/client/pkg/v3 v3.7.3 // indirect
	go.etcd.io/etcd/client/v3 v3.7.3 // indirect
	go.uber.org/atomic v1.9.0 // indirect
	go.uber.org/multierr v1.11.0 // indirect
	go.uber.org/zap v1.27.1 // indirect
	golang.org/x/net v0.61.0 // indirect
	golang.org/x/sync v0.25.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	google.golang.org/genproto/googleapis/api v0.0.0-20260803160001-6ac0973c030d // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260803160001-6ac0973c030d // indirect
	google.golang.org/grpc v1.83.2 // indirect
)

// The repository's dabb, also without the workspace (GOWORK=off). A release
// requires the dabb tag instead: `go install module@version` refuses a
// go.mod with replace directives.
replace github.com/dabbrpc/dabb => ../..

replace github.com/dabbrpc/dabb/dubbo => ../../dubbo
