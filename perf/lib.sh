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
