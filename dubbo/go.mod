module github.com/dabbrpc/dabb/dubbo

go 1.26.0

require github.com/apache/dubbo-go-hessian2 v1.13.2

require (
	github.com/dubbogo/gost v1.14.4 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	go.uber.org/atomic v1.9.0 // indirect
)

replace github.com/dabbrpc/dabb => ../
