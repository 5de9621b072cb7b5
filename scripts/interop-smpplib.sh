#!/usr/bin/env bash
# Interoperability check against python-smpplib (PyPI), an SMPP implementation that is
# not ours: run the gateway on its embedded quickstart configuration (simulated
# destination) on free local ports, bind with smpplib, send short and multipart
# messages, and check that every acknowledged part gets its own receipt.
#
# Needs python3 with venv and network access to PyPI the first time (the venv is kept
# in target/interop-venv).
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/interop-venv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/python" -c "import smpplib" 2>/dev/null || "$venv/bin/pip" install --quiet "smpplib==2.2.4"

cargo build --quiet --bin sendium
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
smpp=$(free_port); http=$(free_port); admin=$(free_port)
log=$(mktemp)
SENDIUM__SMPP__LISTEN="127.0.0.1:$smpp" SENDIUM__HTTP__LISTEN="127.0.0.1:$http" \
  SENDIUM__ADMIN__LISTEN="127.0.0.1:$admin" ./target/debug/sendium serve >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 1 100); do
  if python3 -c "import urllib.request,sys; urllib.request.urlopen(\"http://127.0.0.1:$admin/readyz\", timeout=1)" 2>/dev/null; then break; fi
  sleep 0.1
done
if ! "$venv/bin/python" scripts/smpplib_interop.py 127.0.0.1 "$smpp" demo demo; then
  echo "--- gateway log ---"; cat "$log"; exit 1
fi
