# Sendium developer commands (https://github.com/casey/just: `cargo install just --locked`).
# Every recipe is a plain cargo command, so it also works without just.

# List the recipes.
default:
    @just --list

# Every test in the workspace (builds the sendium binary the black-box tests start).
test:
    cargo test --workspace

# Formatting check and clippy with warnings as errors.
lint:
    cargo fmt --all -- --check
    cargo clippy --workspace --all-targets -- -D warnings

# The quickstart: memory profile, simulated destination, one SMS over SMPP and one over HTTP.
run:
    cargo run --bin sendium -- demo

# Serve with a configuration file (release build).
serve config:
    cargo run --release --bin sendium -- serve --config {{config}}

# Benchmark the release binary per storage profile, e.g. `just bench --profile memory --markdown`.
bench *args:
    cargo build --release -p sendium-ops -p sendium-integration-tests
    ./target/release/sendium-bench {{args}}

# User-space instructions per message under callgrind (`smpp` or `http`), to compare two
# builds where CPU time is too noisy: `just bench-instructions smpp /path/to/other/sendium`.
bench-instructions path="smpp" *binary:
    cargo build --release -p sendium-ops -p sendium-integration-tests
    ./scripts/bench-instructions.sh {{path}} {{binary}}

# The container image (needs a container engine: docker or podman).
image:
    docker build --build-arg SENDIUM_GIT_COMMIT=$(git rev-parse --short=12 HEAD) -t sendium .

# SIGKILL at every failpoint for every supported profile.
crash-matrix:
    cargo test -p sendium-integration-tests --test crash -- --nocapture

# Power loss at every sync point of the file stores: each crash image (as synced, with a
# torn write, with unsynced writes reordered) reopened and checked. `SENDIUM_POWERLOSS=N`
# samples N sync points instead; `SENDIUM_POWERLOSS_SEED` changes the sample and the tears.
powerloss:
    cargo test --release -p sendium-storage --lib powerloss_every_sync_point -- --ignored --nocapture

# Interoperability with python-smpplib as the ESME.
interop:
    ./scripts/interop-smpplib.sh

# Fuzz one target for `seconds` with cargo-fuzz on stable (see docs/fuzzing.md), e.g. `just fuzz receipt_text 60`.
fuzz target seconds:
    ./fuzz/run.sh {{target}} {{seconds}}

# Soak: mixed SMPP and HTTP traffic with provider faults on file/file/file + file DLR,
# the gateway SIGKILLed and restarted every few minutes; checks delivery, receipts, RSS
# and descriptors at the end (see docs/soak.md).
soak minutes:
    cargo build --release -p sendium-ops -p sendium-integration-tests
    ./target/release/sendium-soak --minutes {{minutes}}
