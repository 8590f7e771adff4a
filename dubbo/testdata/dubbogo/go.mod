module github.com/dabbrpc/dabb/dubbo/testdata/dubbogo

go 1.26.0

require (
	dubbo.apache.org/dubbo-go/v3 v3.3.1
	github.com/apache/dubbo-go-hessian2 v1.12.5
)

require (
	github.com/Workiva/go-datastructures v1.0.52 // indirect
	github.com/dubbogo/gost v1.14.3 // indirect
	github.com/google/uuid v1.3.1 // indirect
	github.com/jinzhu/copier v0.3.5 // indirect
	github.com/natefinch/lumberjack v2.0.0+incompatible // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/sirupsen/logrus v1.8.1 // indirect
	go.uber.org/atomic v1.10.0 // indirect
	go.uber.org/multierr v1.8.0 // indirect
	go.uber.org/zap v1.21.0 // indirect
	golang.org/x/sys v0.23.0 // indirect
)
