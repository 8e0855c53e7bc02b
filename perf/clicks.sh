#!/usr/bin/env bash
# What click recording costs the engine, and how fast the processor drains events.
#
# Part 1: the engine with click recording on (spool sink) and off, on the same LINKS-link
# snapshot, alternated within each round and paired (server pinned to CPU 0 with one core, wrk on
# CPU 1, keep-alive, real codes). Prints requests per server CPU-second (the flusher thread runs
# on the server's CPU too, so its work counts), the per-round on/off ratio and its median. nginx
# runs in the same rounds as the reference peer. Goal: recording costs <= 5%.
#
# Part 2: the processor (`lasthop-control clicks process --exit-when-idle`) on a pre-filled spool
# of EVENTS synthetic events (realistic user-agent mix, ~10% bots, ~1% duplicates), and on a
# pre-filled Kafka topic when `tansu` is installed. Goal: >= 350,000 events/s.
#
# Part 3 (with tansu and clickhouse-server installed): the processor into ClickHouse
# (`--clicks-store clickhouse://...`, a server started in the work dir on loopback), one processor
# and three in one consumer group, on a pre-filled 6-partition topic, beside the embedded store
# on the same topic; the broker, ClickHouse and the processors share this machine. Prints each
# run's events/s (the three: all events over the span from the first one's first event to the
# last one's last flush), and the classification cost per event (criterion's classify/mix).
# Goal: >= 200,000 events/s in aggregate.
#
# Part 4 (opt-in: PARTS=4; SOAK seconds, default 600): `lasthop-control serve` on the embedded
# store with its processor on the spool, one engine on its feed writing to that spool, and h2load
# (HTTP/1.1, 8 connections at RATE/8 requests a second each; RATE default 80000) on 100 links
# created through the API: every SOAK/10 s and at the end, the control plane's RSS and its
# lasthop_clicks_dedup_ids/_bytes (bytes per id). Goal: the control plane under 150 MB after 600 s
# at 80,000 events/s with the 600 s window (issue 46).
#
# Part 5 (opt-in: PARTS=5; needs the venv scripts/test installs in ~/.cache/lasthop/s3tools):
# the raw archive (issue 45). The archive consumer alone (`clicks archive --exit-when-idle`,
# pinned to CPU 1) on EVENTS pre-filled spool events, into the local filesystem (file://) and into
# SeaweedFS's S3 on loopback (pinned to CPU 0); events per sink CPU-second (user + system) and
# Parquet bytes per event; the recompute of the day from S3 in events per CPU-second; and, from
# the criterion bench `archive` on the same synthetic stream, bytes per event of Parquet against
# the zstd NDJSON the archive wrote before. Goals: >= 100,000 events per sink CPU-second;
# Parquet at most NDJSON's bytes per event.
#
#   perf/clicks.sh           # LINKS=1000000 ROUNDS=3 DURATION=8 CONNS=64 EVENTS=2000000
#   PARTS=3 perf/clicks.sh   # part 3 alone (PARTS=1,2,3 by default)
set -euo pipefail
cd "$(dirname "$0")/.."
LINKS=${LINKS:-1000000}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-8}
CONNS=${CONNS:-64}
EVENTS=${EVENTS:-2000000}
PORT=${PORT:-18080}
KPORT=${KPORT:-19092}
CHPORT=${CHPORT:-18123}
PARTS=${PARTS:-1,2,3}
part() { [[ ",$PARTS," == *",$1,"* ]]; }
need=()
command -v wrk >/dev/null || need+=(wrk)
command -v nginx >/dev/null || need+=(nginx-light)
if [ ${#need[@]} -gt 0 ]; then apt-get update -qq && apt-get install -y -qq "${need[@]}"; fi
cargo build --release -q -p lasthop-engine -p lasthop-snapshot -p lasthop-control
BIN=$PWD/target/release
work=${WORK:-/var/tmp/lasthop-perf}
mkdir -p "$work"
. perf/lib.sh
synth_links "$BIN" "$work" "$LINKS"
nginx_conf "$work" "$PORT"

hz=$(getconf CLK_TCK)
# A number field of a one-line JSON object on stdin.
field() { sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p"; }
spool=$work/click-spool

start_server() { # on|off|nginx -> sets pids
  case $1 in
    on|off)
      rm -rf "$spool"
      taskset -c 0 "$BIN/lasthop-engine" --snapshot "$work/links.snap" --key-file "$work/key" \
        --listen 127.0.0.1:$PORT --admin-listen 127.0.0.1:0 --cores 1 --cpus 0 \
        --data-dir "$work/engine-data" --clicks "$([ "$1" = on ] && echo spool || echo off)" \
        --click-spool "$spool" >"$work/$1.out" 2>"$work/$1.err" &
      pids=($!) ;;
    nginx)
      taskset -c 0 nginx -c "$work/nginx.conf" -p "$work" >/dev/null 2>&1 &
      pids=($!) ;;
  esac
  wait_up "$1" "http://127.0.0.1:$PORT/healthcheck"
}
pids=()
tansu_pid=
ch_pid=
soak_pids=()
cleanup() {
  for p in "${soak_pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  stop_server
  [ -n "$tansu_pid" ] && kill "$tansu_pid" 2>/dev/null || true
  [ -n "$ch_pid" ] && kill "$ch_pid" 2>/dev/null || true
}
trap cleanup EXIT

declare -A results
run_one() { # server round
  start_server "$1"
  local c0; c0=$(cpu_of "${pids[@]}")
  local out; out=$(CODES_FILE="$work/codes.common" SCAN_PERCENT=0 taskset -c 1 wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency -s perf/redirect.lua "http://127.0.0.1:$PORT/")
  local c1; c1=$(cpu_of "${pids[@]}")
  local recorded=""
  if [ "$1" = on ]; then
    local admin; admin=$(awk '/admin listening on/ {sub("http://", "", $4); print $4}' "$work/on.out")
    recorded=$(curl -s "http://$admin/metrics" | awk '$1=="lasthop_engine_clicks_recorded_total" {print $2}')
  fi
  stop_server
  local rps p99 cpu reqs per
  rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
  p99=$(echo "$out" | awk '$1=="99%" {print $2}')
  cpu=$(awk -v a="$c0" -v b="$c1" -v hz="$hz" 'BEGIN{printf "%.2f", (b-a)/hz}')
  reqs=$(echo "$out" | awk '/requests in/ {print $1}')
  per=$(awk -v r="$reqs" -v c="$cpu" 'BEGIN{ if (c>0) printf "%.0f", r/c; else print 0}')
  printf "  %-6s round %d: %10s req/s  p99 %-8s  server CPU %6ss  %9s req/CPU-s %s\n" "$1" "$2" "$rps" "$p99" "$cpu" "$per" \
    "${recorded:+ (events recorded: $recorded of $reqs requests)}"
  results["$1"]+="$per $rps $p99;"
}

if part 1; then
echo "clicks part 1: $LINKS links, $ROUNDS rounds x ${DURATION}s, $CONNS connections, servers on CPU 0, wrk on CPU 1"
for r in $(seq "$ROUNDS"); do
  for s in on off nginx; do run_one "$s" "$r"; done
done
echo
printf "%-22s %14s %12s %10s\n" "median of $ROUNDS" "req/CPU-s" "req/s" "p99"
for s in on off nginx; do
  v=${results["$s"]}
  printf "%-22s %14s %12s   %s\n" "engine clicks $s" "$(echo "$v" | tr ';' '\n' | awk 'NF {print $1}' | median)" \
    "$(echo "$v" | tr ';' '\n' | awk 'NF {print $2}' | median)" "$(echo "$v" | tr ';' '\n' | awk '{print $3}' | tr '\n' ' ')"
done
onr=$(echo "${results[on]}" | tr ';' '\n' | awk 'NF {print $1}')
offr=$(echo "${results[off]}" | tr ';' '\n' | awk 'NF {print $1}')
nr=$(echo "${results[nginx]}" | tr ';' '\n' | awk 'NF {print $1}')
ratio=$(paste <(echo "$onr") <(echo "$offr") | awk '{printf "%.3f ", $1/$2}')
vsn=$(paste <(echo "$onr") <(echo "$nr") | awk '{printf "%.3f ", $1/$2}')
printf "  per-round on/off %s-> median %.3f (recording costs %.1f%%; goal <= 5%%)\n" "$ratio" \
  "$(echo "$ratio" | median)" "$(echo "$ratio" | median | awk '{print 100*(1-$1)}')"
printf "  per-round on/nginx %s-> median %.2fx\n" "$vsn" "$(echo "$vsn" | median)"
fi

start_tansu() {
  [ -n "$tansu_pid" ] && return 0
  "$tansu" broker --listener-url "tcp://127.0.0.1:$KPORT" --advertised-listener-url "tcp://127.0.0.1:$KPORT" \
    --storage-engine memory://tansu/ >"$work/tansu.log" 2>&1 &
  tansu_pid=$!
  for _ in $(seq 100); do (echo >/dev/tcp/127.0.0.1/$KPORT) 2>/dev/null && break; sleep 0.1; done
}
tansu=$(command -v tansu || echo "$HOME/.cargo/bin/tansu")

if part 2; then
echo
echo "clicks part 2: the processor on $EVENTS pre-filled events"
synth_spool=$work/synth-spool
rm -rf "$synth_spool" "$work/processor-data"
"$BIN/lasthop-control" clicks synth --spool "$synth_spool" --events "$EVENTS" >/dev/null
du -sh "$synth_spool" | awk '{print "  spool: " $1}'
# The processor's summary, then what its dedup window's ids cost (bytes per id; the window's
# ids as per-writer bitmaps, issue 46; a hash set of fingerprints held ~20 before).
dedup_cost() {
  local j; j=$(cat); echo "$j"
  awk -v n="$(echo "$j" | field dedup_ids)" -v b="$(echo "$j" | field dedup_bytes)" 'BEGIN { if (n > 0)
    printf "          dedup window: %d ids in %d bytes, %.3f bytes (%.2f bits) an id\n", n, b, b / n, 8 * b / n }'
}
printf "  spool:  "
"$BIN/lasthop-control" clicks process --data-dir "$work/processor-data" --spool "$synth_spool" --exit-when-idle \
  | dedup_cost

if [ -x "$tansu" ]; then
  start_tansu
  "$tansu" topic create lasthop.clicks --broker "tcp://127.0.0.1:$KPORT" --partitions 2 >/dev/null 2>&1 || true
  rm -rf "$work/processor-data"
  "$BIN/lasthop-control" clicks synth --kafka "127.0.0.1:$KPORT" --topic lasthop.clicks --events "$EVENTS" >/dev/null
  printf "  kafka:  "
  "$BIN/lasthop-control" clicks process --data-dir "$work/processor-data" --kafka "127.0.0.1:$KPORT" \
    --topic lasthop.clicks --exit-when-idle | dedup_cost
else
  echo "  kafka: skipped (tansu not installed: cargo install --locked tansu --features dynostore)"
fi
fi

if part 3; then
echo
echo "clicks part 3: the processor into ClickHouse, $EVENTS pre-filled events on 6 partitions"
if [ ! -x "$tansu" ] || [ ! -x /usr/sbin/clickhouse-server ]; then
  echo "  skipped: needs tansu and clickhouse-server (apt-get install clickhouse-server)"
  exit 0
fi
start_tansu
ch=$work/clickhouse
rm -rf "$ch"
mkdir -p "$ch"
cat >"$ch/config.xml" <<XML
<?xml version="1.0"?>
<yandex>
  <logger><level>warning</level><log>$ch/server.log</log><errorlog>$ch/error.log</errorlog><console>0</console></logger>
  <http_port>$CHPORT</http_port><tcp_port>$((CHPORT + 1))</tcp_port><listen_host>127.0.0.1</listen_host>
  <path>$ch/data/</path><tmp_path>$ch/tmp/</tmp_path><user_files_path>$ch/user_files/</user_files_path>
  <format_schema_path>$ch/format_schemas/</format_schema_path>
  <users_config>users.xml</users_config><default_profile>default</default_profile>
  <default_database>default</default_database><mark_cache_size>268435456</mark_cache_size>
</yandex>
XML
cat >"$ch/users.xml" <<XML
<?xml version="1.0"?>
<yandex><profiles><default></default></profiles>
<users><default><password></password><networks><ip>127.0.0.1</ip></networks><profile>default</profile><quota>default</quota></default></users>
<quotas><default></default></quotas></yandex>
XML
(cd "$ch" && exec /usr/sbin/clickhouse-server --config-file="$ch/config.xml" >/dev/null 2>&1) &
ch_pid=$!
for _ in $(seq 300); do curl -sf "http://127.0.0.1:$CHPORT/?query=SELECT+1" >/dev/null && break; sleep 0.1; done
echo "  clickhouse $(curl -s "http://127.0.0.1:$CHPORT/?query=SELECT+version()")"
topic=lasthop.clicks.ch
"$tansu" topic create "$topic" --broker "tcp://127.0.0.1:$KPORT" --partitions 6 >/dev/null 2>&1 || true
"$BIN/lasthop-control" clicks synth --kafka "127.0.0.1:$KPORT" --topic "$topic" --events "$EVENTS" >/dev/null
process() { # group store data-dir -> one JSON summary line
  "$BIN/lasthop-control" clicks process --data-dir "$3" --kafka "127.0.0.1:$KPORT" --topic "$topic" \
    --group "$1" --clicks-store "$2" --exit-when-idle 2>>"$work/ch-proc.log"
}
rm -rf "$work"/ch-proc-* "$work/ch-proc.log"
printf "  embedded, 1 processor:    "
process g-embedded embedded "$work/ch-proc-e" | field events_per_sec | awk '{printf "%.0f events/s\n", $1}'
printf "  clickhouse, 1 processor:  "
process g-one "clickhouse://127.0.0.1:$CHPORT/perf_one" "$work/ch-proc-1" | field events_per_sec |
  awk '{printf "%.0f events/s\n", $1}'
three=()
for i in 1 2 3; do
  process g-three "clickhouse://127.0.0.1:$CHPORT/perf_three" "$work/ch-proc-3$i" >"$work/ch-proc-3$i.json" &
  three+=($!)
done
wait "${three[@]}"
# All three started together: each one's first event came at wall - seconds, its end at wall.
agg=$(for i in 1 2 3; do
  j=$(cat "$work/ch-proc-3$i.json")
  echo "$(echo "$j" | field events) $(echo "$j" | field seconds) $(echo "$j" | field wall_seconds)"
done | awk '{ n += $1; if ($1 > 0) { s = $3 - $2; if (first == "" || s < first) first = s }; if ($3 > end) end = $3 }
  END { printf "%d events, %.2f s, %.0f events/s", n, end - first, (end > first) ? n / (end - first) : 0 }')
echo "  clickhouse, 3 processors: $agg (goal >= 200,000 events/s)"
counted=$(curl -s "http://127.0.0.1:$CHPORT/" --data-binary "SELECT sum(h) + sum(b) FROM (SELECT argMax(human, version) AS h, argMax(bot, version) AS b FROM perf_three.rollups WHERE day > 0 GROUP BY day, code, part)")
echo "  counted in ClickHouse by the three: $counted of $EVENTS events (duplicates and replays excluded)"
skips=$(grep "the broker skipped offsets" "$work/ch-proc.log" | sed -n 's/.*from=\([0-9]*\) to=\([0-9]*\).*/\1 \2/p' |
  awk '{ n += $2 - $1 } END { printf "%d warnings, %d offsets", NR, n }')
echo "  offsets the broker skipped at takeovers: $skips (tansu 0.6 answers a fetch inside a record batch with the next batch)"
# classify/mix: every rule; classify/mix_no_burst: the burst rule off (its per-network probe).
cargo bench -q -p lasthop-benches --bench clicks -- --noplot classify/mix 2>/dev/null |
  awk '/^clicks\/classify\// { name = $1 }
    /time:/ && !/%/ { for (i = 1; i <= NF; i++) if ($i == "time:") t = i
      printf "  classification per event (criterion %s): %s %s\n", name, $(t + 3), $(t + 4) }'
fi

if part 4; then
SOAK=${SOAK:-600}
RATE=${RATE:-80000}
echo
echo "clicks part 4: serve's processor under $RATE events/s for ${SOAK}s (embedded store, spool)"
data=$work/soak
rm -rf "$data"
mkdir -p "$data"
"$BIN/lasthop-control" keygen --out "$data/key" >/dev/null
# An operator's key: an owner's would meet the velocity hold on the 100 creates.
key=$("$BIN/lasthop-control" apikey create --data-dir "$data" --owner soak --admin 2>/dev/null)
api=127.0.0.1:$((PORT + 1)) edge=127.0.0.1:$((PORT + 2)) admin=127.0.0.1:$((PORT + 3))
"$BIN/lasthop-control" serve --data-dir "$data" --key-file "$data/key" --api-listen "$api" \
  --edge-listen "$edge" --dashboard-listen 127.0.0.1:0 --short-base "http://127.0.0.1:$PORT" \
  >"$work/soak-control.err" 2>&1 &
control=$!
soak_pids+=("$control")
wait_up soak-control "http://$api/healthz" -f
for i in $(seq 100); do
  curl -sf -X POST "http://$api/v1/links" -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
    -d "{\"long_url\":\"https://example.com/soak/$i\"}" -w '\n' | sed -n 's/.*"code":"\([^"]*\)".*/\1/p'
done | awk -v p="$PORT" '{print "http://127.0.0.1:" p "/" $1}' >"$work/soak-urls"
[ "$(wc -l <"$work/soak-urls")" -eq 100 ] || { echo "creating the soak links failed" >&2; exit 1; }
"$BIN/lasthop-engine" --key-file "$data/key" --control "http://$edge" --edge-token-file "$data/edge.token" \
  --data-dir "$data/engine" --click-spool "$data/clicks/spool" --listen "127.0.0.1:$PORT" \
  --admin-listen "$admin" --cores 1 >"$work/soak-engine.err" 2>&1 &
soak_pids+=($!)
wait_up soak-engine "http://$admin/readyz" -f
# Every link served by the engine before the load starts.
for _ in $(seq 100); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "$(tail -1 "$work/soak-urls")")" = 302 ] && break; sleep 0.1
done
sample() { # label
  local rss m
  rss=$(awk '/^VmRSS/ {print $2}' "/proc/$control/status")
  m=$(curl -s "http://$api/metrics")
  echo "$m" | awk -v l="$1" -v rss="$rss" '$1 == "lasthop_clicks_dedup_ids" {n = $2} $1 == "lasthop_clicks_dedup_bytes" {b = $2}
    $1 ~ /^lasthop_clicks_events_total/ {e += $2}
    END {printf "  %-8s control plane RSS %4.0f MB; events %d; dedup window %d ids in %d bytes (%.3f bytes an id)\n",
      l, rss / 1024, e, n, b, (n > 0) ? b / n : 0}'
}
sample start
h2load --h1 -c 8 -t 1 --rps $((RATE / 8)) -D "$SOAK" -i "$work/soak-urls" >"$work/soak-h2load.out" 2>&1 &
load=$!
soak_pids+=("$load")
for i in $(seq 10); do sleep $((SOAK / 10)); sample "$((i * SOAK / 10))s"; done
wait "$load" || true
awk '/^finished in/ || /^status codes:/' "$work/soak-h2load.out" | sed 's/^/  h2load: /'
fi

if part 5; then
echo
echo "clicks part 5: the archive consumer on $EVENTS pre-filled events, to file:// and to S3 (SeaweedFS on loopback)"
tools=${LASTHOP_S3TOOLS:-$HOME/.cache/lasthop/s3tools}
[ -x "$tools/bin/weed" ] || { echo "  skipped: SeaweedFS is not installed in $tools (scripts/test installs it)"; exit 0; }
synth_spool=$work/archive-spool
rm -rf "$synth_spool" "$work/archive-file" "$work/archive-s3" "$work/weed"
"$BIN/lasthop-control" clicks synth --spool "$synth_spool" --events "$EVENTS" >/dev/null
spool_bytes=$(du -sb "$synth_spool" | awk '{print $1}')
# One run of the sink: prints its summary line, and "events/CPU-s bytes/event" to fd 3.
sink() { # data-dir extra-flags...
  local data=$1; shift
  local t; t=$(mktemp)
  taskset -c 1 /usr/bin/time -f "%e %U %S" -o "$t" "$BIN/lasthop-control" clicks archive --data-dir "$data" \
    --spool "$synth_spool" --exit-when-idle "$@" 2>"$data.err" >"$data.out"
  local j; j=$(cat "$data.out")
  read -r wall user sys <"$t"; rm -f "$t"
  local n b; n=$(echo "$j" | field archived); b=$(echo "$j" | field bytes)
  awk -v n="$n" -v b="$b" -v u="$user" -v s="$sys" -v w="$wall" 'BEGIN {
    printf "%d events in %.2f s wall, %.2f CPU-s: %.0f events per sink CPU-second; %.1f Parquet bytes an event\n",
      n, w, u + s, n / (u + s), b / n }'
}
printf "  file://: "; sink "$work/archive-file"
sp=$((PORT + 10))
mkdir -p "$work/weed"
echo '{"identities":[{"name":"perf","credentials":[{"accessKey":"perf","secretKey":"perfsecret"}],"actions":["Admin","Read","List","Tagging","Write"]}]}' >"$work/weed/s3.json"
WEED_MASTER_VOLUME_GROWTH_COPY_1=1 taskset -c 0 "$tools/bin/weed" server -dir="$work/weed" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
  -master.port=$((sp + 1)) -volume.port=$((sp + 2)) -filer.port=$((sp + 3)) -master.port.grpc=$((sp + 11)) \
  -volume.port.grpc=$((sp + 12)) -filer.port.grpc=$((sp + 13)) -s3 -s3.port=$sp -s3.port.grpc=$((sp + 14)) \
  -s3.port.iceberg=0 -s3.port.lance=0 -s3.config="$work/weed/s3.json" -master.volumeSizeLimitMB=256 -volume.max=100 \
  -master.telemetry=false -master.electionTimeout=1s -volume.preStopSeconds=0 -volume.minFreeSpace=1GiB \
  >"$work/weed.log" 2>&1 &
weed=$!
soak_pids+=("$weed")
wait_up weed "http://127.0.0.1:$sp/"
for _ in $(seq 40); do
  "$tools/bin/python" -c "import boto3; boto3.client('s3', endpoint_url='http://127.0.0.1:$sp', region_name='us-east-1',
    aws_access_key_id='perf', aws_secret_access_key='perfsecret').create_bucket(Bucket='perf')" 2>/dev/null && break
  sleep 0.25
done
export AWS_ACCESS_KEY_ID=perf AWS_SECRET_ACCESS_KEY=perfsecret
s3flags=(--clicks-archive-url s3://perf/clicks --clicks-archive-endpoint "http://127.0.0.1:$sp")
printf "  s3://:   "; sink "$work/archive-s3" "${s3flags[@]}"
awk -v b="$spool_bytes" -v n="$EVENTS" 'BEGIN { printf "  spool (binary frames): %.1f bytes an event\n", b / n }'
day=$(date -u +%Y-%m-%d)
t=$(mktemp)
taskset -c 1 /usr/bin/time -f "%e %U %S" -o "$t" "$BIN/lasthop-control" clicks recompute --data-dir "$work/archive-s3" \
  --day "$day" "${s3flags[@]}" >"$work/recompute.out" 2>"$work/recompute.err"
read -r wall user sys <"$t"; rm -f "$t"
awk -v n="$(field events <"$work/recompute.out")" -v o="$(field objects <"$work/recompute.out")" -v u="$user" -v s="$sys" -v w="$wall" 'BEGIN {
  printf "  recompute of %s from S3: %d events from %d objects in %.2f s wall, %.2f CPU-s: %.0f events per CPU-second\n",
    "'"$day"'", n, o, w, u + s, n / (u + s) }'
cargo bench -q -p lasthop-benches --bench archive -- --test 2>&1 | sed -n 's/^archive bytes per event/  criterion archive: bytes per event/p'
fi
