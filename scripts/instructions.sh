#!/usr/bin/env bash
# Counts the user-space instructions of one call, client and server apart,
# for dabb and the two raw references: each side runs in its own process
# under valgrind's callgrind, the server as dabbbench -server and the
# client as dabbbench -calls (one caller, calls one after the other). Each
# round runs CALLS and then 2 × CALLS calls, each with a fresh server, and
# takes the difference ÷ CALLS, so start-up and shutdown cancel out. The
# table gives, per framework, the median of ROUNDS rounds of each side and
# their sum, and the sum over raw-conn's. Every round's figures go to
# stderr. docs/performance.md ("Instructions per call") records a run.
#
#	bash scripts/instructions.sh                          # about 5 minutes
#	CALLS=500 ROUNDS=1 FRAMEWORKS="raw raw-conn" bash scripts/instructions.sh
#
# Instructions, unlike calls/s, hardly move when other processes share the
# machine: what they count is the programs' own work. Valgrind runs one
# thread of a process at a time, so the Go scheduler's spinning and
# parking still differ a little from a native run. GOMAXPROCS is 2 (PROCS
# sets it). GOGC is off (GOGC sets it): with the collector on, where its
# cycles fell made the rounds of one framework differ by up to 2×; the
# counts include allocating, not collecting. GODEBUG=asyncpreemptoff=1
# keeps the runtime from preempting with signals (callgrind 3.19 fails an
# assertion on them), and cpu.rdtscp=off keeps it from RDTSCP, which
# valgrind 3.19 cannot run (golang.org/x/sys/cpu, which does not know the
# name, says so on stderr).
set -euo pipefail
cd "$(dirname "$0")/../bench"

calls=${CALLS:-1000}
rounds=${ROUNDS:-3}
read -r -a fws <<< "${FRAMEWORKS:-dabb raw-conn raw}"
command -v valgrind > /dev/null || { echo "instructions.sh: valgrind is not installed" >&2; exit 1; }

tmp=$(mktemp -d)
server=
cleanup() {
	[[ -n $server ]] && kill "$server" 2> /dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
go build -o "$tmp/dabbbench" ./cmd/dabbbench
export GOMAXPROCS=${PROCS:-2} GOGC=${GOGC:-off} GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off
vg=(valgrind --tool=callgrind)

# ir FILE prints the instructions callgrind counted in its output FILE.
ir() { awk '$1 == "summary:" || $1 == "totals:" { n = $2 } END { print n }' "$1"; }

# measure FRAMEWORK N sets cir and sir to the instructions of the client
# and of the server in a run of N calls.
measure() {
	local f=$1 n=$2
	rm -f "$tmp/ctl" "$tmp/addr" "$tmp"/*.out
	mkfifo "$tmp/ctl"
	"${vg[@]}" --callgrind-out-file="$tmp/server.out" "$tmp/dabbbench" -server -framework "$f" \
		< "$tmp/ctl" > "$tmp/addr" 2> "$tmp/server.log" &
	server=$!
	exec 3> "$tmp/ctl"
	local addr=
	for _ in $(seq 300); do
		addr=$(sed -n 's/^dabbbench-server addr //p' "$tmp/addr")
		[[ -n $addr ]] && break
		kill -0 "$server" 2> /dev/null || break
		sleep 0.1
	done
	if [[ -z $addr ]]; then
		echo "instructions.sh: the $f server did not start:" >&2
		grep -v '^==' "$tmp/server.log" >&2 || true
		exit 1
	fi
	if ! "${vg[@]}" --callgrind-out-file="$tmp/client.out" "$tmp/dabbbench" -calls "$n" -framework "$f" -addr "$addr" \
		> /dev/null 2> "$tmp/client.log"; then
		echo "instructions.sh: the $f client failed:" >&2
		grep -v '^==' "$tmp/client.log" >&2 || true
		exit 1
	fi
	exec 3>&-
	wait "$server"
	server=
	cir=$(ir "$tmp/client.out") sir=$(ir "$tmp/server.out")
}

# median prints the median of its arguments (the lower middle one for an
# even count).
median() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

declare -A client_ir server_ir
for f in "${fws[@]}"; do
	cs=() ss=()
	for r in $(seq "$rounds"); do
		measure "$f" "$calls"
		c1=$cir s1=$sir
		measure "$f" $((2 * calls))
		c2=$cir s2=$sir
		c=$(((c2 - c1) / calls)) s=$(((s2 - s1) / calls))
		echo "$f round $r: client $c, server $s instructions per call ($calls and $((2 * calls)) calls: client $c1, $c2; server $s1, $s2)" >&2
		cs+=("$c") ss+=("$s")
	done
	client_ir[$f]=$(median "${cs[@]}")
	server_ir[$f]=$(median "${ss[@]}")
done

echo "| framework | client Ir/call | server Ir/call | total | ÷ raw-conn |"
echo "|---|---:|---:|---:|---:|"
ref=
if [[ -n ${client_ir[raw-conn]:-} ]]; then
	ref=$((${client_ir[raw-conn]} + ${server_ir[raw-conn]}))
fi
for f in "${fws[@]}"; do
	c=${client_ir[$f]} s=${server_ir[$f]}
	total=$((c + s)) ratio=n/a
	if [[ -n $ref ]]; then
		ratio=$(awk -v a="$total" -v b="$ref" 'BEGIN { printf "%.2f×", a / b }')
	fi
	echo "| $f | $c | $s | $total | $ratio |"
done
echo
echo "$(date -u '+%Y-%m-%d %H:%M UTC'): median of $rounds rounds, ($((2 * calls)) calls − $calls calls) ÷ $calls, c=1, GOMAXPROCS=$GOMAXPROCS, GOGC=$GOGC, valgrind $(valgrind --version | sed 's/valgrind-//'), $(GODEBUG= go env GOVERSION)."
