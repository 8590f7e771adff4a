#!/bin/sh
# Regenerates ../kitex_gen from bench.proto with the Kitex code generator
# (a tool of this module: go tool kitex). Kitex wants the message's Go
# package under <module>/kitex_gen, so it reads a copy of bench.proto with
# that go_package.
set -e
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
sed 's|^option go_package = .*|option go_package = "github.com/dabbrpc/dabb/bench/kitex_gen/benchpb";|' bench.proto >"$t/bench.proto"
cd ..
go tool kitex -module github.com/dabbrpc/dabb/bench -type protobuf -I "$t" "$t/bench.proto"
