module github.com/dabbrpc/dabb/dubbo

go 1.26.0

require (
	github.com/dabbrpc/dabb v0.0.0-00010101000000-000000000000
	github.com/go-zookeeper/zk v1.0.4
	go.uber.org/goleak v1.3.0
)

replace github.com/dabbrpc/dabb => ../
