#!/usr/bin/env bash
# Runs all of dabb's checks and tests, in every module of the repository:
# go vet (also for darwin and windows, where the library builds), gofmt,
# staticcheck, and go test -race over every package (bench/dubbogo's
# without -race, below), against real ZooKeeper and etcd servers that the
# tests start on loopback ports. The modules are the library (.), the demo
# (examples/, the one with etcd's server), the benchmark harness (bench/,
# so the peers it measures stay out of dabb's go.mod; its tests run the
# harness on short windows, not a measurement), oteldabb (OpenTelemetry
# tracing, kept out of dabb's go.mod), dubbo (Dubbo interop, kept out for
# the same reason) and cmd/dabbctl (the operator's command, a module of
# its own so that it can import dubbo; its tests run the built binary
# against real servers). bench/dubbogo is the program of the bench's
# dubbo-go row, a module of its own so that dubbo-go's requirements stay
# out of bench's go.mod; no go.work takes it in, so its checks run with
# GOWORK=off (bench's tests build it the same way).
#
# It installs what the tests need when it is missing: ZooKeeper, etcd,
# Caucho Hessian and a JDK (for the dubbo module's Java test) from Debian's
# packages (as root, or through sudo), staticcheck from the Go
# module proxy. Set CI=true to make a missing server fail the run instead of
# skipping its tests.
set -euo pipefail
cd "$(dirname "$0")/.."

staticcheck_version=v0.8.2

need=()
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || need+=(etcd-client)
[ -f /usr/share/java/zookeeper.jar ] || need+=(zookeeper)
# The dubbo module's Java test decodes dabb's hessian2 bodies with Caucho
# Hessian on a JDK (17 or later).
[ -f /usr/share/java/hessian.jar ] || need+=(libhessian-java)
command -v javac >/dev/null 2>&1 || need+=(default-jdk-headless)
if [ ${#need[@]} -gt 0 ]; then
	echo "== installing ${need[*]}"
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
	elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
		sudo apt-get update -qq
		sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
	else
		echo "the registry tests need ${need[*]}: sudo apt-get install -y ${need[*]}" >&2
		echo "(without them those tests skip; with CI=true they fail)" >&2
	fi
fi

# modules lists every module of the repository: ./... stops at a go.mod, so
# each one is checked in its own directory. A go.mod not listed fails here,
# except under testdata/: those are peer programs (dubbo-go) that tests
# build and run as processes, never tested themselves.
modules=(. cmd/dabbctl dubbo examples oteldabb bench bench/dubbogo)
for f in $(git ls-files go.mod '*/go.mod' 2>/dev/null || find . -name go.mod); do
	m=$(dirname "${f#./}")
	[[ "$m" == */testdata/* ]] && continue
	if [[ " ${modules[*]} " != *" $m "* ]]; then
		echo "scripts/test.sh: $f is a module that is not in the list" >&2
		exit 1
	fi
done

# Every module's requirements download in the background, among them the
# dubbo-go peer that the dubbo module's tests build (dubbo/testdata/dubbogo):
# on a machine with an empty module cache the downloads then overlap the
# CPU-bound vet and tests instead of waiting in front of each module's turn.
# A module whose download fails here downloads again, in the foreground, when
# its turn comes, and says why there.
(
	for d in "${modules[@]}" dubbo/testdata/dubbogo; do
		(cd "$d" && GOWORK=off go mod download) || true
	done
) >/dev/null 2>&1 &
prefetch=$!
dubbo_tests=
trap 'kill "$prefetch" ${dubbo_tests:+"$dubbo_tests"} 2>/dev/null || true' EXIT

echo "== gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
	echo "gofmt would change: $unformatted" >&2
	exit 1
fi

gobin=$(go env GOPATH)/bin
if ! "$gobin/staticcheck" -version 2>/dev/null | grep -q "${staticcheck_version#v}"; then
	echo "== installing staticcheck ${staticcheck_version}"
	go install "honnef.co/go/tools/cmd/staticcheck@${staticcheck_version}"
fi

# The dubbo module's tests mostly wait: on dubbo-go processes, and on
# ZooKeeper to expire their sessions. They run in the background beside the
# modules after it, and the script waits for them at the end.
dubbo_log=$(mktemp)
for m in "${modules[@]}"; do
	(
		cd "$m"
		if [ "$m" = bench/dubbogo ]; then
			# In no workspace: bench/go.work above it does not use it.
			export GOWORK=off
		fi
		# darwin and windows are vetted where the library's files differ by
		# platform. In the root module those are transport, registry and
		# internal/proctest; every other package builds from the same
		# files everywhere, and vetting them for two more platforms cost
		# about 200 s on a cold machine. Tests run on linux only, so the
		# root's, registry/etcd's and registry/zk's test files per
		# platform are not vetted elsewhere. dabbctl is vetted whole. dubbo,
		# examples and oteldabb have no files per platform, and the bench
		# programs run on linux.
		case "$m" in
		.)
			echo "== $m: go vet (linux; darwin and windows for the packages with files per platform)"
			go vet ./...
			portable=(./transport/... ./registry ./internal/proctest)
			GOOS=darwin go vet "${portable[@]}"
			GOOS=windows go vet "${portable[@]}"
			;;
		cmd/dabbctl)
			echo "== $m: go vet (linux, darwin and windows)"
			go vet ./...
			GOOS=darwin go vet ./...
			GOOS=windows go vet ./...
			;;
		*)
			echo "== $m: go vet"
			go vet ./...
			;;
		esac
		# bench/dubbogo is one small program on dubbo-go: staticcheck would
		# analyse all of dubbo-go first (about 100 s on a cold machine).
		# Run it by hand there: cd bench/dubbogo && GOWORK=off staticcheck ./...
		if [ "$m" != bench/dubbogo ]; then
			echo "== $m: staticcheck"
			"$gobin/staticcheck" ./...
		fi
		if [ "$m" = dubbo ]; then
			exit 0 # tested below, in the background
		fi
		if [ "$m" = bench/dubbogo ]; then
			# Without -race: with it, all of dubbo-go compiles once more
			# for a one-second test of flags and text formats (about 90 s
			# on a cold machine). bench's tests build and run the program
			# under load, and this test reuses that build.
			echo "== $m: go test"
			go test -count=1 -timeout 15m ./...
			exit 0
		fi
		echo "== $m: go test -race"
		if [ "$m" = . ]; then
			# The freeze tests (root and proxy) time calls while an
			# instance is stopped under load: they run after the other
			# packages, one package at a time, with the machine to
			# themselves rather than beside ZooKeeper's JVM and rpcgen's
			# builds.
			alone=(github.com/dabbrpc/dabb github.com/dabbrpc/dabb/proxy)
			go test -race -count=1 -timeout 15m $(go list ./... | grep -vxF -e "${alone[0]}" -e "${alone[1]}")
			go test -race -count=1 -timeout 15m -p 1 "${alone[@]}"
		else
			go test -race -count=1 -timeout 15m ./...
		fi
	)
	if [ "$m" = dubbo ]; then
		(
			cd dubbo
			echo "== dubbo: go test -race"
			go test -race -count=1 -timeout 15m ./...
			# A fixed, short run of the body fuzzer, seeded from the
			# golden frames dubbo-go wrote.
			echo "== dubbo: fuzz the hessian2 body decoders for 20s"
			go test -run '^$' -fuzz '^FuzzDecode$' -fuzztime 20s .
		) >"$dubbo_log" 2>&1 &
		dubbo_tests=$!
		echo "== dubbo: go test -race runs in the background; its output comes at the end"
	fi
done
if [ -n "$dubbo_tests" ]; then
	status=0
	wait "$dubbo_tests" || status=$?
	cat "$dubbo_log"
	rm -f "$dubbo_log"
	if [ "$status" != 0 ]; then
		echo "scripts/test.sh: the dubbo module's tests failed" >&2
		exit "$status"
	fi
fi
