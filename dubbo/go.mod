module github.com/dabbrpc/dabb/dubbo

go 1.26.0

require (
	github.com/apache/dubbo-go-hessian2 v1.13.2
	github.com/dabbrpc/dabb v0.0.0-00010101000000-000000000000
	github.com/go-zookeeper/zk v1.0.4
	go.uber.org/goleak v1.3.0
)

// gost's go.mod names the monolithic genproto of 2023-04, which still holds
// googleapis/api and googleapis/rpc: beside the split modules that etcd's
// client and grpc use, every import of those packages would be ambiguous.
// From 2023-08 the monolith no longer holds them.
require google.golang.org/genproto v0.0.0-20230822172742-b8732ec3820d // indirect

require (
	// Pinned above hessian2's v1.13.1: from v1.14.1 gost's go.mod prunes
	// (go 1.23), which keeps its requirements out of programs' graphs.
	github.com/dubbogo/gost v1.14.4 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	go.uber.org/atomic v1.9.0 // indirect
	golang.org/x/sync v0.25.0 // indirect
)

replace github.com/dabbrpc/dabb => ../
