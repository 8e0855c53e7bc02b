# Shell helpers shared by the perf/ scripts (sourced, not run). Servers are tracked in the
# global array `pids` (the first one is the process to stop; nginx's worker is added beside its
# master so its CPU time counts).

# Total utime+stime clock ticks of the given pids.
cpu_of() { local t=0; for p in "$@"; do t=$((t + $(awk '{print $14+$15}' /proc/$p/stat))); done; echo $t; }

# tls_cert WORK ADDR: a test CA (WORK/ca.pem) and an ECDSA P-256 server certificate for
# lh.test and ADDR signed by it (WORK/srv.pem, WORK/srv.key), with the openssl CLI.
tls_cert() {
  local work=$1 addr=$2
  (cd "$work" &&
    openssl req -x509 -nodes -days 2 -subj "/CN=perf CA" -newkey ec -pkeyopt ec_paramgen_curve:P-256 \
      -keyout ca.key -out ca.pem 2>/dev/null &&
    openssl req -nodes -subj /CN=lh.test -newkey ec -pkeyopt ec_paramgen_curve:P-256 \
      -keyout srv.key -out srv.csr 2>/dev/null &&
    echo "subjectAltName=DNS:lh.test,IP:$addr" >san.ext &&
    openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile san.ext \
      -out srv.pem 2>/dev/null)
}

# tls_chain WORK ALG: a root, an intermediate and a leaf for lh.test and 127.0.0.1 in the
# profile of a public CA's (Let's Encrypt's, say): SKI/AKI, key usages, serverAuth, an OCSP and
# CA-issuers AIA, a CRL distribution point, a policy, and two embedded SCTs' worth of opaque
# bytes (random, as signatures are: they do not compress). ALG: ecdsa (P-256 throughout) or
# rsa (RSA-2048). Writes WORK/chain-ALG.pem (leaf, then intermediate) and WORK/leaf-ALG.key.
tls_chain() {
  local work=$1 alg=$2 newkey
  case $alg in
    ecdsa) newkey=(-newkey ec -pkeyopt ec_paramgen_curve:P-256) ;;
    rsa) newkey=(-newkey rsa:2048) ;;
  esac
  (cd "$work" &&
    openssl req -x509 -nodes -days 30 -subj "/C=US/O=lasthop perf/CN=lasthop perf Root X1" \
      "${newkey[@]}" -keyout "root-$alg.key" -out "root-$alg.pem" 2>/dev/null &&
    openssl req -nodes -subj "/C=US/O=lasthop perf/CN=E1" "${newkey[@]}" \
      -keyout "int-$alg.key" -out "int-$alg.csr" 2>/dev/null &&
    cat >"int-$alg.ext" <<EXT &&
basicConstraints=critical,CA:TRUE,pathlen:0
keyUsage=critical,digitalSignature,keyCertSign,cRLSign
extendedKeyUsage=serverAuth,clientAuth
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid
authorityInfoAccess=caIssuers;URI:http://x1.i.lasthop.test/
crlDistributionPoints=URI:http://x1.c.lasthop.test/
certificatePolicies=2.23.140.1.2.1
EXT
    openssl x509 -req -in "int-$alg.csr" -CA "root-$alg.pem" -CAkey "root-$alg.key" \
      -CAcreateserial -days 30 -extfile "int-$alg.ext" -out "int-$alg.pem" 2>/dev/null &&
    openssl req -nodes -subj /CN=lh.test "${newkey[@]}" -keyout "leaf-$alg.key" \
      -out "leaf-$alg.csr" 2>/dev/null &&
    cat >"leaf-$alg.ext" <<EXT &&
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature$([ "$alg" = rsa ] && echo ,keyEncipherment)
extendedKeyUsage=serverAuth
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid
subjectAltName=DNS:lh.test,IP:127.0.0.1
authorityInfoAccess=OCSP;URI:http://e1.o.lasthop.test,caIssuers;URI:http://e1.i.lasthop.test/
certificatePolicies=2.23.140.1.2.1
1.3.6.1.4.1.11129.2.4.2=DER:0481F0$(openssl rand -hex 240)
EXT
    openssl x509 -req -in "leaf-$alg.csr" -CA "int-$alg.pem" -CAkey "int-$alg.key" \
      -CAcreateserial -days 7 -extfile "leaf-$alg.ext" -out "leaf-$alg.pem" 2>/dev/null &&
    cat "leaf-$alg.pem" "int-$alg.pem" >"chain-$alg.pem")
}

# The median of the numbers on stdin (one per line or space separated).
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END{print (NR%2)? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

# wait_up NAME URL [CURL_ARGS...]: polls URL for up to a minute (nginx parses a 1M-entry map at
# start); on success adds nginx's worker to `pids`, on failure prints NAME's log from $work.
wait_up() {
  local name=$1 url=$2; shift 2
  for _ in $(seq 1200); do
    if curl -s -o /dev/null "$@" "$url"; then
      [ "$name" = nginx ] && pids+=($(pgrep -P "${pids[0]}" || true))
      return 0
    fi
    sleep 0.05
  done
  echo "$name did not start" >&2; cat "$work/$name.err" 2>/dev/null >&2; return 1
}

# Stops the server in `pids`.
stop_server() {
  [ ${#pids[@]} -gt 0 ] || return 0
  kill "${pids[0]}" 2>/dev/null || true
  wait "${pids[0]}" 2>/dev/null || true
  pids=()
}

# synth_links BIN WORK LINKS: a LINKS-link snapshot (WORK/links.snap, key WORK/key), and nginx's
# `map` of the same links (WORK/map.conf), kept between runs of the same size. nginx's map keys
# compare case-insensitively, so it keeps one of each rare pair of codes that differ only in case
# and skips any URL nginx would interpret ($ variables, quotes); WORK/codes.common holds the codes
# nginx has, which is what wrk draws from for every server.
synth_links() {
  local bin=$1 work=$2 links=$3
  # LAYOUT=paged: the snapshot in the paged layout (default compact, the writer's default);
  # the cached file is reused only for the same count, layout and format.
  local layout=${LAYOUT:-compact}
  local stamp="$links $layout v2"
  if [ -s "$work/links.snap" ] && [ "$(cat "$work/links.count" 2>/dev/null)" = "$stamp" ]; then
    return 0
  fi
  rm -f "$work/key"
  "$bin/lasthop-control" keygen --out "$work/key" >/dev/null
  "$bin/lasthop-snapshot" synth --key-file "$work/key" --count "$links" --out "$work/links.snap" \
    --codes-out "$work/codes" --tsv-out "$work/links.tsv" --layout "$layout" >/dev/null
  awk -F'\t' 'BEGIN{print "map $uri $lh_dest {\n  default \"\";"}
    $2 !~ /[$"\\;{}]/ && !seen[tolower($1)]++ {printf "  \"/%s\" \"%s\";\n", $1, $2; print $1 >"'"$work/codes.common"'"}
    END{print "}"}' "$work/links.tsv" >"$work/map.conf"
  echo "$stamp" >"$work/links.count"
}

# nginx_conf WORK PORT: WORK/nginx.conf, one worker pinned to CPU 0 answering 302 from
# WORK/map.conf (see synth_links) and 404 for anything else, on 127.0.0.1:PORT.
nginx_conf() {
  local work=$1 PORT=$2
  cat >"$work/nginx.conf" <<NGX
worker_processes 1;
worker_cpu_affinity 01;
daemon off;
pid $work/nginx.pid;
error_log $work/nginx.err warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  map_hash_max_size 4194304;
  map_hash_bucket_size 256;
  include $work/map.conf;
  server {
    listen 127.0.0.1:$PORT reuseport;
    location / {
      if (\$lh_dest = "") { return 404; }
      return 302 \$lh_dest;
    }
  }
}
NGX
}

# crypto_floor NAME [CPU]: handshakes per second on one core (CPU, default 0: where the perf
# scripts pin their servers) of `cargo bench --bench handshake`'s `handshake/NAME` (`full`: a
# full TLS 1.3 handshake's server crypto; `resumed_psk_dhe`: a TLS 1.3 psk_dhe resumption's),
# criterion's median over a short run (1 s warm-up, 3 s measured). Build the bench first
# (`cargo bench --no-run -p lasthop-benches --bench handshake`), or the first call compiles it.
crypto_floor() {
  taskset -c "${2:-0}" cargo bench -q -p lasthop-benches --bench handshake -- --noplot \
    --warm-up-time 1 --measurement-time 3 "handshake/$1\$" 2>/dev/null |
    awk '/time:/ && !/%/ && !done { for (i = 1; i <= NF; i++) if ($i == "time:") t = i
      v = $(t + 3); u = $(t + 4); s = (u == "ns") ? 1e-9 : (u == "µs" || u == "us") ? 1e-6 : 1e-3
      rate = 1 / (v * s); done = 1 }
      END { if (done) printf "%.0f", rate }'
  # (awk reads to the end: a pipe closed early would fail the bench's next println.)
}

# pg_pair WORK [PORT]: a PostgreSQL primary and a synchronous streaming standby from Debian's
# `postgresql` package (installed if missing), in WORK/pg (initdb, pg_basebackup; as the
# postgres user when root; no system service), on 127.0.0.1:PORT and PORT+1, with
# synchronous_commit=on and synchronous_standby_names='*': a commit returns once the standby
# has it on disk. Sets PG_BIN and PG_PORT; `pg_url DB` prints the multi-host connection string
# (target_session_attrs=read-write), `pg_sql SQL` runs SQL on the primary, `pg_pair_stop` stops
# both servers.
pg_pair() {
  local work=$1
  PG_PORT=${2:-15432}
  PG_BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
  if [ ! -x "$PG_BIN/initdb" ]; then
    # The binaries only: no default cluster, no system service.
    mkdir -p /etc/postgresql-common
    [ -f /etc/postgresql-common/createcluster.conf ] ||
      echo "create_main_cluster = false" >/etc/postgresql-common/createcluster.conf
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      -o Dpkg::Options::=--force-confold postgresql >/dev/null
    PG_BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
  fi
  PG_AS=()
  [ "$(id -u)" = 0 ] && PG_AS=(runuser -u postgres --)
  PG_DIR=$work/pg
  # mktemp -d makes 0700 folders: the postgres user must reach its own.
  chmod 755 "$work"
  mkdir -p "$PG_DIR"
  [ "$(id -u)" = 0 ] && chown -R postgres:postgres "$PG_DIR"
  "${PG_AS[@]}" "$PG_BIN/initdb" -D "$PG_DIR/primary" -U postgres --auth=trust -E UTF8 \
    --locale=C.UTF-8 >/dev/null
  "${PG_AS[@]}" tee -a "$PG_DIR/primary/postgresql.conf" >/dev/null <<CONF
port = $PG_PORT
listen_addresses = '127.0.0.1'
unix_socket_directories = '$PG_DIR'
fsync = on
synchronous_commit = on
synchronous_standby_names = '*'
wal_level = replica
max_wal_senders = 5
max_connections = 100
shared_buffers = 256MB
CONF
  echo "host replication postgres 127.0.0.1/32 trust" |
    "${PG_AS[@]}" tee -a "$PG_DIR/primary/pg_hba.conf" >/dev/null
  "${PG_AS[@]}" "$PG_BIN/pg_ctl" -D "$PG_DIR/primary" -l "$PG_DIR/primary.log" -w start >/dev/null
  "${PG_AS[@]}" "$PG_BIN/pg_basebackup" -h 127.0.0.1 -p "$PG_PORT" -U postgres -X stream -R \
    -c fast -D "$PG_DIR/standby"
  "${PG_AS[@]}" tee -a "$PG_DIR/standby/postgresql.conf" >/dev/null <<CONF
port = $((PG_PORT + 1))
unix_socket_directories = '$PG_DIR'
hot_standby = on
CONF
  "${PG_AS[@]}" "$PG_BIN/pg_ctl" -D "$PG_DIR/standby" -l "$PG_DIR/standby.log" -w start >/dev/null
  local state=
  for _ in $(seq 100); do
    state=$(pg_sql "SELECT sync_state FROM pg_stat_replication" 2>/dev/null || true)
    [ "$state" = sync ] && break
    sleep 0.1
  done
  [ "$state" = sync ] || { echo "the standby did not become synchronous ($state)" >&2; return 1; }
}

pg_sql() { "$PG_BIN/psql" -X -A -t -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U postgres -d "${PG_DB:-postgres}" -c "$1"; }

pg_url() { echo "postgres://postgres@127.0.0.1:$PG_PORT,127.0.0.1:$((PG_PORT + 1))/$1?target_session_attrs=read-write"; }

pg_pair_stop() {
  [ -n "${PG_DIR:-}" ] || return 0
  for node in standby primary; do
    [ -d "$PG_DIR/$node" ] && "${PG_AS[@]}" "$PG_BIN/pg_ctl" -D "$PG_DIR/$node" -m fast -w stop >/dev/null 2>&1
  done
  PG_DIR=
}
