# Shell helpers shared by the perf/ scripts (sourced, not run). Servers are tracked in the
# global array `pids` (the first one is the process to stop; nginx's worker is added beside its
# master so its CPU time counts).

# Total utime+stime clock ticks of the given pids.
cpu_of() { local t=0; for p in "$@"; do t=$((t + $(awk '{print $14+$15}' /proc/$p/stat))); done; echo $t; }

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
  if [ -s "$work/links.snap" ] && [ "$(cat "$work/links.count" 2>/dev/null)" = "$links" ]; then
    return 0
  fi
  rm -f "$work/key"
  "$bin/lasthop-control" keygen --out "$work/key" >/dev/null
  "$bin/lasthop-snapshot" synth --key-file "$work/key" --count "$links" --out "$work/links.snap" \
    --codes-out "$work/codes" --tsv-out "$work/links.tsv" >/dev/null
  awk -F'\t' 'BEGIN{print "map $uri $lh_dest {\n  default \"\";"}
    $2 !~ /[$"\\;{}]/ && !seen[tolower($1)]++ {printf "  \"/%s\" \"%s\";\n", $1, $2; print $1 >"'"$work/codes.common"'"}
    END{print "}"}' "$work/links.tsv" >"$work/map.conf"
  echo "$links" >"$work/links.count"
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
