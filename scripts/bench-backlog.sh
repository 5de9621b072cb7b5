#!/usr/bin/env bash
# Backlog benchmark: fill the pending stage of a file/file/file gateway with N messages
# whose destination is unreachable, report the gateway's RSS, then SIGKILL it and time
# how long the restart takes to be ready again (GET /readyz = 200).
#
# usage: scripts/bench-backlog.sh [N=1000000]     (needs: cargo build --release --workspace)
#        KILL_DURING_FILL_S=4 scripts/bench-backlog.sh   (SIGKILL mid-fill instead)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-1000000}
bin=target/release
dir=$(mktemp -d)
cfg=$dir/sendium.toml
cat >"$cfg" <<TOML
[log]
level = "warn"
[sms.pending]
backend = "file"
max-messages = $((n + 1000))
[sms.router-queue]
backend = "file"
[sms.routed-work]
backend = "file"
[storage.file]
dir = "$dir/data"
[smpp]
listen = "127.0.0.1:12875"
window = 512
[[smpp.accounts]]
system-id = "bench"
password = "bench"
max-binds = 12
[admin]
listen = "127.0.0.1:19190"
[[destinations]]
name = "unreachable"
kind = "smpp"
host = "127.0.0.1"
port = 9
system-id = "x"
password = "x"
[[routes]]
name = "default"
to = ["unreachable"]
TOML
ready() { python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:19190/readyz', timeout=1)" 2>/dev/null; }
rss() { awk '/VmRSS|VmHWM/ {printf "%s %d MiB  ", $1, $2/1024}' "/proc/$1/status"; echo; }
$bin/sendium serve --config "$cfg" >"$dir/gw.log" 2>&1 &
pid=$!
until ready; do sleep 0.1; done
echo "filling the pending stage with $n messages (destination unreachable)..."
fill() {
  $bin/sendium-loadgen --addr 127.0.0.1:12875 --system-id bench --password bench --sessions 4 \
    --count "$n" --window 256 --no-receipts --receipt-timeout-s 1 --mix gsm=1 | grep -E "submit rate|elapsed|non-OK" || true
}
if [ -n "${KILL_DURING_FILL_S:-}" ]; then
  # SIGKILL while admissions are streaming in: the restart then also applies the
  # pending journal's frames written since the last checkpoint.
  fill >/dev/null 2>&1 &
  loadgen=$!
  sleep "$KILL_DURING_FILL_S"
  echo -n "gateway mid-fill, killed after ${KILL_DURING_FILL_S} s: "; rss $pid
  kill -9 $pid; wait $pid 2>/dev/null || true
  wait $loadgen 2>/dev/null || true
else
  fill
  sleep 2
  echo -n "gateway with the backlog: "; rss $pid
  du -sh "$dir/data"
  kill -9 $pid; wait $pid 2>/dev/null || true
fi
# Cold start: drop the page cache when allowed (root), so the restart reads from disk.
sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null && echo "(page cache dropped)" || true
start=$(date +%s.%N)
$bin/sendium serve --config "$cfg" >>"$dir/gw.log" 2>&1 &
pid=$!
until ready; do sleep 0.02; done
end=$(date +%s.%N)
echo "restart after SIGKILL with the backlog: ready in $(python3 -c "print(f'{$end-$start:.2f}')") s"
sleep 3
echo -n "restarted gateway: "; rss $pid
kill $pid; wait $pid 2>/dev/null || true
$bin/sendium inspect --config "$cfg"
rm -rf "$dir"
