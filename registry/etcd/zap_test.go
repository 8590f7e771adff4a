package etcd

import "go.uber.org/zap"

var nopZap = zap.NewNop()
