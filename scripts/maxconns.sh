#!/usr/bin/env bash
# Runs a dabb server at MaxConns 10,000 under 1,000 half-header and 10,000
# idle connections that the attacker reopens as they close, and reports
# whether new clients get in and whether a client connected before sees a
# failure (bench/cmd/maxconns). The server and the attacker are separate
# processes; each needs over 10,000 descriptors, so the limit is raised.
# docs/performance.md ("Connections at MaxConns") records a run.
#
#	bash scripts/maxconns.sh                  # the full shape, about 20 s
#	MAX=1000 HALF=100 IDLE=1000 bash scripts/maxconns.sh
set -euo pipefail
cd "$(dirname "$0")/../bench"

max=${MAX:-10000}
half=${HALF:-1000}
idle=${IDLE:-10000}
need=$(( (half + idle > max ? half + idle : max) + 1000 ))
ulimit -n "$need" 2>/dev/null || ulimit -n "$(ulimit -Hn)"
if (( $(ulimit -n) < need )); then
	echo "maxconns.sh: the descriptor limit is $(ulimit -n); the run needs $need (raise the hard limit)" >&2
	exit 1
fi

bin=$(mktemp -d)
trap 'kill "${server:-}" 2>/dev/null || true; rm -rf "$bin"' EXIT
go build -o "$bin/maxconns" ./cmd/maxconns

"$bin/maxconns" -serve -max "$max" > "$bin/addr" 2> "$bin/server.log" &
server=$!
for _ in $(seq 100); do
	[[ -s "$bin/addr" ]] && break
	sleep 0.1
done
addr=$(head -n1 "$bin/addr")
echo "server at $addr, MaxConns $max, descriptor limit $(ulimit -n)"

status=0
"$bin/maxconns" -addr "$addr" -half "$half" -idle "$idle" || status=$?
kill -TERM "$server"
wait "$server" || true
tail -n +2 "$bin/addr"
echo "server log lines about refused connections: $(grep -c 'too many connections' "$bin/server.log" || true)"
exit "$status"
