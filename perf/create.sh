#!/usr/bin/env bash
# Durable create throughput: CLIENTS concurrent connections POST /v1/links for DURATION seconds
# against a release build on the embedded store (fsync per group commit). Server pinned to CPU 0,
# wrk to CPU 1. Prints creates/s and p50/p99 latency, and checks that what wrk counted as 201s
# is what the server counted.
#
# With LIST_ENTRIES=N it measures the cost of the create-time reputation check: ROUNDS pairs of
# runs, each a fresh store without lists and then with one list of N synthetic entries (70%
# hosts, 30% URLs, none matching the load's destinations, so every create pays a full miss),
# and prints each pair's ratio and the medians.
#
#   perf/create.sh                                  # CLIENTS=64 DURATION=10
#   CLIENTS=16 DURATION=5 perf/create.sh
#   LIST_ENTRIES=1000000 ROUNDS=3 perf/create.sh    # lists vs no lists
#   BIN=/path/to/lasthop-control perf/create.sh     # another build (no cargo build)
#
# With STORE=postgres it starts a PostgreSQL primary and a synchronous streaming standby
# (perf/lib.sh pg_pair: synchronous_commit=on, synchronous_standby_names='*', so a 201 is on
# both disks) and runs ROUNDS pairs: the control plane on PostgreSQL (a fresh database each
# round, reached by the multi-host URL), then on the embedded store, printing both and the
# medians. The control plane is pinned to CPU 0 and wrk to CPU 1 as above; the two PostgreSQL
# servers are not pinned (on a 2-core host they share both cores with everything else).
#
#   STORE=postgres ROUNDS=3 perf/create.sh          # goal: >= 5000 durable creates/s
set -euo pipefail
cd "$(dirname "$0")/.."
CLIENTS=${CLIENTS:-64}
DURATION=${DURATION:-10}
PORT=${PORT:-18081}
LIST_ENTRIES=${LIST_ENTRIES:-0}
ROUNDS=${ROUNDS:-3}
command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk; }
if [ -z "${BIN:-}" ]; then
  cargo build --release -q -p lasthop-control
  BIN=target/release/lasthop-control
fi
STORE=${STORE:-embedded}
work=$(mktemp -d /var/tmp/lasthop-create.XXXXXX)
pid=
. perf/lib.sh
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; wait 2>/dev/null; pg_pair_stop; rm -rf "$work"' EXIT
$BIN keygen --out "$work/key" >/dev/null

if [ "$LIST_ENTRIES" -gt 0 ]; then
  hosts=$((LIST_ENTRIES * 7 / 10))
  awk -v h="$hosts" -v n="$LIST_ENTRIES" 'BEGIN {
    print "# synthetic reputation list for perf/create.sh"
    for (i = 0; i < h; i++) printf "bad%07d.example\n", i
    for (i = h; i < n; i++) printf "https://shared%d.example/kit/%d/login.php\n", i % 1000, i
  }' >"$work/list.txt"
fi

# run LABEL [serve flags...]: one fresh store, one wrk run; prints the numbers and sets $rps
# and $p99. With on=postgres the store is a fresh database on the PostgreSQL pair.
on=embedded
run() {
  local label=$1 store_args=()
  shift
  rm -rf "$work/data"
  if [ "$on" = postgres ]; then
    pg_sql "DROP DATABASE IF EXISTS lasthop WITH (FORCE)"
    pg_sql "CREATE DATABASE lasthop"
    store_args=(--store "$(pg_url lasthop)")
    export LASTHOP_API_KEY=$($BIN apikey create "${store_args[@]}" --owner perf 2>/dev/null)
  else
    export LASTHOP_API_KEY=$($BIN apikey create --data-dir "$work/data" --owner perf 2>/dev/null)
  fi
  taskset -c ${SERVER_CPUS:-0} $BIN serve --data-dir "$work/data" --key-file "$work/key" "${store_args[@]}" \
    --api-listen 127.0.0.1:$PORT --edge-listen 127.0.0.1:0 --create-rate 0 --max-mint-rate 0 ${SERVE_ARGS:-} "$@" \
    2>"$work/server.log" >/dev/null &
  pid=$!
  for _ in $(seq 600); do curl -sf http://127.0.0.1:$PORT/healthz >/dev/null && break; sleep 0.1; done
  local t0 t1 out p50 non2xx metrics created batches ops
  t0=$(awk "{print \$14+\$15}" /proc/$pid/stat)
  out=$(taskset -c 1 wrk -t1 -c"$CLIENTS" -d"${DURATION}s" --latency -s perf/create.lua http://127.0.0.1:$PORT/)
  t1=$(awk "{print \$14+\$15}" /proc/$pid/stat)
  rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  p50=$(echo "$out" | awk '$1=="50%" {print $2}')
  p99=$(echo "$out" | awk '$1=="99%" {print $2}')
  non2xx=$(echo "$out" | awk '/Non-2xx/ {print $NF}')
  metrics=$(curl -s http://127.0.0.1:$PORT/metrics)
  created=$(echo "$metrics" | awk -F' ' '/^lasthop_api_requests_total\{route="\/v1\/links",status="201"\}/ {print $2}')
  batches=$(echo "$metrics" | awk '/^lasthop_store_commit_ops_count/ {print $2}')
  ops=$(echo "$metrics" | awk '/^lasthop_store_commit_ops_sum/ {print $2}')
  commit_ms=$(echo "$metrics" | awk '/^lasthop_store_commit_seconds_sum/ {s=$2} /^lasthop_store_commit_seconds_count/ {n=$2} END {printf "%.2f", n ? 1000*s/n : 0}')
  entries=$(echo "$metrics" | awk '/^lasthop_reputation_list_entries/ {s += $2} END {print s + 0}')
  kill $pid
  wait $pid 2>/dev/null || true
  pid=
  [ -n "${VERBOSE:-}" ] && echo "$out" | sed 's/^/  wrk| /'
  echo "create.sh: [$label] store=$on list entries=$entries clients=$CLIENTS duration=${DURATION}s durable creates/s=$rps p50=$p50 p99=$p99 non-2xx=${non2xx:-0}"
  echo "create.sh: [$label] server CPU $(awk -v a=$t0 -v b=$t1 -v d=$DURATION "BEGIN{printf \"%.0f%%\", (b-a)/d}") of one core (user+sys); ${created:-0} x 201 in ${batches:-0} group commits (mean $(awk -v o="${ops:-0}" -v b="${batches:-1}" 'BEGIN{printf "%.1f", o/(b?b:1)}') ops/commit, mean commit $commit_ms ms)"
}

if [ "$STORE" = postgres ]; then
  pg_pair "$work"
  echo "create.sh: PostgreSQL $("$PG_BIN/postgres" --version | awk '{print $3}'), standby $(pg_sql "SELECT application_name || ' ' || sync_state FROM pg_stat_replication")"
  # The floor: one client committing one-row inserts, each a commit on both disks.
  pg_sql "CREATE DATABASE floor"
  PG_DB=floor pg_sql "CREATE TABLE t (n bigint)"
  echo "INSERT INTO t VALUES (1);" >"$work/floor.sql"
  floor=$("$PG_BIN/pgbench" -n -h 127.0.0.1 -p "$PG_PORT" -U postgres -c 1 -T 5 -f "$work/floor.sql" floor 2>/dev/null |
    awk '/^tps/ {printf "%.0f", $3}')
  echo "create.sh: floor: one client's synchronous commits (pgbench, one-row INSERT): $floor/s, $(awk -v t="$floor" 'BEGIN{printf "%.2f", 1000/t}') ms each; one writer's group commit cannot be shorter"
  pgs=() embs=() pg99=() emb99=()
  for r in $(seq "$ROUNDS"); do
    on=postgres run "round $r, postgres + sync standby"
    pgs+=("$rps") pg99+=("$p99")
    on=embedded run "round $r, embedded"
    embs+=("$rps") emb99+=("$p99")
  done
  echo
  echo "create.sh: durable creates/s on PostgreSQL with a synchronous standby: ${pgs[*]} (median $(echo "${pgs[@]}" | median); goal >= 5000), p99 ${pg99[*]}"
  echo "create.sh: durable creates/s on the embedded store, same run: ${embs[*]} (median $(echo "${embs[@]}" | median)), p99 ${emb99[*]}"
  exit 0
fi

if [ "$LIST_ENTRIES" -eq 0 ]; then
  VERBOSE=1 run "no lists"
  exit 0
fi

plain=() listed=() ratios=()
for r in $(seq "$ROUNDS"); do
  run "round $r, no lists"
  plain+=("$rps")
  run "round $r, $LIST_ENTRIES entries" --reputation-list "$work/list.txt"
  listed+=("$rps")
  ratios+=("$(awk -v a="$rps" -v b="${plain[-1]}" 'BEGIN{printf "%.3f", a/b}')")
done
echo
echo "create.sh: creates/s without lists: ${plain[*]} (median $(echo "${plain[@]}" | median))"
echo "create.sh: creates/s with $LIST_ENTRIES list entries: ${listed[*]} (median $(echo "${listed[@]}" | median))"
echo "create.sh: per-round ratio with/without: ${ratios[*]} (median $(echo "${ratios[@]}" | median); goal >= 0.90)"
