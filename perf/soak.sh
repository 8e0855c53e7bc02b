#!/usr/bin/env bash
# The soak test of the whole system under faults (issue 47; docs/SOAK.md has a one-hour run).
#
# What runs, all on this host: the control plane (the embedded store; STORE=postgres: a
# PostgreSQL primary and its synchronous standby, the store and the replication both over TLS,
# sslmode=verify-full), two engines (io_uring, one core each: HTTP/1.1 in clear, HTTPS, HTTP/2
# and HTTP/3 on one TLS port, ECDSA P-256 for lh.test from a test CA; their clicks into one
# spool), the click processor on its own (`lasthop-clicks process`, rollups in ClickHouse, the
# raw archive as Parquet under its data directory, /metrics on its own port), and ClickHouse.
#
# The driver (benches/examples/soak.rs) starts the processes from the scripts this one writes,
# measures the capacity for CALIBRATE seconds and loads at FRACTION of it (or RATE requests a
# second) from paced connections with browser user agents, creates CREATES links a second,
# takes one down every second (and probes both engines for the 410), publishes a snapshot and
# sends the engines SIGHUP every minute, and every KILL_EVERY seconds SIGKILLs and restarts an
# engine, the control plane and the processor in turn. It samples every SAMPLE seconds into
# OUT/samples.csv, draws OUT/*.png and writes OUT/summary.md and OUT/summary.json with the
# verdicts; the script exits non-zero when one fails.
#
#   perf/soak.sh                          # DURATION=3600 (one hour), KILL_EVERY=600
#   DURATION=120 KILL_EVERY=30 perf/soak.sh
#   STORE=postgres perf/soak.sh
# Also: FRACTION (0.5), RATE (0: from the calibration), CALIBRATE (10), CREATES (5),
# SEED_LINKS (2000), SAMPLE (10), BASE_PORT (19400), OUT (WORK/out), KEEP=1 keeps WORK.
# CPUS=0 (a taskset list) runs everything on those CPUs, both engines on the first; by default
# engine A serves on CPU 0 and engine B on CPU 1.
set -euo pipefail
# CPUS: the whole run (databases and builds included) on those CPUs.
if [ -n "${CPUS:-}" ] && [ -z "${SOAK_PINNED:-}" ]; then
  SOAK_PINNED=1 exec taskset -c "$CPUS" "$0" "$@"
fi
cd "$(dirname "$0")/.."
. perf/lib.sh
DURATION=${DURATION:-3600}
KILL_EVERY=${KILL_EVERY:-600}
STORE=${STORE:-embedded}
BASE_PORT=${BASE_PORT:-19400}

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
need=()
command -v curl >/dev/null || need+=(curl)
command -v openssl >/dev/null || need+=(openssl)
[ -x /usr/sbin/clickhouse-server ] || need+=(clickhouse-server)
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need+=(fonts-dejavu-core)
if [ ${#need[@]} -gt 0 ]; then
  echo "soak.sh: installing ${need[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
cargo build --release -q -p lasthop-control -p lasthop-engine -p lasthop-clicks --bins
cargo build --release -q -p lasthop-benches --example soak
BIN=$PWD/target/release

work=$(mktemp -d /var/tmp/lasthop-soak.XXXXXX)
OUT=${OUT:-$work/out}
mkdir -p "$OUT" "$work/logs"
ch_pid=
cleanup() {
  [ -n "$ch_pid" ] && kill "$ch_pid" 2>/dev/null
  pg_pair_stop
  wait 2>/dev/null || true
  if [ -n "${KEEP:-}" ]; then echo "soak.sh: kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

p=$BASE_PORT
api=127.0.0.1:$p edge=127.0.0.1:$((p + 1)) pm=127.0.0.1:$((p + 2))
ch_http=$((p + 3)) ch_tcp=$((p + 4)) pg_port=$((p + 5))
a_http=127.0.0.1:$((p + 10)) a_tls=127.0.0.1:$((p + 11)) a_admin=127.0.0.1:$((p + 12))
b_http=127.0.0.1:$((p + 20)) b_tls=127.0.0.1:$((p + 21)) b_admin=127.0.0.1:$((p + 22))

# Keys, the engines' certificate.
"$BIN/lasthop-control" keygen --out "$work/key" >/dev/null
tls_cert "$work" 127.0.0.1

# The store.
store_args=()
if [ "$STORE" = postgres ]; then
  pg_pair "$work" "$pg_port"
  mkdir -p "$work/pgpki"
  tls_cert "$work/pgpki" 127.0.0.1
  # TLS on both servers (the standby is a copy of the primary: it gets the same files), and
  # only TLS from anyone, replication included; the standby reconnects with sslmode=require.
  for node in primary standby; do
    d=$PG_DIR/$node
    cp "$work/pgpki/srv.pem" "$d/server.pem"
    cp "$work/pgpki/srv.key" "$d/server.key"
    [ "$(id -u)" = 0 ] && chown postgres:postgres "$d/server.pem" "$d/server.key"
    chmod 600 "$d/server.key"
    printf "ssl = on\nssl_cert_file = 'server.pem'\nssl_key_file = 'server.key'\n" |
      "${PG_AS[@]}" tee -a "$d/postgresql.conf" >/dev/null
    { printf 'hostnossl all all 0.0.0.0/0 reject\nhostnossl replication all 0.0.0.0/0 reject\n'; cat "$d/pg_hba.conf"; } >"$work/hba"
    "${PG_AS[@]}" tee "$d/pg_hba.conf" <"$work/hba" >/dev/null
  done
  "${PG_AS[@]}" sed -i "s/^primary_conninfo = '\(.*\)'/primary_conninfo = '\1 sslmode=require'/" \
    "$PG_DIR/standby/postgresql.auto.conf"
  for node in primary standby; do
    "${PG_AS[@]}" "$PG_BIN/pg_ctl" -D "$PG_DIR/$node" -l "$PG_DIR/$node.log" -w restart >/dev/null
  done
  state=
  for _ in $(seq 100); do
    state=$(PGSSLMODE=require pg_sql "SELECT sync_state || ' ' || ssl FROM pg_stat_replication JOIN pg_stat_ssl USING (pid)" 2>/dev/null || true)
    [ "$state" = "sync true" ] && break
    sleep 0.1
  done
  [ "$state" = "sync true" ] || { echo "soak.sh: the standby is not synchronous over TLS ($state)" >&2; exit 1; }
  PGSSLMODE=require pg_sql "CREATE DATABASE lasthop"
  url="postgres://postgres@127.0.0.1:$pg_port,127.0.0.1:$((pg_port + 1))/lasthop?target_session_attrs=read-write&sslmode=verify-full&sslrootcert=$work/pgpki/ca.pem"
  "$BIN/lasthop-control" migrate --store "$url" >/dev/null
  store_args=(--store "$url")
  echo "soak.sh: PostgreSQL primary :$pg_port, synchronous standby :$((pg_port + 1)), TLS (verify-full)"
fi
store_flag=
[ "$STORE" = postgres ] && store_flag="--store '$url'"
keys_at=(--data-dir "$work/control" "${store_args[@]}")
owner=$("$BIN/lasthop-control" apikey create "${keys_at[@]}" --owner soak 2>/dev/null)
admin=$("$BIN/lasthop-control" apikey create "${keys_at[@]}" --owner ops --admin 2>/dev/null)

# ClickHouse for the rollups (the processor writes, nothing else reads while it runs).
mkdir -p "$work/ch"
cat >"$work/ch/config.xml" <<XML
<?xml version="1.0"?>
<clickhouse>
  <logger><level>warning</level><log>$work/ch/server.log</log><errorlog>$work/ch/error.log</errorlog><console>0</console></logger>
  <http_port>$ch_http</http_port>
  <tcp_port>$ch_tcp</tcp_port>
  <listen_host>127.0.0.1</listen_host>
  <path>$work/ch/data/</path>
  <tmp_path>$work/ch/tmp/</tmp_path>
  <user_files_path>$work/ch/user_files/</user_files_path>
  <format_schema_path>$work/ch/format_schemas/</format_schema_path>
  <users_config>users.xml</users_config>
  <default_profile>default</default_profile>
  <default_database>default</default_database>
  <mark_cache_size>67108864</mark_cache_size>
  <uncompressed_cache_size>0</uncompressed_cache_size>
</clickhouse>
XML
cat >"$work/ch/users.xml" <<XML
<?xml version="1.0"?>
<clickhouse>
  <profiles><default></default></profiles>
  <users><default><password></password><networks><ip>127.0.0.1</ip></networks><profile>default</profile><quota>default</quota></default></users>
  <quotas><default></default></quotas>
</clickhouse>
XML
(cd "$work/ch" && exec /usr/sbin/clickhouse-server --config-file="$work/ch/config.xml" >/dev/null 2>&1) &
ch_pid=$!
for _ in $(seq 600); do [ "$(curl -s "http://127.0.0.1:$ch_http/?query=SELECT%201" || true)" = 1 ] && break; sleep 0.1; done
curl -sf "http://127.0.0.1:$ch_http/" --data-binary "CREATE DATABASE IF NOT EXISTS lasthop" >/dev/null
echo "$ch_pid" >"$work/ch/pid"

# One start script a process: each execs its program, appending to its log.
cat >"$work/start-control.sh" <<SH
exec "$BIN/lasthop-control" serve --data-dir "$work/control" --key-file "$work/key" $store_flag \\
  --api-listen $api --edge-listen $edge --short-base http://lh.test --create-rate 0 --clicks off \\
  >>"$work/logs/control.log" 2>&1
SH
if [ -n "${CPUS:-}" ]; then
  cpu_a=${CPUS%%[,-]*} cpu_b=${CPUS%%[,-]*}
else
  cpu_a=0 cpu_b=$(($(nproc) > 1 ? 1 : 0))
fi
engine_script() {
  local name=$1 http=$2 tls=$3 adm=$4 cpu=$5
  cat >"$work/start-$name.sh" <<SH
exec "$BIN/lasthop-engine" --key-file "$work/key" --control http://$edge \\
  --edge-token-file "$work/control/edge.token" --data-dir "$work/$name" --engine-id soak-$name \\
  --listen $http --admin-listen $adm --tls-listen $tls --cert "$work/srv.pem" --key "$work/srv.key" \\
  --no-ktls --cores 1 --cpus $cpu --click-spool "$work/spool" --click-flush-ms 50 --report-url http://$api \\
  >>"$work/logs/$name.log" 2>&1
SH
}
engine_script engine-a "$a_http" "$a_tls" "$a_admin" "$cpu_a"
engine_script engine-b "$b_http" "$b_tls" "$b_admin" "$cpu_b"
cat >"$work/start-processor.sh" <<SH
exec "$BIN/lasthop-clicks" process --data-dir "$work/processor" --spool "$work/spool" \\
  --clicks-store clickhouse://127.0.0.1:$ch_http/lasthop --metrics-listen $pm \\
  >>"$work/logs/processor.log" 2>&1
SH
mkdir -p "$work/spool"

watch='[{"name": "clickhouse", "pidfile": "'$work/ch/pid'"}'
[ "$STORE" = postgres ] && watch+=', {"name": "postgres-primary", "pidfile": "'$PG_DIR/primary/postmaster.pid'"}, {"name": "postgres-standby", "pidfile": "'$PG_DIR/standby/postmaster.pid'"}'
watch+=']'
cat >"$work/soak.json" <<JSON
{
  "duration": $DURATION, "kill_every": $KILL_EVERY, "sample_secs": ${SAMPLE:-10},
  "fraction": ${FRACTION:-0.5}, "rate": ${RATE:-0}, "calibrate_secs": ${CALIBRATE:-10},
  "creates_per_sec": ${CREATES:-5}, "seed_links": ${SEED_LINKS:-2000},
  "publish_every": 60, "hup_every": 60,
  "host": "lh.test", "api": "$api", "owner_key": "$owner", "admin_key": "$admin",
  "control": {"name": "control", "start": "$work/start-control.sh", "log": "$work/logs/control.log"},
  "engines": [
    {"name": "engine-a", "start": "$work/start-engine-a.sh", "log": "$work/logs/engine-a.log",
     "http": "$a_http", "tls": "$a_tls", "admin": "$a_admin"},
    {"name": "engine-b", "start": "$work/start-engine-b.sh", "log": "$work/logs/engine-b.log",
     "http": "$b_http", "tls": "$b_tls", "admin": "$b_admin"}
  ],
  "processor": {"name": "processor", "start": "$work/start-processor.sh", "log": "$work/logs/processor.log", "metrics": "$pm"},
  "clickhouse": "http://127.0.0.1:$ch_http/", "clickhouse_db": "lasthop",
  "watch": $watch,
  "out": "$OUT"
}
JSON
echo "soak.sh: $(nproc) CPUs${CPUS:+ (on $CPUS)}; store $STORE; DURATION=$DURATION s, a kill every $KILL_EVERY s; work $work, out $OUT"
set +e
"$BIN/examples/soak" "$work/soak.json"
rc=$?
set -e
cp "$work"/logs/*.log "$OUT/" 2>/dev/null || true
echo "soak.sh: summary $OUT/summary.md (exit $rc)"
exit $rc
