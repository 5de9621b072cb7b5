#!/usr/bin/env bash
# Run one fuzz target for a number of seconds: `fuzz/run.sh TARGET SECONDS [LIBFUZZER_ARGS…]`.
#
# cargo-fuzz needs nightly-only rustc flags (-Zsanitizer, sanitizer coverage); the stable
# toolchain accepts them with RUSTC_BOOTSTRAP=1. No sanitizer: every workspace crate
# forbids unsafe code, and without AddressSanitizer a target runs about twice as fast.
# SENDIUM_FUZZ_DEV=1 uses the dev profile (what CI builds: it compiles with less CPU and
# runs slower). New inputs go to fuzz/work/TARGET (not committed); fuzz/corpus/TARGET
# is the committed seed corpus, read but never written. Crashes are saved in
# fuzz/artifacts/TARGET.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:?usage: fuzz/run.sh TARGET SECONDS [LIBFUZZER_ARGS...]}
seconds=${2:?usage: fuzz/run.sh TARGET SECONDS [LIBFUZZER_ARGS...]}
shift 2
profile=()
if [ -n "${SENDIUM_FUZZ_DEV:-}" ]; then
  profile=(--dev)
fi
mkdir -p "fuzz/work/$target" "fuzz/corpus/$target"
RUSTC_BOOTSTRAP=1 exec cargo fuzz run --sanitizer none "${profile[@]}" "$target" "fuzz/work/$target" \
  "fuzz/corpus/$target" -- -max_total_time="$seconds" -timeout=60 "$@"
