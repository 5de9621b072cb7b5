#!/usr/bin/env bash
# User-space instructions the gateway executes per message, counted by valgrind's
# callgrind: the figure to compare two builds by, where CPU time on a shared machine
# moves by 15% between runs. Each path runs twice under `sendium-bench` with the gateway
# under callgrind, with a small and a larger message count; the difference of the two
# totals divided by the difference of the counts leaves out start-up and shutdown.
#
# usage: scripts/bench-instructions.sh [smpp|http] [gateway binary]
#   smpp (default): the memory profile, phase 1 of 5,000 and of 15,000 SMPP messages
#   http: the HTTP phase (POST and POST + callback_url rows together), 2,000 and 6,000
#         messages per row, for the memory and the file-file-file+dlr-file gateways
# needs: valgrind, cargo build --release -p sendium-ops -p sendium-integration-tests
# The gateway runs about 30 times slower under callgrind, so its batches differ from a
# native run's: compare builds with this, not with the msgs/s of `just bench`.
set -euo pipefail
cd "$(dirname "$0")/.."
path=${1:-smpp}
gateway=$(realpath "${2:-target/release/sendium}")
bench=target/release/sendium-bench
command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cat >"$out/wrap.sh" <<EOF
#!/bin/sh
exec valgrind --tool=callgrind --callgrind-out-file="$out/\${CG_RUN}.%p" "$gateway" "\$@" 2>>"$out/valgrind.log"
EOF
chmod +x "$out/wrap.sh"

# Totals of the run's gateways, in the order they started, skipping `sendium --version`.
totals() {
  for f in $(ls "$out/$1".[0-9]* | sort -t. -k2 -n); do
    total=$(awk '/^(summary|totals):/ {print $2; exit}' "$f")
    [ "$total" -gt 100000000 ] && echo "$total"
  done
}

run() {
  local name=$1; shift
  CG_RUN=$name SENDIUM_BIN="$out/wrap.sh" "$bench" --ready-timeout-s 60 --phase-timeout-s 600 "$@" \
    >"$out/$name.log" 2>&1 || { cat "$out/$name.log" >&2; exit 1; }
}

case "$path" in
  smpp)
    run small --profile memory --count 5000 --latency-count 1000
    run large --profile memory --count 15000 --latency-count 1000
    paste <(totals small) <(totals large) | awk '{printf "SMPP, memory: %.0f instructions per message\n", ($2-$1)/10000}'
    ;;
  http)
    run small --http --http-messages 2000
    run large --http --http-messages 6000
    paste <(totals small) <(totals large) <(printf 'memory\nfile-file-file+dlr-file\n') |
      awk '{printf "HTTP, %s: %.0f instructions per message (POST and POST + callback_url)\n", $3, ($2-$1)/8000}'
    ;;
  *) echo "usage: $0 [smpp|http] [gateway binary]" >&2; exit 2 ;;
esac
