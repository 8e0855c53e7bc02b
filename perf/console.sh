#!/usr/bin/env bash
# The console's heaviest page: a link with a year of daily stats. Fills a real control plane's
# click processor with EVENTS synthetic clicks spread over 366 days for one real link, signs in
# to the console (--dashboard-listen) as its owner, then times ROUNDS loads of the link page for
# the whole year (curl's time to the last byte, loopback), beside the stats API call it makes
# (the JSON the page is rendered from) and the links list. Prints medians. The processor runs
# with a grace longer than the year, so every synthetic day is counted as it streams in (with the
# default 2-hour grace, past days' events are archived for a recompute instead).
#
#   EVENTS=300000 ROUNDS=30 BIN=target/release perf/console.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release}
EVENTS=${EVENTS:-300000}
ROUNDS=${ROUNDS:-30}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
"$BIN/lasthop-control" keygen --out "$work/key" >/dev/null
KEY=$("$BIN/lasthop-control" apikey create --data-dir "$work/data" --owner perf 2>/dev/null)
"$BIN/lasthop-control" serve --data-dir "$work/data" --key-file "$work/key" \
  --api-listen 127.0.0.1:0 --edge-listen 127.0.0.1:0 --dashboard-listen 127.0.0.1:0 \
  --clicks-flush-ms 200 --clicks-grace-secs 40000000 --clicks-archive-days 400 \
  >"$work/listen" 2>"$work/log" &
for _ in $(seq 100); do [ "$(wc -l <"$work/listen")" -ge 3 ] && break; sleep 0.1; done
API=$(sed -n 's/^api listening on //p' "$work/listen")
DASH=$(sed -n 's/^dashboard listening on //p' "$work/listen")
CODE=$(curl -sf -X POST "$API/v1/links" -H "Authorization: Bearer $KEY" \
  -H 'Content-Type: application/json' -d '{"long_url":"https://example.com/a-year"}' |
  sed -n 's/.*"code":"\([^"]*\)".*/\1/p')
"$BIN/lasthop-control" clicks synth --spool "$work/data/clicks/spool" --events "$EVENTS" \
  --code "$CODE" --days 366 --visitors 20000 >/dev/null
FROM=$(date -u -d '365 days ago' +%F)
TO=$(date -u +%F)
want=$(( EVENTS * 80 / 100 ))
for _ in $(seq 240); do
  n=$(curl -sf "$API/v1/links/$CODE/stats?from=$FROM&to=$TO" -H "Authorization: Bearer $KEY" |
    sed -n 's/^{.*"clicks":\([0-9]*\).*/\1/p' | head -1)
  [ "${n:-0}" -ge "$want" ] && break
  sleep 0.5
done
days=$(curl -sf "$API/v1/links/$CODE/stats?from=$FROM&to=$TO" -H "Authorization: Bearer $KEY" |
  grep -o '"day":' | wc -l)
# Sign in as the owner (the sign-in form's CSRF cookie, then the session cookie).
curl -sf -c "$work/cj" "$DASH/signin" -o "$work/signin.html"
csrf=$(grep -o 'name="csrf" value="[0-9a-f]*"' "$work/signin.html" | sed 's/.*value="//;s/"//')
curl -sf -b "$work/cj" -c "$work/cj" -X POST "$DASH/signin" --data-urlencode "key=$KEY" \
  --data-urlencode "csrf=$csrf" -o /dev/null
median() { sort -n | awk '{a[NR]=$1} END {printf "%.1f", (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2) * 1000}'; }
time_it() { for _ in $(seq "$ROUNDS"); do curl -sf -o /dev/null -w '%{time_total}\n' "$@"; done | median; }
page=$(time_it -b "$work/cj" "$DASH/links/$CODE?from=$FROM&to=$TO")
stats=$(time_it "$API/v1/links/$CODE/stats?from=$FROM&to=$TO" -H "Authorization: Bearer $KEY")
list=$(time_it -b "$work/cj" "$DASH/links")
bytes=$(curl -sf -b "$work/cj" "$DASH/links/$CODE?from=$FROM&to=$TO" | wc -c)
echo "link page with $days days of stats ($EVENTS events): median ${page} ms ($bytes bytes; goal < 100 ms)"
echo "  the stats API call it renders from: median ${stats} ms; the links list: median ${list} ms"
