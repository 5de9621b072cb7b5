//! `sendium-bench`: the benchmark driver. Prints figures; it is not a pass/fail test.
//!
//! For every storage profile it starts the real (release) `sendium` binary on loopback with
//! the kit's test SMSC as its only destination, then drives it with the kit's load
//! generator in two phases:
//!
//! 1. **throughput**: `--sessions` transceivers × `--window` outstanding submits at full
//!    speed, `--count` messages mixing GSM, UCS2 and 3-part multipart, every message asking
//!    for a receipt; messages/s is end to end (first submit → last receipt back at the ESME).
//! 2. **latency**: the same at half the phase-1 rate for `--latency-count` messages;
//!    `submit_sm_resp` p50/p99.
//!
//! Around each phase it samples the gateway from `/proc/<pid>/status` (VmHWM, VmRSS; the
//! peak is reset through `/proc/<pid>/clear_refs` before each phase where the kernel allows
//! it) and `/proc/<pid>/stat` (utime + stime), and prints one row per profile and phase.
//!
//! `--rounds N` runs the whole list N times, profile after profile in each round (so two
//! profiles alternate through the machine's slow and quiet minutes), and adds the
//! median and range per profile and phase: on a shared VM one run says little about a
//! tail latency.
//!
//! ```text
//! sendium-bench [--profile NAME]... [--include-unsupported] [--pg-url URL] [--list]
//!               [--count 200000] [--latency-count 100000] [--latency-rate MSG_PER_S]
//!               [--sessions 4] [--window 256] [--mix gsm=8,ucs2=1,multipart=1]
//!               [--receipt-delay-ms 20] [--threads N] [--phase-timeout-s 300]
//!               [--ready-timeout-s 30] [--rounds 1] [--show-config] [--markdown | --json]
//!               [--outbox] [--outbox-rows 1000000] [--outbox-partitions 4] [--outbox-batch 1000]
//!               [--trickle-rate 1000] [--trickle-seconds 20]
//!               [--flood] [--flood-messages 100000] [--flood-pairs 5]
//!               [--http] [--http-messages 200000] [--http-clients 50]
//!               [--mo] [--mo-messages 100000]
//! ```
//!
//! The outbox phase (`bench/outbox.rs`) runs after the profiles of each round: by
//! default, or alone with `--outbox` and no `--profile`. The flood phase
//! (`bench/flood.rs`) runs with `--flood` (alone without `--profile`). The HTTP phase
//! (`bench/http_phase.rs`: `POST /v1/messages` with and without `callback_url`, on the
//! memory and file-file-file+dlr-file profiles; msgs/s and the gateway's CPU per message)
//! runs by default, or alone with `--http` and no `--profile`. The inbound phase
//! (`bench/mo.rs`: mobile-originated messages from the test SMSC to a bound ESME, on the
//! memory and file-file-file+dlr-file profiles) likewise, or alone with `--mo`.
//!
//! The gateway binary is `$SENDIUM_BIN`, else `sendium` next to this executable (so
//! `./target/release/sendium-bench` uses `./target/release/sendium`). Build both with
//! `cargo build --release -p sendium-ops -p sendium-integration-tests`, or run `just bench`.
//!
//! Exit status: 0 when every selected profile ran both phases with every receipt back and
//! no error (or was skipped / refused as expected), 1 otherwise, 2 for bad usage.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use sendium_integration_tests::gateway::{self, GatewayProcess};
use sendium_integration_tests::http;
use sendium_integration_tests::loadgen::{self, LoadConfig, LoadReport, Mix};
use sendium_integration_tests::pgstats::{PgCost, PgProbe};
use sendium_integration_tests::smsc::{SmscConfig, SmscStats, TestSmsc};
use sendium_storage::postgresql::test_cluster::TestCluster;
use serde_json::{Value, json};

#[path = "../bench/flood.rs"]
mod flood;
#[path = "../bench/http_destination.rs"]
mod http_destination;
#[path = "../bench/http_phase.rs"]
mod http_phase;
#[path = "../bench/mo.rs"]
mod mo;
#[path = "../bench/outbox.rs"]
mod outbox;
#[path = "../bench/rate_run.rs"]
mod rate_run;

const USAGE: &str = "usage: sendium-bench [--profile NAME]... [--include-unsupported] [--pg-url URL] [--list]
                     [--count N] [--latency-count N] [--latency-rate MSG_PER_S]
                     [--sessions N] [--window N] [--mix gsm=8,ucs2=1,multipart=1]
                     [--receipt-delay-ms MS] [--threads N] [--phase-timeout-s S]
                     [--ready-timeout-s S] [--rounds N] [--show-config] [--markdown | --json]
                     [--outbox] [--outbox-rows 1000000] [--outbox-partitions 4] [--outbox-batch 1000]
                     [--trickle-rate 1000] [--trickle-seconds 20]
                     [--flood] [--flood-messages 100000] [--flood-pairs 5]
                     [--http] [--http-messages 200000] [--http-clients 50] [--http-profile NAME]...
                     [--mo] [--mo-messages 100000]
                     [--http-destination] [--http-destination-messages 50000]

Runs the release sendium binary ($SENDIUM_BIN, else next to this executable) per storage
profile against the test SMSC, driven by the load generator: phase 1 at full speed
(end-to-end messages/s), phase 2 at half that rate (submit_sm_resp p50/p99).
Default profiles: those this build supports; --include-unsupported adds the others (a
profile the gateway refuses at startup is reported, not fatal). --list shows the profiles.
PostgreSQL profiles use --pg-url as is (give them a fresh database); without it the
bench starts a throwaway cluster of the machine's PostgreSQL (initdb, fsync on) and gives
each profile a new database in it. --rounds N runs the list N times, alternating the
profiles, and adds each profile's median and range over the rounds.
The outbox phase (run by default, or alone with --outbox and no --profile): a backlog of
committed rows in a PostgreSQL outbox table relayed into the file-file-file profile
(rows/s), then a trickle of one-row commits (insert-to-admission delay p50/p99).
The flood phase (--flood; alone without --profile): an ESME's bind time and submit
throughput on the memory profile while 5,000 never-binding connections are held open,
in alternating windows with and without them (median ratio; the target is >= 0.9).
The HTTP phase (run by default, or alone with --http and no --profile): POST /v1/messages
from --http-clients keep-alive connections, --http-messages per row, without and with a
callback_url (to a sink in the bench), on the memory and file-file-file+dlr-file
profiles: msgs/s until every message is done (its callback back, or without one its
submit_sm answered), the gateway's CPU µs per message over that window, 202 p50/p99.
--http-profile NAME (repeatable; implies --http) runs the HTTP rows on the named
profiles instead, e.g. file-file-file to tell the DLR store's share from the rest.
The inbound phase (run by default, or alone with --mo and no --profile): --mo-messages
deliver_sm from the test SMSC, routed by one [[mo-routes]] entry to a bound receiver,
on the memory and file-file-file+dlr-file profiles: msgs/s from the first sent to the
last received, and the gateway's CPU µs per message.
The HTTP-destination phase (run by default, or alone with --http-destination and no
--profile): --http-destination-messages submitted over SMPP to a kind = \"http\"
destination (a fake provider in the bench that answers 200 with an id and posts the
receipts back in batches), on the memory and file-file-file+dlr-file profiles: msgs/s
from the first submit to the last receipt delivered, and the gateway's CPU µs per message.";

/// The ESME account the load generator binds with; with several gateway processes, the
/// load generator of process `i` binds as account `i` (system id and password), so each
/// one's receipts come back to its own sessions.
const ESME_ACCOUNTS: [&str; 2] = ["bench", "bench2"];
const ESME_SYSTEM_ID: &str = ESME_ACCOUNTS[0];
const ESME_PASSWORD: &str = ESME_ACCOUNTS[0];

/// The gateway configuration around a profile's storage fragment. Placeholders are the
/// gateway harness's (`{smpp_port}`, `{http_port}`, `{admin_port}`, `{data_dir}`,
/// `{smsc_port}`) plus `{storage}` (the profile's fragment, substituted first),
/// `{smpp_window}`, `{max_binds}` and, for PostgreSQL profiles, `{pg_url}`.
const GATEWAY_TEMPLATE: &str = r#"# sendium-bench: one ESME account, one SMPP destination (the test SMSC), one route.
[log]
level = "warn"

{storage}

[smpp]
listen = "127.0.0.1:{smpp_port}"
window = {smpp_window}
[[smpp.accounts]]
system-id = "bench"
password = "bench"
max-tps = 0
max-binds = {max_binds}
[[smpp.accounts]]
system-id = "bench2"
password = "bench2"
max-tps = 0
max-binds = {max_binds}

[admin]
listen = "127.0.0.1:{admin_port}"

[[destinations]]
name = "test-smsc"
kind = "smpp"
host = "127.0.0.1"
port = {smsc_port}
system-id = "sendium"
password = "pw"
bind = "transceiver"
window = 500
max-tps = 0

[[routes]]
name = "default"
account = "*"
destination-prefix = ""
to = ["test-smsc"]
"#;

/// Where one store keeps its records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Memory,
    File,
    Postgresql,
}

impl Backend {
    /// The value of the store's `backend` key.
    fn name(self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::File => "file",
            Backend::Postgresql => "postgresql",
        }
    }
}

/// The stores a profile chooses a backend for, in the order of `Profile::backends`.
const STORES: [&str; 4] = ["sms.pending", "sms.router-queue", "sms.routed-work", "dlr"];

/// One storage profile: its name, the backend of each store, and whether this build runs it.
#[derive(Debug, Clone, Copy)]
struct Profile {
    name: &'static str,
    /// The backends of `[sms.pending]`, `[sms.router-queue]`, `[sms.routed-work]` and
    /// `[dlr]` (the order of `STORES`).
    backends: [Backend; 4],
    /// Implemented by this build: run by default. The others run with
    /// `--include-unsupported` or when named, and a refusal at startup is reported cleanly.
    /// Flip this when a profile lands.
    supported: bool,
    /// Gateway processes on one database (`[storage.postgresql] shared = true` when more
    /// than one), each driven by its own load generator and ESME account.
    processes: usize,
}

impl Profile {
    /// A profile this build implements.
    const fn new(name: &'static str, backends: [Backend; 4]) -> Profile {
        Profile {
            name,
            backends,
            supported: true,
            processes: 1,
        }
    }

    /// Uses `[storage.file] dir = "{data_dir}"` (a fresh directory per profile).
    fn needs_data_dir(&self) -> bool {
        self.backends.contains(&Backend::File)
    }

    /// Uses `[storage.postgresql] url = "{pg_url}"` (`--pg-url`; skipped without it).
    fn needs_pg_url(&self) -> bool {
        self.backends.contains(&Backend::Postgresql)
    }

    /// The `[sms.pending]`, `[sms.router-queue]`, `[sms.routed-work]`, `[dlr]` and
    /// `[storage.*]` tables (harness placeholders left in; no final newline).
    fn storage(&self) -> String {
        let mut out: Vec<String> = STORES
            .iter()
            .zip(self.backends)
            .map(|(store, backend)| format!("[{store}]\nbackend = \"{}\"", backend.name()))
            .collect();
        if self.needs_data_dir() {
            out.push("[storage.file]\ndir = \"{data_dir}\"".to_owned());
        }
        if self.needs_pg_url() {
            let mut pg = "[storage.postgresql]\nurl = \"{pg_url}\"".to_owned();
            if self.processes > 1 {
                pg.push_str("\nshared = true");
            }
            out.push(pg);
        }
        out.join("\n")
    }
}

use Backend::{File, Memory, Postgresql};

/// mimalloc: the load generator and test SMSC share the cores with the gateway they
/// measure, and with glibc's malloc a fifth of their CPU went to its arenas.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Every benchmarked profile. Adding one is one entry here.
const PROFILES: &[Profile] = &[
    Profile::new("memory", [Memory, Memory, Memory, Memory]),
    Profile::new("file-memory-memory", [File, Memory, Memory, Memory]),
    Profile::new("file-file-memory", [File, File, Memory, Memory]),
    Profile::new("file-memory-file", [File, Memory, File, Memory]),
    Profile::new("file-file-file", [File, File, File, Memory]),
    Profile::new("memory+dlr-file", [Memory, Memory, Memory, File]),
    Profile::new("file-file-file+dlr-file", [File, File, File, File]),
    Profile::new("file-file-file+dlr-postgresql", [File, File, File, Postgresql]),
    Profile::new(
        "postgresql-postgresql-postgresql",
        [Postgresql, Postgresql, Postgresql, Postgresql],
    ),
    Profile {
        processes: 2,
        ..Profile::new(
            "postgresql-shared-2-processes",
            [Postgresql, Postgresql, Postgresql, Postgresql],
        )
    },
];

fn find_profile(name: &str) -> Option<&'static Profile> {
    PROFILES.iter().find(|p| p.name == name)
}

/// The gateway's SMPP window (`{smpp_window}`) for the load generator's `--window`: twice
/// that, at least 512. Rendered into the config and reported in the run's settings.
fn gateway_smpp_window(window: usize) -> usize {
    (window * 2).max(512)
}

/// The gateway config template for `profile` (harness placeholders left in).
fn gateway_template(profile: &Profile) -> String {
    GATEWAY_TEMPLATE.replacen("{storage}", &profile.storage(), 1)
}

#[derive(Debug, Clone)]
struct Options {
    profiles: Vec<&'static Profile>,
    include_unsupported: bool,
    pg_url: Option<String>,
    count: u64,
    latency_count: u64,
    latency_rate: Option<f64>,
    sessions: usize,
    window: usize,
    mix: Mix,
    mix_text: String,
    receipt_delay: Duration,
    threads: usize,
    phase_timeout: Duration,
    ready_timeout: Duration,
    rounds: usize,
    show_config: bool,
    markdown: bool,
    json: bool,
    outbox: bool,
    outbox_rows: u64,
    outbox_partitions: u16,
    outbox_batch: u32,
    trickle_rate: u32,
    trickle_seconds: u64,
    flood: bool,
    flood_messages: u64,
    flood_pairs: u32,
    http: bool,
    http_messages: u64,
    http_clients: usize,
    /// The HTTP phase's profiles; empty: memory and file-file-file+dlr-file.
    http_profiles: Vec<&'static Profile>,
    mo: bool,
    mo_messages: u64,
    http_destination: bool,
    http_destination_messages: u64,
}

fn parse_args(args: &[String]) -> Result<Option<Options>, String> {
    let mix_text = "gsm=8,ucs2=1,multipart=1".to_owned();
    let mut o = Options {
        profiles: Vec::new(),
        include_unsupported: false,
        pg_url: None,
        count: 200_000,
        latency_count: 100_000,
        latency_rate: None,
        sessions: 4,
        window: 256,
        mix: Mix::parse(&mix_text)?,
        mix_text,
        receipt_delay: Duration::from_millis(20),
        threads: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2),
        phase_timeout: Duration::from_secs(300),
        ready_timeout: Duration::from_secs(30),
        rounds: 1,
        show_config: false,
        markdown: false,
        json: false,
        outbox: false,
        outbox_rows: 1_000_000,
        outbox_partitions: 4,
        outbox_batch: 1000,
        trickle_rate: 1000,
        trickle_seconds: 20,
        flood: false,
        flood_messages: 100_000,
        flood_pairs: 5,
        http: false,
        // A row takes 4-20 s on the 2-core VM: 200,000 messages at 10,000-50,000 msgs/s.
        http_messages: 200_000,
        http_clients: 50,
        http_profiles: Vec::new(),
        mo: false,
        mo_messages: 100_000,
        http_destination: false,
        http_destination_messages: 50_000,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_owned())),
            _ => (arg.as_str(), None),
        };
        let mut value = || -> Result<String, String> {
            match &inline {
                Some(v) => Ok(v.clone()),
                None => it.next().cloned().ok_or_else(|| format!("{flag} needs a value")),
            }
        };
        fn num<T: std::str::FromStr>(flag: &str, v: String) -> Result<T, String> {
            v.trim().parse().map_err(|_| format!("bad {flag} value {v:?}"))
        }
        match flag {
            "--profile" => add_profile(&mut o.profiles, &value()?)?,
            "--include-unsupported" => o.include_unsupported = true,
            "--pg-url" => o.pg_url = Some(value()?),
            "--count" => o.count = num(flag, value()?)?,
            "--latency-count" => o.latency_count = num(flag, value()?)?,
            "--latency-rate" => {
                let r: f64 = num(flag, value()?)?;
                if !(r.is_finite() && r > 0.0) {
                    return Err("--latency-rate must be positive".into());
                }
                o.latency_rate = Some(r);
            }
            "--sessions" => o.sessions = num(flag, value()?)?,
            "--window" => o.window = num(flag, value()?)?,
            "--mix" => {
                o.mix_text = value()?;
                o.mix = Mix::parse(&o.mix_text)?;
            }
            "--receipt-delay-ms" => o.receipt_delay = Duration::from_millis(num(flag, value()?)?),
            "--threads" => o.threads = num(flag, value()?)?,
            "--phase-timeout-s" => o.phase_timeout = Duration::from_secs(num(flag, value()?)?),
            "--ready-timeout-s" => o.ready_timeout = Duration::from_secs(num(flag, value()?)?),
            "--rounds" => o.rounds = num(flag, value()?)?,
            "--show-config" => o.show_config = true,
            "--outbox" => o.outbox = true,
            "--outbox-rows" => o.outbox_rows = num(flag, value()?)?,
            "--outbox-partitions" => o.outbox_partitions = num(flag, value()?)?,
            "--outbox-batch" => o.outbox_batch = num(flag, value()?)?,
            "--trickle-rate" => o.trickle_rate = num(flag, value()?)?,
            "--trickle-seconds" => o.trickle_seconds = num(flag, value()?)?,
            "--flood" => o.flood = true,
            "--flood-messages" => o.flood_messages = num(flag, value()?)?,
            "--flood-pairs" => o.flood_pairs = num(flag, value()?)?,
            "--http" => o.http = true,
            "--http-messages" => o.http_messages = num(flag, value()?)?,
            "--http-clients" => o.http_clients = num(flag, value()?)?,
            "--http-profile" => {
                add_profile(&mut o.http_profiles, &value()?)?;
                o.http = true;
            }
            "--mo" => o.mo = true,
            "--mo-messages" => o.mo_messages = num(flag, value()?)?,
            "--http-destination" => o.http_destination = true,
            "--http-destination-messages" => o.http_destination_messages = num(flag, value()?)?,
            "--markdown" => o.markdown = true,
            "--json" => o.json = true,
            "--list" => {
                print!("{}", profile_list());
                return Ok(None);
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(None);
            }
            other => return Err(format!("unknown argument {other}")),
        }
        if inline.is_some()
            && matches!(
                flag,
                "--include-unsupported"
                    | "--show-config"
                    | "--markdown"
                    | "--json"
                    | "--outbox"
                    | "--flood"
                    | "--http"
                    | "--mo"
                    | "--http-destination"
            )
        {
            return Err(format!("{flag} takes no value"));
        }
    }
    if o.sessions == 0 || o.window == 0 || o.count == 0 || o.threads == 0 || o.rounds == 0 {
        return Err("--sessions, --window, --count, --threads and --rounds must be at least 1".into());
    }
    if o.markdown && o.json {
        return Err("choose one of --markdown and --json".into());
    }
    if o.outbox_rows == 0 || o.outbox_partitions == 0 || o.outbox_batch == 0 || o.trickle_rate == 0 {
        return Err("--outbox-rows, --outbox-partitions, --outbox-batch and --trickle-rate must be at least 1".into());
    }
    if o.flood_messages == 0 || o.flood_pairs == 0 {
        return Err("--flood-messages and --flood-pairs must be at least 1".into());
    }
    if o.http_messages == 0 || o.http_clients == 0 || o.mo_messages == 0 || o.http_destination_messages == 0 {
        return Err(
            "--http-messages, --http-clients, --mo-messages and --http-destination-messages must be at least 1".into(),
        );
    }
    // No --profile: every profile, the outbox and the HTTP phases, or the outbox, flood or
    // HTTP phase alone.
    if o.profiles.is_empty() && (o.outbox || o.flood || o.http || o.mo || o.http_destination) {
        return Ok(Some(o));
    }
    if o.profiles.is_empty() {
        o.outbox = true;
        o.http = true;
        o.mo = true;
        o.http_destination = true;
        o.profiles = PROFILES
            .iter()
            .filter(|p| p.supported || o.include_unsupported)
            .collect();
    }
    Ok(Some(o))
}

/// Add the profile called `name` to `list`, once.
fn add_profile(list: &mut Vec<&'static Profile>, name: &str) -> Result<(), String> {
    let profile = find_profile(name).ok_or_else(|| {
        let names: Vec<&str> = PROFILES.iter().map(|p| p.name).collect();
        format!("unknown profile {name:?} (known: {})", names.join(", "))
    })?;
    if !list.iter().any(|p| p.name == profile.name) {
        list.push(profile);
    }
    Ok(())
}

fn profile_list() -> String {
    let mut out = String::from("profile                          supported  data dir  postgresql\n");
    for p in PROFILES {
        let yes = |b: bool| if b { "yes" } else { "-" };
        let _ = writeln!(
            out,
            "{:<32} {:<10} {:<9} {}",
            p.name,
            if p.supported { "yes" } else { "not yet" },
            yes(p.needs_data_dir()),
            yes(p.needs_pg_url())
        );
    }
    out
}

// ---------------------------------------------------------------------------------------
// /proc sampling

#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct ProcSample {
    /// VmHWM: peak resident set (since start, or since the last clear_refs reset).
    hwm_kib: u64,
    /// VmRSS: current resident set.
    rss_kib: u64,
    /// utime + stime in clock ticks.
    cpu_ticks: u64,
}

fn status_kib(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|rest| rest.trim_start_matches(':').split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// utime + stime from the text of `/proc/<pid>/stat` (fields 14 and 15; the command name
/// in field 2 may contain spaces and parentheses, so fields are counted after the last `)`).
fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // `after` starts at field 3 (state): utime is field 14, stime field 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

fn sample_proc(pid: u32) -> Option<ProcSample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(ProcSample {
        hwm_kib: status_kib(&status, "VmHWM")?,
        rss_kib: status_kib(&status, "VmRSS")?,
        cpu_ticks: stat_cpu_ticks(&stat)?,
    })
}

/// Resets VmHWM to the current RSS (`echo 5 > /proc/<pid>/clear_refs`, Linux ≥ 4.0), so
/// each phase reports its own peak. False where the kernel refuses.
fn reset_peak_rss(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

/// The machine's CPU time so far from the first line of `/proc/stat`: (busy, total)
/// ticks over all cores, idle and iowait counting as not busy.
fn machine_cpu_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    parse_machine_cpu(stat.lines().next()?)
}

fn parse_machine_cpu(line: &str) -> Option<(u64, u64)> {
    let mut fields = line.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    let v: Vec<u64> = fields.take(8).map(|f| f.parse().ok()).collect::<Option<_>>()?;
    let total: u64 = v.iter().sum();
    let idle = v.get(3)? + v.get(4)?;
    Some((total - idle, total))
}

/// The share of the machine's CPU that was busy between two samples.
fn busy_share(before: Option<(u64, u64)>, after: Option<(u64, u64)>) -> Option<f64> {
    let ((b0, t0), (b1, t1)) = (before?, after?);
    let total = t1.checked_sub(t0).filter(|&t| t > 0)?;
    Some(b1.saturating_sub(b0) as f64 / total as f64)
}

/// utime + stime of this process (the load generator and the test SMSC).
fn own_cpu_ticks() -> Option<u64> {
    stat_cpu_ticks(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

fn dir_size(path: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_size(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

// ---------------------------------------------------------------------------------------
// gateway metrics

/// Prometheus text → every `sendium_*` series (`name` or `name{labels}`) with its value;
/// histogram buckets skipped.
fn metric_series(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (series, name, rest) = match line.find('{') {
            Some(open) => match line.rfind('}') {
                Some(close) if close > open => (&line[..=close], &line[..open], &line[close + 1..]),
                _ => continue,
            },
            None => match line.split_once(char::is_whitespace) {
                Some((n, r)) => (n, n, r),
                None => continue,
            },
        };
        if !name.starts_with("sendium_") || name.ends_with("_bucket") {
            continue;
        }
        if let Some(value) = rest.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()) {
            out.insert(series.to_owned(), value);
        }
    }
    out
}

/// Series → the sum over label sets of each metric name.
fn metric_sums(series: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for (key, value) in series {
        let name = key.split('{').next().unwrap_or(key);
        *out.entry(name.to_owned()).or_insert(0.0) += value;
    }
    out
}

/// How often the gateway's pending depth is sampled during a phase, and every how many
/// samples a progress line is printed.
const SAMPLE_EVERY: Duration = Duration::from_millis(250);
const PROGRESS_TICKS: u64 = 40;

const PENDING_SERIES: &str = "sendium_stage_records{stage=\"pending\"}";
const FSYNCS_TOTAL: &str = "sendium_storage_fsyncs_total";

async fn fetch_text(addr: std::net::SocketAddr) -> Option<String> {
    let resp = http::request_with_timeout(addr, "GET", "/metrics", &[], None, Duration::from_secs(5))
        .await
        .ok()?;
    (resp.status == 200).then(|| resp.text())
}

async fn fetch_series(addr: std::net::SocketAddr) -> Option<BTreeMap<String, f64>> {
    fetch_text(addr).await.map(|t| metric_series(&t))
}

/// The cumulative buckets of `sendium_admission_seconds`: the gateway's own view of how
/// long an admission waited for its answer.
const ADMISSION_BUCKETS: &str = "sendium_admission_seconds_bucket{le=\"";
/// The cumulative buckets of the stages' journal's fdatasyncs: the disk's share of it.
const JOURNAL_SYNC_BUCKETS: &str = "sendium_storage_fsync_seconds_bucket{file=\"journal\",le=\"";
/// The per-file counts of the same histogram.
const SYNC_COUNTS: &str = "sendium_storage_fsync_seconds_count{";

/// The cumulative buckets of one histogram series in Prometheus text (upper bound in
/// seconds, count), in order; `series` is its bucket lines' text up to the bound.
fn buckets(text: &str, series: &str) -> Option<Vec<(f64, f64)>> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(series) else {
            continue;
        };
        let Some((le, value)) = rest.split_once("\"}") else {
            continue;
        };
        let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
        out.push((le, value.trim().parse().ok()?));
    }
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    (!out.is_empty()).then_some(out)
}

/// What a phase reads from one scrape of `/metrics` before and after it.
struct Scrape {
    /// Every `sendium_*` metric summed over its label sets.
    sums: BTreeMap<String, f64>,
    admissions: Vec<(f64, f64)>,
    journal_syncs: Vec<(f64, f64)>,
    /// fdatasyncs so far of every store file but the pending stage's own.
    background_syncs: f64,
}

fn scrape(ctl: &tokio::runtime::Runtime, gw: &GatewayProcess) -> Option<Scrape> {
    let text = ctl.block_on(fetch_text(gw.admin_addr()))?;
    let series = metric_series(&text);
    Some(Scrape {
        sums: metric_sums(&series),
        admissions: buckets(&text, ADMISSION_BUCKETS).unwrap_or_default(),
        journal_syncs: buckets(&text, JOURNAL_SYNC_BUCKETS).unwrap_or_default(),
        background_syncs: background_syncs(&series),
    })
}

/// The fdatasyncs of the store files other than the journal and the pending stage's
/// redb file: the router-queue and routed-work files' checkpoints and the DLR store,
/// whose syncs share the disk with the ones acknowledgements wait for.
fn background_syncs(series: &BTreeMap<String, f64>) -> f64 {
    series
        .iter()
        .filter(|(key, _)| {
            key.starts_with(SYNC_COUNTS) && !key.contains("file=\"pending.") && !key.contains("file=\"journal\"")
        })
        .map(|(_, v)| v)
        .sum()
}

/// The observations between two scrapes of a histogram's cumulative buckets.
fn bucket_delta(before: &[(f64, f64)], after: &[(f64, f64)]) -> Option<(Vec<(f64, f64)>, f64)> {
    let delta: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, n)| {
            let was = before.iter().find(|(l, _)| l == le).map_or(0.0, |(_, m)| *m);
            (*le, n - was)
        })
        .collect();
    let total = delta.last()?.1;
    (total > 0.0).then_some((delta, total))
}

/// From two scrapes of a histogram's buckets: the bucket bound (ms) under which the
/// share `q` of the observations between them fell.
fn bucket_quantile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> Option<f64> {
    let (delta, total) = bucket_delta(before, after)?;
    Some(delta.iter().find(|(_, n)| *n >= q * total)?.0 * 1000.0)
}

/// From two scrapes of a histogram's buckets: the bucket bound (ms) under which 99% of
/// the phase's observations fell, and the share within 5 ms.
fn bucket_p99(before: &[(f64, f64)], after: &[(f64, f64)]) -> Option<(f64, f64)> {
    let (delta, total) = bucket_delta(before, after)?;
    let p99 = bucket_quantile(before, after, 0.99)?;
    let within_5ms = delta.iter().rfind(|(le, _)| *le <= 0.005).map_or(0.0, |(_, n)| *n) / total;
    Some((p99, within_5ms))
}

/// The few gateway figures that say how far a run got.
fn progress_metrics(m: &BTreeMap<String, f64>) -> String {
    let get = |k: &str| m.get(k).copied().unwrap_or(0.0);
    format!(
        "gateway admitted {:.0}, refused {:.0}, completed {:.0}, provider receipts {:.0}, receipts delivered {:.0}, \
         DLR pending {:.0}, unmatched receipts {:.0}",
        get("sendium_admitted_total"),
        get("sendium_admissions_refused_total"),
        get("sendium_completed_total"),
        get("sendium_provider_receipts_total"),
        get("sendium_receipts_delivered_total"),
        get("sendium_dlr_pending_receipts"),
        get("sendium_receipts_unmatched_total"),
    )
}

fn smsc_progress(s: &SmscStats) -> String {
    format!(
        "SMSC got {} submit_sm ({} accepted, {} messages), sent {} receipts ({} acked, {} held)",
        s.submits, s.accepted, s.messages_completed, s.receipts_sent, s.receipts_acked, s.receipts_held
    )
}

fn smsc_json(s: &SmscStats) -> Value {
    json!({
        "connections": s.connections,
        "binds": s.binds,
        "submits": s.submits,
        "accepted": s.accepted,
        "rejected": s.rejected,
        "throttled": s.throttled,
        "messages_completed": s.messages_completed,
        "duplicate_messages": s.duplicate_messages,
        "receipts_sent": s.receipts_sent,
        "receipts_acked": s.receipts_acked,
        "receipts_nacked": s.receipts_nacked,
        "receipts_held": s.receipts_held,
    })
}

// ---------------------------------------------------------------------------------------
// gateway lifecycle

enum StartFailure {
    /// The process exited before `/readyz` said yes.
    Exited { status: String, refused_profile: bool },
    /// Still not ready after the ready timeout.
    NotReady { last: String },
}

/// Polls `/readyz` until 200; never panics.
fn wait_ready(ctl: &tokio::runtime::Runtime, gw: &mut GatewayProcess, timeout: Duration) -> Result<(), StartFailure> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = ctl.block_on(gw.wait_exit(Duration::ZERO)) {
            let log = gw.log();
            return Err(StartFailure::Exited {
                status: status.to_string(),
                refused_profile: log.contains("unsupported storage profile"),
            });
        }
        let last = match ctl.block_on(http::request_with_timeout(
            gw.admin_addr(),
            "GET",
            "/readyz",
            &[],
            None,
            Duration::from_secs(2),
        )) {
            Ok(resp) if resp.status == 200 => return Ok(()),
            Ok(resp) => format!("{} {}", resp.status, resp.text().trim()),
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            return Err(StartFailure::NotReady { last });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGTERM, then SIGKILL after 10 s. Returns a note when it was not a clean stop.
fn stop_gateway(ctl: &tokio::runtime::Runtime, gw: &mut GatewayProcess) -> Option<String> {
    if !gw.is_running() {
        return None;
    }
    let pid = gw.pid()?;
    let sent = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    if sent && let Some(status) = ctl.block_on(gw.wait_exit(Duration::from_secs(10))) {
        return (!status.success()).then(|| format!("gateway exited with {status} after SIGTERM"));
    }
    gw.kill();
    Some(if sent {
        "gateway ignored SIGTERM for 10 s; killed with SIGKILL".to_owned()
    } else {
        "could not send SIGTERM; killed with SIGKILL".to_owned()
    })
}

/// Prints the end of the gateway log to stderr and saves all of it; returns the saved path.
fn dump_log(gw: &GatewayProcess, profile: &str, why: &str) {
    let log = gw.log();
    let safe: String = profile
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' })
        .collect();
    let path = std::env::temp_dir().join(format!("sendium-bench-{safe}-{}.log", std::process::id()));
    let saved = std::fs::write(&path, &log).is_ok();
    let lines: Vec<&str> = log.lines().collect();
    let tail = &lines[lines.len().saturating_sub(200)..];
    eprintln!(
        "--- gateway log for {profile} ({why}; last {} of {} lines) ---",
        tail.len(),
        lines.len()
    );
    for line in tail {
        eprintln!("{line}");
    }
    if saved {
        eprintln!("--- end of gateway log; full log saved to {} ---", path.display());
    } else {
        eprintln!("--- end of gateway log ---");
    }
}

// ---------------------------------------------------------------------------------------
// phases

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Throughput,
    Latency,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Throughput => "throughput",
            Phase::Latency => "latency",
        }
    }
}

enum PhaseOutcome {
    Done(LoadReport),
    TimedOut,
    GatewayExited(String),
    LoadError(String),
}

struct Measured {
    messages: u64,
    elapsed_s: f64,
    msgs_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    peak_rss_mib: Option<f64>,
    cpu_s_per_10k: Option<f64>,
    receipts_missing: u64,
    errors: u64,
}

struct Row {
    profile: String,
    /// Which round of `--rounds` (None when there is one).
    round: Option<usize>,
    phase: Option<Phase>,
    measured: Option<Measured>,
    note: String,
    /// A failure of the run (not a slow figure): makes the exit status 1.
    failed: bool,
    detail: Value,
}

impl Row {
    fn note_only(profile: &str, note: String, failed: bool) -> Row {
        Row {
            profile: profile.to_owned(),
            round: None,
            phase: None,
            measured: None,
            note,
            failed,
            detail: Value::Null,
        }
    }
}

struct Bench {
    opts: Options,
    ctl: tokio::runtime::Runtime,
    ticks_per_s: u64,
    /// Started on first use by a PostgreSQL profile when no `--pg-url` was given.
    pg_cluster: std::sync::OnceLock<Result<TestCluster, String>>,
}

impl Bench {
    fn load_config(&self, gw: &GatewayProcess, phase: Phase, rate: Option<f64>) -> LoadConfig {
        LoadConfig {
            addr: gw.smpp_addr(),
            system_id: ESME_SYSTEM_ID.to_owned(),
            password: ESME_PASSWORD.to_owned(),
            sessions: self.opts.sessions,
            count: match phase {
                Phase::Throughput => self.opts.count,
                Phase::Latency => self.opts.latency_count,
            },
            window: self.opts.window,
            rate,
            mix: self.opts.mix,
            receipts: true,
            // Other numbers than the other phase's: a multipart message repeated to the
            // same number with the same reference while the gateway still remembers the
            // completed group is (rightly) taken for a retransmission, not a new message.
            dest_prefix: match phase {
                Phase::Throughput => "4477",
                Phase::Latency => "4476",
            }
            .to_owned(),
            receipt_timeout: Duration::from_secs(30),
            resp_timeout: Duration::from_secs(30),
            ..LoadConfig::default()
        }
    }

    /// The load generator's own runtime, on `--threads` threads.
    fn loadgen_runtime(&self) -> Result<tokio::runtime::Runtime, String> {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(self.opts.threads)
            .thread_name("bench-loadgen")
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the load generator runtime: {e}"))
    }

    /// Runs the load generator on its own runtime (dropped afterwards, which stops any
    /// session still running after a timeout). Samples the gateway's pending depth every
    /// 250 ms and prints progress every 10 s. Returns the outcome and the deepest pending
    /// backlog seen (units: messages and parts).
    fn drive(
        &self,
        label: &str,
        cfg: LoadConfig,
        gw: &mut GatewayProcess,
        smsc: &TestSmsc,
    ) -> (PhaseOutcome, Option<f64>) {
        let runtime = match self.loadgen_runtime() {
            Ok(r) => r,
            Err(e) => return (PhaseOutcome::LoadError(e), None),
        };
        let timeout = self.opts.phase_timeout;
        let admin = gw.admin_addr();
        let mut peak_pending: Option<f64> = None;
        let outcome = runtime.block_on(async {
            let start = tokio::time::Instant::now();
            let run = loadgen::run(cfg);
            tokio::pin!(run);
            let mut tick = tokio::time::interval_at(start + SAMPLE_EVERY, SAMPLE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut ticks = 0u64;
            loop {
                tokio::select! {
                    result = &mut run => {
                        return match result {
                            Ok(report) => PhaseOutcome::Done(report),
                            Err(e) => PhaseOutcome::LoadError(e.to_string()),
                        };
                    }
                    _ = tokio::time::sleep_until(start + timeout) => return PhaseOutcome::TimedOut,
                    _ = tick.tick() => {
                        ticks += 1;
                        if let Some(status) = gw.wait_exit(Duration::ZERO).await {
                            return PhaseOutcome::GatewayExited(status.to_string());
                        }
                        let series = fetch_series(admin).await;
                        if let Some(p) = series.as_ref().and_then(|s| s.get(PENDING_SERIES)) {
                            peak_pending = Some(peak_pending.map_or(*p, |q| q.max(*p)));
                        }
                        if ticks.is_multiple_of(PROGRESS_TICKS) {
                            let gateway = series
                                .map(|s| progress_metrics(&metric_sums(&s)))
                                .unwrap_or_else(|| "gateway metrics unavailable".to_owned());
                            eprintln!(
                                "  [{label}] {:>4} s: {}; {gateway}",
                                start.elapsed().as_secs(),
                                smsc_progress(&smsc.stats())
                            );
                        }
                    }
                }
            }
        });
        runtime.shutdown_timeout(Duration::from_secs(2));
        (outcome, peak_pending)
    }

    fn run_phase(
        &self,
        profile: &Profile,
        phase: Phase,
        rate: Option<f64>,
        gw: &mut GatewayProcess,
        smsc: &TestSmsc,
        pg: Option<&PgProbe>,
    ) -> (Row, Option<LoadReport>) {
        let label = format!("{} {}", profile.name, phase.name());
        let cfg = self.load_config(gw, phase, rate);
        let pid = gw.pid().unwrap_or(0);
        let hwm_reset = reset_peak_rss(pid);
        let before = sample_proc(pid);
        let smsc_before = smsc.stats();
        let scraped_before = scrape(&self.ctl, gw);
        let pg_before = pg.and_then(|p| self.ctl.block_on(p.sample()));
        match rate {
            Some(r) => eprintln!(
                "  [{label}] {} messages at {r:.0} msg/s, {} sessions × window {}",
                cfg.count, cfg.sessions, cfg.window
            ),
            None => eprintln!(
                "  [{label}] {} messages at full speed, {} sessions × window {}",
                cfg.count, cfg.sessions, cfg.window
            ),
        }
        let wall = Instant::now();
        let bench_cpu_before = own_cpu_ticks();
        let machine_before = machine_cpu_ticks();
        let (outcome, peak_pending) = self.drive(&label, cfg, gw, smsc);
        let wall = wall.elapsed();
        let bench_cpu_s = match (bench_cpu_before, own_cpu_ticks()) {
            (Some(b), Some(a)) => Some(a.saturating_sub(b) as f64 / self.ticks_per_s as f64),
            _ => None,
        };
        let machine_busy = busy_share(machine_before, machine_cpu_ticks());
        let after = sample_proc(pid);
        let smsc_after = smsc.stats();
        let scraped = scrape(&self.ctl, gw);
        let pg_after = pg.and_then(|p| self.ctl.block_on(p.sample()));
        let (mut fsyncs_before, mut admissions, mut journal_syncs, mut background_syncs) = (None, None, None, None);
        if let (Some(b), Some(a)) = (&scraped_before, &scraped) {
            fsyncs_before = b.sums.get(FSYNCS_TOTAL).copied();
            admissions = bucket_p99(&b.admissions, &a.admissions);
            journal_syncs = bucket_p99(&b.journal_syncs, &a.journal_syncs);
            background_syncs = Some(a.background_syncs - b.background_syncs);
        }
        let metrics = scraped.map(|s| s.sums);
        let resources = resources_json(before, after, hwm_reset, self.ticks_per_s);
        let mut detail = json!({
            "rate_limit": rate,
            "wall_s": wall.as_secs_f64(),
            "gateway": resources,
            "gateway_peak_pending_units": peak_pending,
            "bench_cpu_s": bench_cpu_s,
            "machine_busy": machine_busy,
            "smsc_before": smsc_json(&smsc_before),
            "smsc_after": smsc_json(&smsc_after),
            "gateway_metrics": metrics.clone().unwrap_or_default(),
        });
        if profile.needs_data_dir() {
            detail["data_dir_mib"] = json!(dir_size(gw.data_dir()) as f64 / 1_048_576.0);
        }
        let far = || {
            let gateway = metrics
                .as_ref()
                .map(progress_metrics)
                .unwrap_or_else(|| "gateway metrics unavailable".to_owned());
            format!("{}; {gateway}", smsc_progress(&smsc_after))
        };
        let failed_row = |note: String, detail: Value| Row {
            profile: profile.name.to_owned(),
            round: None,
            phase: Some(phase),
            measured: None,
            note,
            failed: true,
            detail,
        };
        let report = match outcome {
            PhaseOutcome::Done(report) => report,
            PhaseOutcome::TimedOut => {
                let note = format!("timed out after {} s: {}", self.opts.phase_timeout.as_secs(), far());
                eprintln!("  [{label}] {note}");
                dump_log(gw, profile.name, "phase timed out");
                return (failed_row(note, detail), None);
            }
            PhaseOutcome::GatewayExited(status) => {
                let note = format!("gateway exited ({status}) during the phase: {}", far());
                eprintln!("  [{label}] {note}");
                dump_log(gw, profile.name, "gateway exited");
                return (failed_row(note, detail), None);
            }
            PhaseOutcome::LoadError(e) => {
                let note = format!("load generator: {e}");
                eprintln!("  [{label}] {note}");
                return (failed_row(note, detail), None);
            }
        };

        let non_ok: u64 = report.statuses.values().sum();
        let errors = non_ok + report.no_response + report.session_errors.len() as u64;
        let cpu_s = match (before, after) {
            (Some(b), Some(a)) => Some(a.cpu_ticks.saturating_sub(b.cpu_ticks) as f64 / self.ticks_per_s as f64),
            _ => None,
        };
        let measured = Measured {
            messages: report.messages,
            elapsed_s: report.elapsed.as_secs_f64(),
            msgs_per_sec: report.msgs_per_sec,
            p50_ms: report.p50_ms(),
            p99_ms: report.p99_ms(),
            peak_rss_mib: after.map(|a| a.hwm_kib as f64 / 1024.0),
            cpu_s_per_10k: cpu_s
                .filter(|_| report.messages > 0)
                .map(|c| c / report.messages as f64 * 10_000.0),
            receipts_missing: report.receipts_missing,
            errors,
        };
        let mut notes = Vec::new();
        let fsyncs_after = metrics.as_ref().and_then(|m| m.get(FSYNCS_TOTAL).copied());
        if let (Some(b), Some(a)) = (fsyncs_before, fsyncs_after)
            && a > 0.0
            && report.messages > 0
        {
            // Scraped before and after the phase: fdatasyncs of every store file.
            notes.push(format!("{:.4} fsyncs/msg", (a - b) / report.messages as f64));
            detail["fsyncs"] = json!(a - b);
        }
        if let Some((p99, within)) = admissions
            && rate.is_some()
        {
            // The gateway's share of the latency: from the SMPP session handing the read's
            // submissions to the pipeline to their answers, per submission (bucket bound,
            // so an upper bound).
            notes.push(format!("in gateway: p99 ≤ {p99} ms, {:.1}% ≤ 5 ms", within * 100.0));
            detail["admission_p99_ms_bound"] = json!(p99);
            detail["admissions_within_5ms"] = json!(within);
        }
        if let Some(cost) = pg_before
            .zip(pg_after)
            .and_then(|(b, a)| b.cost_until(&a, report.messages, self.ticks_per_s))
        {
            notes.push(pg_note(&cost));
            detail["postgresql"] = pg_json(&cost);
        }
        if let Some(busy) = machine_busy {
            // Gateway, load generator and test SMSC share the cores: how close to full
            // they were says how much of a tail is waiting for a core.
            notes.push(format!("machine {:.0}% busy", busy * 100.0));
        }
        if let Some((p99, _)) = journal_syncs
            && rate.is_some()
        {
            // What the disk adds: every durable acknowledgement waits for one journal sync.
            notes.push(format!("journal fdatasync p99 ≤ {p99} ms"));
            detail["journal_sync_p99_ms_bound"] = json!(p99);
        }
        if let Some(n) = background_syncs
            && n > 0.0
            && rate.is_some()
            && wall > Duration::ZERO
        {
            // The other stores' syncs share the disk with the journal's, so they lengthen
            // the acknowledgements' waits. Per second of the phase between the two scrapes.
            let per_s = n / wall.as_secs_f64();
            notes.push(format!("other stores {per_s:.0} fdatasyncs/s"));
            detail["background_syncs_per_s"] = json!(per_s);
        }
        if !report.statuses.is_empty() {
            let list: Vec<String> = report.statuses.iter().map(|(k, v)| format!("{k}={v}")).collect();
            notes.push(format!("non-OK: {}", list.join(" ")));
        }
        if report.no_response > 0 {
            notes.push(format!("{} submits unanswered", report.no_response));
        }
        for e in &report.session_errors {
            notes.push(format!("session error: {e}"));
        }
        if report.receipts_unmatched > 0 {
            notes.push(format!("{} receipts unmatched", report.receipts_unmatched));
        }
        if !hwm_reset && phase == Phase::Latency {
            notes.push("peak RSS since start (clear_refs refused)".to_owned());
        }
        let bad = report.receipts_missing > 0 || errors > 0 || report.messages == 0;
        if report.receipts_missing > 0 {
            eprintln!(
                "  [{label}] {} of {} receipts missing after waiting 30 s: {}",
                report.receipts_missing,
                report.receipts_expected,
                far()
            );
            dump_log(gw, profile.name, "receipts missing");
        } else if errors > 0 {
            dump_log(gw, profile.name, "errors");
        }
        eprintln!(
            "  [{label}] {} messages in {:.2} s = {:.0} msg/s; resp p50 {:.2} ms p99 {:.2} ms; receipts {}/{}; \
             gateway peak RSS {} MiB, deepest pending backlog {} units",
            report.messages,
            measured.elapsed_s,
            measured.msgs_per_sec,
            measured.p50_ms,
            measured.p99_ms,
            report.receipts_matched,
            report.receipts_expected,
            measured.peak_rss_mib.map_or("?".to_owned(), |m| format!("{m:.1}")),
            peak_pending.map_or("?".to_owned(), |p| format!("{p:.0}")),
        );
        detail["load"] = report.to_json();
        // A gateway that died at the very end shows up only here (the sessions saw EOF).
        let exited = self.ctl.block_on(gw.wait_exit(Duration::ZERO));
        if let Some(status) = &exited {
            notes.push(format!("gateway exited ({status})"));
            dump_log(gw, profile.name, "gateway exited");
        }
        let row = Row {
            profile: profile.name.to_owned(),
            round: None,
            phase: Some(phase),
            measured: Some(measured),
            note: notes.join("; "),
            failed: bad || exited.is_some(),
            detail,
        };
        (row, exited.is_none().then_some(report))
    }

    fn run_profile(&self, profile: &Profile) -> Vec<Row> {
        eprintln!("== profile {} ==", profile.name);
        let pg = match (&self.opts.pg_url, profile.needs_pg_url()) {
            (Some(url), true) => Some(PgProbe {
                url: url.clone(),
                server_pid: None,
            }),
            (_, false) => None,
            (None, true) => match self
                .pg_cluster
                .get_or_init(|| TestCluster::try_start().map_err(|e| e.to_string()))
            {
                Ok(cluster) => match cluster.try_fresh_database() {
                    Ok(url) => Some(PgProbe {
                        url,
                        server_pid: cluster.server_pid(),
                    }),
                    Err(e) => return vec![Row::note_only(profile.name, format!("no database: {e}"), false)],
                },
                Err(e) => {
                    let note = format!("no PostgreSQL (give --pg-url): {e}");
                    eprintln!("  {note}");
                    return vec![Row::note_only(profile.name, note, false)];
                }
            },
        };
        let smsc = TestSmsc::start_in_thread(SmscConfig {
            record: false,
            receipt_delay: self.opts.receipt_delay,
            ..SmscConfig::default()
        });
        if let Some(pg) = &pg
            && !self.ctl.block_on(pg.prepare())
        {
            eprintln!("  note: the server does not preload pg_stat_statements: statements are not counted");
        }
        let smpp_window = gateway_smpp_window(self.opts.window);
        let mut builder = GatewayProcess::builder(&gateway_template(profile))
            .smsc_port(smsc.port())
            .var("smpp_window", &smpp_window.to_string())
            .var("max_binds", &(self.opts.sessions + 8).to_string())
            .ready_timeout(self.opts.ready_timeout);
        if let Some(pg) = &pg {
            builder = builder.var("pg_url", &pg.url);
        }
        let mut gws: Vec<GatewayProcess> = (0..profile.processes).map(|_| builder.clone().spawn()).collect();
        if self.opts.show_config {
            eprintln!(
                "--- config for {} ---\n{}--- end of config ---",
                profile.name,
                gws[0].config()
            );
        }
        let rows = if let [gw] = gws.as_mut_slice() {
            self.run_started(profile, gw, &smsc, pg.as_ref())
        } else {
            self.run_cluster(profile, &mut gws, &smsc, pg.as_ref())
        };
        for gw in &mut gws {
            if let Some(note) = stop_gateway(&self.ctl, gw) {
                eprintln!("  {note}");
            }
        }
        self.ctl.block_on(smsc.shutdown());
        rows
    }

    /// Waits for `/readyz`; a row saying why not when the gateway did not get there.
    fn started(&self, profile: &Profile, gw: &mut GatewayProcess) -> Result<(), Box<Row>> {
        let started = Instant::now();
        match wait_ready(&self.ctl, gw, self.opts.ready_timeout) {
            Ok(()) => eprintln!(
                "  ready in {:.2} s (pid {}, data dir {})",
                started.elapsed().as_secs_f64(),
                gw.pid().unwrap_or(0),
                gw.data_dir().display()
            ),
            Err(StartFailure::Exited {
                status,
                refused_profile: true,
            }) => {
                let note = "refused at startup (not supported by this build)".to_owned();
                let reason = gw
                    .log()
                    .lines()
                    .find(|l| l.contains("unsupported storage profile"))
                    .map(str::trim)
                    .unwrap_or_default()
                    .to_owned();
                eprintln!("  {note}: {status}\n  {reason}");
                if profile.supported {
                    dump_log(gw, profile.name, "refused a profile marked supported");
                }
                return Err(Box::new(Row::note_only(profile.name, note, profile.supported)));
            }
            Err(StartFailure::Exited { status, .. }) => {
                let note = format!("failed at startup ({status})");
                eprintln!("  {note}");
                dump_log(gw, profile.name, "startup failure");
                return Err(Box::new(Row::note_only(profile.name, note, true)));
            }
            Err(StartFailure::NotReady { last }) => {
                let note = format!(
                    "not ready after {} s (last /readyz: {last})",
                    self.opts.ready_timeout.as_secs()
                );
                eprintln!("  {note}");
                dump_log(gw, profile.name, "not ready");
                return Err(Box::new(Row::note_only(profile.name, note, true)));
            }
        }
        if !profile.supported {
            eprintln!(
                "  note: this build accepted {}; mark it supported in PROFILES",
                profile.name
            );
        }
        Ok(())
    }

    fn run_started(
        &self,
        profile: &Profile,
        gw: &mut GatewayProcess,
        smsc: &TestSmsc,
        pg: Option<&PgProbe>,
    ) -> Vec<Row> {
        if let Err(row) = self.started(profile, gw) {
            return vec![*row];
        }
        // The destination binds in the background; submits before that would only queue.
        if !self.ctl.block_on(smsc.wait_bound(1, Duration::from_secs(10))) {
            eprintln!("  warning: the gateway's destination did not bind to the test SMSC within 10 s");
        }

        let mut rows = Vec::new();
        let (row, report) = self.run_phase(profile, Phase::Throughput, None, gw, smsc, pg);
        rows.push(row);
        let Some(report) = report else {
            return rows;
        };
        let rate = match self.opts.latency_rate {
            Some(r) => r,
            None if report.msgs_per_sec.is_finite() && report.msgs_per_sec >= 2.0 => report.msgs_per_sec / 2.0,
            None => {
                rows.push(Row {
                    phase: Some(Phase::Latency),
                    ..Row::note_only(profile.name, "skipped: no phase-1 rate to halve".to_owned(), true)
                });
                return rows;
            }
        };
        if self.opts.latency_count > 0 {
            let (row, _) = self.run_phase(profile, Phase::Latency, Some(rate), gw, smsc, pg);
            rows.push(row);
        }
        rows
    }

    /// Several gateway processes sharing one database: one load generator per process
    /// (its own ESME account, its share of `--count`), all at full speed at once. One
    /// row: the combined rate (messages over the longest run), the worst p50/p99 of the
    /// merged responses, the processes' CPU together, and the database's cost.
    fn run_cluster(
        &self,
        profile: &Profile,
        gws: &mut [GatewayProcess],
        smsc: &TestSmsc,
        pg: Option<&PgProbe>,
    ) -> Vec<Row> {
        for gw in gws.iter_mut() {
            if let Err(row) = self.started(profile, gw) {
                return vec![*row];
            }
        }
        let n = gws.len();
        if !self.ctl.block_on(smsc.wait_bound(n, Duration::from_secs(10))) {
            eprintln!("  warning: not every gateway's destination bound to the test SMSC within 10 s");
        }
        // Until the processes have split the partitions (otherwise the first one would
        // do all the work while the others join).
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let split = gws.iter().all(|gw| {
                let (status, body) = self.ctl.block_on(gw.admin_get("/admin/cluster"));
                let view: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
                status == 200
                    && view["members"].as_u64() == Some(n as u64)
                    && view["releasing"].as_array().is_some_and(Vec::is_empty)
                    && view["held"].as_array().is_some_and(|h| !h.is_empty())
            });
            if split {
                break;
            }
            if Instant::now() > deadline {
                eprintln!("  warning: the processes had not split the partitions after 15 s");
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let label = format!("{} {}", profile.name, Phase::Throughput.name());
        let configs: Vec<LoadConfig> = gws
            .iter()
            .zip(ESME_ACCOUNTS)
            .enumerate()
            .map(|(i, (gw, account))| LoadConfig {
                system_id: account.to_owned(),
                password: account.to_owned(),
                count: self.opts.count / n as u64,
                dest_prefix: format!("447{i}"),
                ..self.load_config(gw, Phase::Throughput, None)
            })
            .collect();
        eprintln!(
            "  [{label}] {} processes × {} messages at full speed, {} sessions × window {} each",
            n, configs[0].count, configs[0].sessions, configs[0].window
        );
        let pids: Vec<u32> = gws.iter().map(|gw| gw.pid().unwrap_or(0)).collect();
        let before: Vec<Option<ProcSample>> = pids.iter().map(|p| sample_proc(*p)).collect();
        let pg_before = pg.and_then(|p| self.ctl.block_on(p.sample()));
        let machine_before = machine_cpu_ticks();
        let runtime = match self.loadgen_runtime() {
            Ok(r) => r,
            Err(note) => return vec![Row::note_only(profile.name, note, true)],
        };
        let timeout = self.opts.phase_timeout;
        let outcome: Result<Vec<LoadReport>, String> = runtime.block_on(async {
            let runs: Vec<_> = configs.into_iter().map(|c| tokio::spawn(loadgen::run(c))).collect();
            let mut reports = Vec::new();
            for run in runs {
                match tokio::time::timeout(timeout, run).await {
                    Ok(Ok(Ok(report))) => reports.push(report),
                    Ok(Ok(Err(e))) => return Err(format!("load generator: {e}")),
                    Ok(Err(e)) => return Err(format!("load generator task: {e}")),
                    Err(_) => return Err(format!("timed out after {} s", timeout.as_secs())),
                }
            }
            Ok(reports)
        });
        runtime.shutdown_timeout(Duration::from_secs(2));
        let machine_busy = busy_share(machine_before, machine_cpu_ticks());
        let after: Vec<Option<ProcSample>> = pids.iter().map(|p| sample_proc(*p)).collect();
        let pg_after = pg.and_then(|p| self.ctl.block_on(p.sample()));
        let reports = match outcome {
            Ok(r) => r,
            Err(note) => {
                eprintln!("  [{label}] {note}: {}", smsc_progress(&smsc.stats()));
                for gw in gws.iter() {
                    dump_log(gw, profile.name, "cluster phase failed");
                }
                return vec![Row {
                    phase: Some(Phase::Throughput),
                    ..Row::note_only(profile.name, note, true)
                }];
            }
        };
        let messages: u64 = reports.iter().map(|r| r.messages).sum();
        let elapsed_s = reports.iter().map(|r| r.elapsed.as_secs_f64()).fold(0.0, f64::max);
        let mut latency = sendium_integration_tests::histogram::Histogram::new();
        for r in &reports {
            latency.merge(&r.resp_latency);
        }
        let errors: u64 = reports
            .iter()
            .map(|r| r.statuses.values().sum::<u64>() + r.no_response + r.session_errors.len() as u64)
            .sum();
        let receipts_missing: u64 = reports.iter().map(|r| r.receipts_missing).sum();
        let cpu_ticks: Option<u64> = before
            .iter()
            .zip(&after)
            .map(|(b, a)| b.zip(*a).map(|(b, a)| a.cpu_ticks.saturating_sub(b.cpu_ticks)))
            .sum();
        let measured = Measured {
            messages,
            elapsed_s,
            msgs_per_sec: if elapsed_s > 0.0 {
                messages as f64 / elapsed_s
            } else {
                0.0
            },
            p50_ms: latency.percentile_ms(50.0).unwrap_or(0.0),
            p99_ms: latency.percentile_ms(99.0).unwrap_or(0.0),
            peak_rss_mib: after
                .iter()
                .map(|a| a.map(|a| a.hwm_kib as f64 / 1024.0))
                .sum::<Option<f64>>(),
            cpu_s_per_10k: cpu_ticks
                .filter(|_| messages > 0)
                .map(|t| t as f64 / self.ticks_per_s as f64 / messages as f64 * 10_000.0),
            receipts_missing,
            errors,
        };
        let per_process: Vec<String> = reports.iter().map(|r| format!("{:.0}", r.msgs_per_sec)).collect();
        let mut notes = vec![format!(
            "{n} processes ({} msg/s each); RSS and CPU summed",
            per_process.join(" + ")
        )];
        let mut detail = json!({
            "processes": n,
            "per_process": reports.iter().map(LoadReport::to_json).collect::<Vec<_>>(),
            "machine_busy": machine_busy,
        });
        if let Some(cost) = pg_before
            .zip(pg_after)
            .and_then(|(b, a)| b.cost_until(&a, messages, self.ticks_per_s))
        {
            notes.push(pg_note(&cost));
            detail["postgresql"] = pg_json(&cost);
        }
        if let Some(busy) = machine_busy {
            notes.push(format!("machine {:.0}% busy", busy * 100.0));
        }
        if errors > 0 || receipts_missing > 0 {
            notes.push(format!("{errors} errors, {receipts_missing} receipts missing"));
            for gw in gws.iter() {
                dump_log(gw, profile.name, "errors or receipts missing");
            }
        }
        eprintln!(
            "  [{label}] {messages} messages in {elapsed_s:.2} s = {:.0} msg/s; {}",
            measured.msgs_per_sec,
            notes.join("; ")
        );
        vec![Row {
            profile: profile.name.to_owned(),
            round: None,
            phase: Some(Phase::Throughput),
            failed: errors > 0 || receipts_missing > 0 || messages == 0,
            measured: Some(measured),
            note: notes.join("; "),
            detail,
        }]
    }
}

/// The database's cost of a phase, per message, for the notes column.
fn pg_note(cost: &PgCost) -> String {
    let mut parts = Vec::new();
    if let Some(st) = cost.statements_per_msg {
        parts.push(format!("{st:.3} statements/msg"));
    }
    parts.push(format!("{:.0} B WAL/msg", cost.wal_bytes_per_msg));
    if let Some(cpu) = cost.server_cpu_s_per_10k {
        parts.push(format!("database CPU {cpu:.2} s/10k"));
    }
    parts.join(", ")
}

fn pg_json(cost: &PgCost) -> Value {
    json!({
        "statements_per_msg": cost.statements_per_msg,
        "wal_bytes_per_msg": cost.wal_bytes_per_msg,
        "server_cpu_s_per_10k": cost.server_cpu_s_per_10k,
    })
}

fn resources_json(before: Option<ProcSample>, after: Option<ProcSample>, hwm_reset: bool, ticks: u64) -> Value {
    let s = |p: Option<ProcSample>| {
        p.map(|p| json!({"vm_hwm_kib": p.hwm_kib, "vm_rss_kib": p.rss_kib, "cpu_ticks": p.cpu_ticks}))
    };
    json!({
        "before": s(before),
        "after": s(after),
        "peak_rss_reset_before_phase": hwm_reset,
        "clk_tck": ticks,
    })
}

// ---------------------------------------------------------------------------------------
// output

const HEADERS: [&str; 12] = [
    "profile",
    "phase",
    "messages",
    "elapsed s",
    "msgs/s",
    "p50 ms",
    "p99 ms",
    "peak RSS MiB",
    "CPU s/10k msgs",
    "receipts missing",
    "errors",
    "note",
];

fn cells(row: &Row) -> Vec<String> {
    let phase = row.phase.map(Phase::name).unwrap_or("-").to_owned();
    let opt = |v: Option<f64>, prec: usize| v.map(|v| format!("{v:.prec$}")).unwrap_or_else(|| "-".to_owned());
    let profile = match row.round {
        Some(k) => format!("{} #{k}", row.profile),
        None => row.profile.clone(),
    };
    let mut out = vec![profile, phase];
    match &row.measured {
        Some(m) => out.extend([
            m.messages.to_string(),
            format!("{:.2}", m.elapsed_s),
            format!("{:.0}", m.msgs_per_sec),
            format!("{:.2}", m.p50_ms),
            format!("{:.2}", m.p99_ms),
            opt(m.peak_rss_mib, 1),
            opt(m.cpu_s_per_10k, 3),
            m.receipts_missing.to_string(),
            m.errors.to_string(),
        ]),
        None => out.extend(std::iter::repeat_n("-".to_owned(), 9)),
    }
    out.push(row.note.clone());
    out
}

/// The main table's figures are right-aligned; the profile, the phase and the note (last)
/// left-aligned.
fn main_right(i: usize) -> bool {
    i >= 2 && i < HEADERS.len() - 1
}

/// The summary's figures (from "rounds" on) are right-aligned.
fn summary_right(i: usize) -> bool {
    i >= 2
}

const SUMMARY_TITLE: &str = "Over the rounds (median, and min–max):";

fn text_table(rows: &[Row]) -> String {
    text_grid(&HEADERS, rows.iter().map(cells).collect(), main_right)
}

/// Space-aligned columns; `right(i)` says which are right-aligned.
fn text_grid(headers: &[&str], rows: Vec<Vec<String>>, right: fn(usize) -> bool) -> String {
    let all: Vec<Vec<String>> = std::iter::once(headers.iter().map(|h| (*h).to_owned()).collect())
        .chain(rows)
        .collect();
    let mut widths = vec![0usize; headers.len()];
    for r in &all {
        for (i, c) in r.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(c.chars().count());
            }
        }
    }
    let mut out = String::new();
    for r in &all {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            let pad = widths.get(i).copied().unwrap_or(0).saturating_sub(c.chars().count());
            let last = i + 1 == r.len();
            if right(i) {
                line.push_str(&" ".repeat(pad));
                line.push_str(c);
            } else {
                line.push_str(c);
                if !last {
                    line.push_str(&" ".repeat(pad));
                }
            }
            if !last {
                line.push_str("  ");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn md_escape(s: &str) -> String {
    s.replace('|', "\\|")
}

/// The command, machine and load lines that head the markdown output.
fn markdown_context(ctx: &RunContext) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "Command: `{}`\n", ctx.command);
    let _ = writeln!(
        out,
        "Machine: {} CPUs (`nproc`), kernel {}{}; {}.\n",
        ctx.nproc,
        ctx.kernel,
        ctx.cpu_model.as_deref().map(|m| format!(", {m}")).unwrap_or_default(),
        ctx.sendium_version
    );
    let _ = writeln!(out, "Load: {}\n", ctx.settings);
    out
}

fn markdown(rows: &[Row], ctx: &RunContext) -> String {
    let mut out = markdown_context(ctx);
    out.push_str(&md_table(&HEADERS, rows.iter().map(cells), main_right));
    let summary = summarize(rows);
    if !summary.is_empty() {
        let _ = writeln!(out, "\n{SUMMARY_TITLE}\n");
        out.push_str(&md_table(
            &SUMMARY_HEADERS,
            summary.iter().map(summary_cells),
            summary_right,
        ));
    }
    out
}

/// A markdown table; `right(i)` says which columns are right-aligned.
fn md_table(headers: &[&str], rows: impl Iterator<Item = Vec<String>>, right: fn(usize) -> bool) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "| {} |", headers.join(" | "));
    let align: Vec<&str> = (0..headers.len())
        .map(|i| if right(i) { "---:" } else { "---" })
        .collect();
    let _ = writeln!(out, "|{}|", align.join("|"));
    for row in rows {
        let c: Vec<String> = row.iter().map(|c| md_escape(c)).collect();
        let _ = writeln!(out, "| {} |", c.join(" | "));
    }
    out
}

/// One profile and phase over the rounds of `--rounds`.
struct Summary {
    profile: String,
    phase: Phase,
    rounds: usize,
    msgs_per_sec: Spread,
    p50_ms: Spread,
    p99_ms: Spread,
}

/// Median and range of one figure over the rounds.
#[derive(Debug, PartialEq)]
struct Spread {
    median: f64,
    min: f64,
    max: f64,
}

impl Spread {
    /// None for no values. The median of an even count is the mean of the middle two.
    fn of(mut values: Vec<f64>) -> Option<Spread> {
        values.sort_by(f64::total_cmp);
        let n = values.len();
        let (min, max) = (*values.first()?, *values.last()?);
        let median = if n % 2 == 1 {
            values[n / 2]
        } else {
            (values[n / 2 - 1] + values[n / 2]) / 2.0
        };
        Some(Spread { median, min, max })
    }

    fn show(&self, prec: usize) -> String {
        format!("{:.prec$} ({:.prec$}–{:.prec$})", self.median, self.min, self.max)
    }

    fn json(&self) -> Value {
        json!({ "median": self.median, "min": self.min, "max": self.max })
    }
}

const SUMMARY_HEADERS: [&str; 6] = ["profile", "phase", "rounds", "msgs/s", "p50 ms", "p99 ms"];

/// Per profile and phase, in first-seen order, over the measured rows of every round
/// (none when the bench ran one round). A failed round's figures are left out; `rounds`
/// counts the ones that were kept.
fn summarize(rows: &[Row]) -> Vec<Summary> {
    let mut groups: Vec<(String, Phase, Vec<&Measured>)> = Vec::new();
    for row in rows.iter().filter(|r| r.round.is_some() && !r.failed) {
        let (Some(phase), Some(m)) = (row.phase, &row.measured) else {
            continue;
        };
        match groups.iter_mut().find(|(p, ph, _)| *p == row.profile && *ph == phase) {
            Some((_, _, ms)) => ms.push(m),
            None => groups.push((row.profile.clone(), phase, vec![m])),
        }
    }
    groups
        .into_iter()
        .filter_map(|(profile, phase, ms)| {
            let spread = |f: fn(&Measured) -> f64| Spread::of(ms.iter().map(|m| f(m)).collect());
            Some(Summary {
                profile,
                phase,
                rounds: ms.len(),
                msgs_per_sec: spread(|m| m.msgs_per_sec)?,
                p50_ms: spread(|m| m.p50_ms)?,
                p99_ms: spread(|m| m.p99_ms)?,
            })
        })
        .collect()
}

fn summary_cells(s: &Summary) -> Vec<String> {
    vec![
        s.profile.clone(),
        s.phase.name().to_owned(),
        s.rounds.to_string(),
        s.msgs_per_sec.show(0),
        s.p50_ms.show(2),
        s.p99_ms.show(2),
    ]
}

fn json_output(rows_in: &[Row], ctx: &RunContext) -> Value {
    let rows: Vec<Value> = rows_in
        .iter()
        .map(|r| {
            let mut v = json!({
                "profile": r.profile,
                "round": r.round,
                "phase": r.phase.map(Phase::name),
                "note": r.note,
                "failed": r.failed,
            });
            if let Some(m) = &r.measured {
                v["messages"] = json!(m.messages);
                v["elapsed_s"] = json!(m.elapsed_s);
                v["msgs_per_sec"] = json!(m.msgs_per_sec);
                v["p50_ms"] = json!(m.p50_ms);
                v["p99_ms"] = json!(m.p99_ms);
                v["peak_rss_mib"] = json!(m.peak_rss_mib);
                v["cpu_s_per_10k_msgs"] = json!(m.cpu_s_per_10k);
                v["receipts_missing"] = json!(m.receipts_missing);
                v["errors"] = json!(m.errors);
            }
            v["detail"] = r.detail.clone();
            v
        })
        .collect();
    json!({
        "command": ctx.command,
        "machine": {
            "nproc": ctx.nproc,
            "kernel": ctx.kernel,
            "cpu_model": ctx.cpu_model,
        },
        "sendium": ctx.sendium_version,
        "sendium_bin": ctx.bin.display().to_string(),
        "settings": ctx.settings_json,
        "rows": rows,
        "summary": summarize(rows_in)
            .iter()
            .map(|s| json!({
                "profile": s.profile,
                "phase": s.phase.name(),
                "rounds": s.rounds,
                "msgs_per_sec": s.msgs_per_sec.json(),
                "p50_ms": s.p50_ms.json(),
                "p99_ms": s.p99_ms.json(),
            }))
            .collect::<Vec<Value>>(),
    })
}

struct RunContext {
    command: String,
    nproc: String,
    kernel: String,
    cpu_model: Option<String>,
    sendium_version: String,
    bin: PathBuf,
    settings: String,
    settings_json: Value,
}

fn shell_quote(arg: &str) -> String {
    let plain = !arg.is_empty()
        && arg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=,+@%".contains(c));
    if plain {
        arg.to_owned()
    } else {
        format!("'{}'", arg.replace('\'', "'\\''"))
    }
}

fn command_output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
}

fn run_context(opts: &Options, bin: PathBuf, ticks: u64) -> RunContext {
    let args: Vec<String> = std::env::args().collect();
    let command = args.iter().map(|a| shell_quote(a)).collect::<Vec<_>>().join(" ");
    let nproc = command_output("nproc", &[]).unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.to_string())
            .unwrap_or_else(|_| "?".into())
    });
    let kernel = command_output("uname", &["-r"]).unwrap_or_else(|| "unknown".into());
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, m)| m.trim().to_owned())
    });
    let sendium_version = command_output(&bin.display().to_string(), &["version"]).unwrap_or_else(|| "sendium".into());
    let smpp_window = gateway_smpp_window(opts.window);
    let settings = format!(
        "{} sessions × window {} (gateway SMPP window {smpp_window}, destination window 500), mix {}, \
         every message asks for a receipt, test SMSC receipt delay {} ms; phase 1 {} messages at full speed, \
         phase 2 {} messages at {}; load generator on {} threads in the same machine.",
        opts.sessions,
        opts.window,
        opts.mix_text,
        opts.receipt_delay.as_millis(),
        opts.count,
        opts.latency_count,
        opts.latency_rate
            .map(|r| format!("{r:.0} msg/s"))
            .unwrap_or_else(|| "half the phase-1 rate".into()),
        opts.threads,
    );
    let settings_json = json!({
        "sessions": opts.sessions,
        "window": opts.window,
        "gateway_smpp_window": smpp_window,
        "destination_window": 500,
        "mix": opts.mix_text,
        "count": opts.count,
        "latency_count": opts.latency_count,
        "latency_rate": opts.latency_rate,
        "receipt_delay_ms": opts.receipt_delay.as_millis() as u64,
        "loadgen_threads": opts.threads,
        "phase_timeout_s": opts.phase_timeout.as_secs(),
        "clk_tck": ticks,
    });
    RunContext {
        command,
        nproc,
        kernel,
        cpu_model,
        sendium_version,
        bin,
        settings,
        settings_json,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match parse_args(&args) {
        Ok(Some(o)) => o,
        Ok(None) => return,
        Err(e) => {
            eprintln!("sendium-bench: {e}\n\n{USAGE}");
            std::process::exit(2);
        }
    };
    let bin = match gateway::locate_binary() {
        Ok(b) => b,
        Err(e) => {
            eprintln!(
                "sendium-bench: {e}\n(for the release build: cargo build --release -p sendium-ops -p sendium-integration-tests)"
            );
            std::process::exit(2);
        }
    };
    let ctl = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sendium-bench: cannot start a runtime: {e}");
            std::process::exit(1);
        }
    };
    let ticks_per_s = sendium_integration_tests::util::clock_ticks_per_second();
    let ctx = run_context(&opts, bin.clone(), ticks_per_s);
    eprintln!("sendium-bench: {} ({})", ctx.sendium_version, bin.display());
    eprintln!("load: {}", ctx.settings);
    let bench = Bench {
        opts,
        ctl,
        ticks_per_s,
        pg_cluster: std::sync::OnceLock::new(),
    };
    let mut rows = Vec::new();
    let mut outbox_runs = Vec::new();
    let mut flood_runs = Vec::new();
    let mut http_runs = Vec::new();
    let mut mo_runs = Vec::new();
    let mut provider_runs = Vec::new();
    let rounds = bench.opts.rounds;
    for round in 1..=rounds {
        for profile in &bench.opts.profiles {
            rows.extend(bench.run_profile(profile).into_iter().map(|mut row| {
                row.round = (rounds > 1).then_some(round);
                row
            }));
        }
        if bench.opts.outbox {
            let mut run = bench.run_outbox();
            run.round = (rounds > 1).then_some(round);
            outbox_runs.push(run);
        }
        if bench.opts.flood {
            let mut run = bench.run_flood();
            run.round = (rounds > 1).then_some(round);
            flood_runs.push(run);
        }
        if bench.opts.http {
            http_runs.extend(bench.run_http(round).into_iter().map(|mut run| {
                run.round = (rounds > 1).then_some(round);
                run
            }));
        }
        if bench.opts.mo {
            mo_runs.extend(bench.run_mo(round).into_iter().map(|mut run| {
                run.round = (rounds > 1).then_some(round);
                run
            }));
        }
        if bench.opts.http_destination {
            provider_runs.extend(bench.run_http_destination(round).into_iter().map(|mut run| {
                run.round = (rounds > 1).then_some(round);
                run
            }));
        }
    }
    let failed = rows.iter().any(|r| r.failed)
        || outbox_runs.iter().any(|r| r.failed)
        || flood_runs.iter().any(|r| r.failed)
        || http_runs.iter().any(|r| r.failed)
        || mo_runs.iter().any(|r| r.failed)
        || provider_runs.iter().any(|r| r.failed);
    let http_settings = http_phase::settings(
        bench.opts.http_clients,
        bench.opts.http_messages,
        bench.opts.receipt_delay,
    );
    let http_summary = http_phase::summarize(&http_runs);
    if bench.opts.json {
        let mut out = json_output(&rows, &ctx);
        out["outbox"] = Value::Array(outbox_runs.iter().map(outbox::OutboxRun::json).collect());
        out["flood"] = Value::Array(flood_runs.iter().map(flood::FloodRun::json).collect());
        out["mo"] = Value::Array(mo_runs.iter().map(rate_run::RateRun::json).collect());
        out["http_destination"] = Value::Array(provider_runs.iter().map(rate_run::RateRun::json).collect());
        if bench.opts.http {
            out["http"] = json!({
                "settings": http_settings,
                "rows": http_runs.iter().map(http_phase::HttpRun::json).collect::<Vec<Value>>(),
                "summary": http_summary.iter().map(http_phase::HttpSummary::json).collect::<Vec<Value>>(),
            });
        }
        println!("{out}");
    } else if bench.opts.markdown {
        if rows.is_empty() {
            print!("{}", markdown_context(&ctx));
        } else {
            print!("{}", markdown(&rows, &ctx));
        }
        if !http_runs.is_empty() {
            println!("\nHTTP phase: {http_settings}\n");
            print!(
                "{}",
                md_table(
                    &http_phase::HEADERS,
                    http_runs.iter().map(http_phase::HttpRun::cells),
                    http_phase::right
                )
            );
            if !http_summary.is_empty() {
                println!("\n{SUMMARY_TITLE}\n");
                print!(
                    "{}",
                    md_table(
                        &http_phase::SUMMARY_HEADERS,
                        http_summary.iter().map(http_phase::HttpSummary::cells),
                        http_phase::summary_right
                    )
                );
            }
        }
        if !mo_runs.is_empty() {
            println!("\nInbound phase:\n");
            print!(
                "{}",
                md_table(&rate_run::HEADERS, mo_runs.iter().map(rate_run::RateRun::cells), |i| i
                    >= 2)
            );
        }
        if !provider_runs.is_empty() {
            println!("\nHTTP-destination phase:\n");
            print!(
                "{}",
                md_table(
                    &rate_run::HEADERS,
                    provider_runs.iter().map(rate_run::RateRun::cells),
                    |i| i >= 2
                )
            );
        }
        if !flood_runs.is_empty() {
            println!("\nFlood phase:\n");
            print!(
                "{}",
                md_table(&flood::HEADERS, flood_runs.iter().map(flood::FloodRun::cells), |i| i
                    >= 1)
            );
        }
        if !outbox_runs.is_empty() {
            println!("\nOutbox phase:\n");
            print!(
                "{}",
                md_table(
                    &outbox::HEADERS,
                    outbox_runs.iter().map(outbox::OutboxRun::cells),
                    |i| (1..10).contains(&i)
                )
            );
        }
    } else {
        if !rows.is_empty() {
            println!();
            print!("{}", text_table(&rows));
        }
        let summary = summarize(&rows);
        if !summary.is_empty() {
            println!("\n{SUMMARY_TITLE}");
            print!(
                "{}",
                text_grid(
                    &SUMMARY_HEADERS,
                    summary.iter().map(summary_cells).collect(),
                    summary_right
                )
            );
        }
        if !http_runs.is_empty() {
            println!("\nHTTP phase: {http_settings}");
            print!(
                "{}",
                text_grid(
                    &http_phase::HEADERS,
                    http_runs.iter().map(http_phase::HttpRun::cells).collect(),
                    http_phase::right
                )
            );
            if !http_summary.is_empty() {
                println!("\n{SUMMARY_TITLE}");
                print!(
                    "{}",
                    text_grid(
                        &http_phase::SUMMARY_HEADERS,
                        http_summary.iter().map(http_phase::HttpSummary::cells).collect(),
                        http_phase::summary_right
                    )
                );
            }
        }
        if !mo_runs.is_empty() {
            println!("\nInbound phase:");
            print!(
                "{}",
                text_grid(
                    &rate_run::HEADERS,
                    mo_runs.iter().map(rate_run::RateRun::cells).collect(),
                    |i| i >= 2
                )
            );
        }
        if !provider_runs.is_empty() {
            println!("\nHTTP-destination phase:");
            print!(
                "{}",
                text_grid(
                    &rate_run::HEADERS,
                    provider_runs.iter().map(rate_run::RateRun::cells).collect(),
                    |i| i >= 2
                )
            );
        }
        if !flood_runs.is_empty() {
            println!("\nFlood phase:");
            print!(
                "{}",
                text_grid(
                    &flood::HEADERS,
                    flood_runs.iter().map(flood::FloodRun::cells).collect(),
                    |i| i >= 1
                )
            );
        }
        if !outbox_runs.is_empty() {
            println!("\nOutbox phase:");
            print!(
                "{}",
                text_grid(
                    &outbox::HEADERS,
                    outbox_runs.iter().map(outbox::OutboxRun::cells).collect(),
                    |i| (1..10).contains(&i)
                )
            );
        }
        println!(
            "\n{} CPUs{}, kernel {}; {}",
            ctx.nproc,
            ctx.cpu_model.as_deref().map(|m| format!(" ({m})")).unwrap_or_default(),
            ctx.kernel,
            ctx.settings
        );
    }
    if failed {
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_busy_share_counts_idle_and_iowait_as_not_busy() {
        let before = parse_machine_cpu("cpu  100 0 50 800 50 0 0 0 0 0").unwrap();
        assert_eq!(before, (150, 1000));
        let after = parse_machine_cpu("cpu  400 0 150 1100 150 0 200 0 0 0").unwrap();
        assert_eq!(after, (750, 2000));
        assert_eq!(busy_share(Some(before), Some(after)), Some(0.6));
        assert_eq!(busy_share(Some(after), Some(after)), None, "no time passed");
        assert_eq!(
            parse_machine_cpu("cpu0 1 2 3 4 5 6 7 8"),
            None,
            "only the all-cores line"
        );
    }

    #[test]
    fn buckets_are_read_per_series_in_bound_order() {
        let text = "# TYPE x histogram\n\
            sendium_storage_fsync_seconds_bucket{file=\"journal\",le=\"+Inf\"} 9\n\
            sendium_storage_fsync_seconds_bucket{file=\"journal\",le=\"0.001\"} 7\n\
            sendium_storage_fsync_seconds_bucket{file=\"routed-work.redb\",le=\"0.001\"} 3\n\
            sendium_admission_seconds_bucket{le=\"0.005\"} 4\n";
        assert_eq!(
            buckets(text, JOURNAL_SYNC_BUCKETS),
            Some(vec![(0.001, 7.0), (f64::INFINITY, 9.0)])
        );
        assert_eq!(buckets(text, ADMISSION_BUCKETS), Some(vec![(0.005, 4.0)]));
        assert_eq!(buckets("", ADMISSION_BUCKETS), None);
    }

    #[test]
    fn background_syncs_count_every_store_file_but_the_pending_stages() {
        let text = "sendium_storage_fsync_seconds_count{file=\"journal\"} 900\n\
            sendium_storage_fsync_seconds_count{file=\"pending.journal\"} 1\n\
            sendium_storage_fsync_seconds_count{file=\"pending.redb\"} 4\n\
            sendium_storage_fsync_seconds_count{file=\"router-queue.redb\"} 30\n\
            sendium_storage_fsync_seconds_count{file=\"routed-work.redb\"} 20\n\
            sendium_storage_fsync_seconds_sum{file=\"routed-work.redb\"} 0.5\n\
            sendium_storage_fsyncs_total 954\n";
        assert_eq!(background_syncs(&metric_series(text)), 50.0);
        assert_eq!(background_syncs(&metric_series("")), 0.0);
    }

    #[test]
    fn bucket_p99_reads_the_phase_from_two_scrapes() {
        // Cumulative buckets: 10 admissions before the phase, then 100 more of which 90
        // within 5 ms, 99 within 10 ms, all within 15 ms.
        let before = [(0.005, 10.0), (0.01, 10.0), (0.015, 10.0), (f64::INFINITY, 10.0)];
        let after = [(0.005, 100.0), (0.01, 109.0), (0.015, 110.0), (f64::INFINITY, 110.0)];
        let (p99, within) = bucket_p99(&before, &after).unwrap();
        assert_eq!(p99, 10.0);
        assert!((within - 0.9).abs() < 1e-9, "{within}");
        assert_eq!(bucket_p99(&after, &after), None, "no admissions in the phase");
    }

    #[test]
    fn profiles_are_consistent() {
        let mut names: Vec<&str> = PROFILES.iter().map(|p| p.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), PROFILES.len(), "profile names are unique");
        for p in PROFILES {
            let storage = p.storage();
            assert_eq!(p.needs_data_dir(), storage.contains("{data_dir}"), "{}", p.name);
            assert_eq!(p.needs_pg_url(), storage.contains("{pg_url}"), "{}", p.name);
            for table in ["[sms.pending]", "[sms.router-queue]", "[sms.routed-work]", "[dlr]"] {
                assert!(storage.contains(table), "{} lacks {table}", p.name);
            }
            let vars = vec![
                ("smpp_port", "1".to_owned()),
                ("http_port", "2".to_owned()),
                ("admin_port", "3".to_owned()),
                ("data_dir", "/tmp/d".to_owned()),
                ("smsc_port", "4".to_owned()),
                ("smpp_window", "512".to_owned()),
                ("max_binds", "12".to_owned()),
                ("pg_url", "postgres://x@127.0.0.1/y".to_owned()),
            ];
            let rendered = gateway::render_template(&gateway_template(p), &vars).unwrap();
            assert!(!rendered.contains("{storage}"));
            assert!(rendered.contains("max-binds = 12"));
        }
        assert!(find_profile("memory").is_some_and(|p| p.supported));
    }

    #[test]
    fn proc_parsing() {
        let status = "Name:\tsendium\nVmPeak:\t  900 kB\nVmHWM:\t   51200 kB\nVmRSS:\t   40960 kB\n";
        assert_eq!(status_kib(status, "VmHWM"), Some(51200));
        assert_eq!(status_kib(status, "VmRSS"), Some(40960));
        assert_eq!(status_kib(status, "VmSwap"), None);
        let stat = "1234 (sen dium) (x)) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 9 0 100 1000 200";
        assert_eq!(stat_cpu_ticks(stat), Some(325));
        let me = sample_proc(std::process::id()).unwrap();
        assert!(me.hwm_kib >= me.rss_kib / 2 && me.rss_kib > 0);
    }

    #[test]
    fn metric_parsing() {
        let text = "# HELP sendium_admitted_total x\n# TYPE sendium_admitted_total counter\n\
                    sendium_admitted_total{account=\"bench\"} 10\nsendium_admitted_total{account=\"b\"} 5\n\
                    sendium_ready 1\nsendium_x_bucket{le=\"1\"} 3\nother_metric 7\n";
        let series = metric_series(text);
        assert_eq!(series.get("sendium_admitted_total{account=\"b\"}"), Some(&5.0));
        let m = metric_sums(&series);
        assert_eq!(m.get("sendium_admitted_total"), Some(&15.0));
        assert_eq!(m.get("sendium_ready"), Some(&1.0));
        assert!(!m.contains_key("sendium_x_bucket") && !m.contains_key("other_metric"));
    }

    #[test]
    fn args() {
        let parse = |a: &[&str]| parse_args(&a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
        let o = parse(&[]).unwrap().unwrap();
        assert!(o.profiles.iter().all(|p| p.supported));
        assert_eq!(
            (o.count, o.latency_count, o.sessions, o.window),
            (200_000, 100_000, 4, 256)
        );
        let o = parse(&["--include-unsupported"]).unwrap().unwrap();
        assert_eq!(o.profiles.len(), PROFILES.len());
        let o = parse(&["--profile", "file-file-file", "--profile=memory", "--count=10"])
            .unwrap()
            .unwrap();
        let names: Vec<&str> = o.profiles.iter().map(|p| p.name).collect();
        assert_eq!(names, ["file-file-file", "memory"]);
        assert_eq!(o.count, 10);
        assert!(parse(&["--profile", "nope"]).unwrap_err().contains("memory"));
        assert!(parse(&["--markdown", "--json"]).is_err());
        assert!(parse(&["--count", "x"]).is_err());
        assert!(parse(&["--rounds", "0"]).is_err());
        assert_eq!(parse(&["--rounds", "8"]).unwrap().unwrap().rounds, 8);
        assert_eq!(parse(&[]).unwrap().unwrap().rounds, 1);
        let o = parse(&[]).unwrap().unwrap();
        assert!(
            o.http && o.outbox && !o.flood,
            "the default run includes the HTTP phase"
        );
        assert_eq!((o.http_messages, o.http_clients), (200_000, 50));
        let o = parse(&["--http", "--http-clients=8", "--http-messages", "1000"])
            .unwrap()
            .unwrap();
        assert!(o.http && !o.outbox && o.profiles.is_empty(), "--http alone");
        assert_eq!((o.http_messages, o.http_clients), (1000, 8));
        assert!(!parse(&["--profile", "memory"]).unwrap().unwrap().http);
        assert!(parse(&["--http=1"]).is_err());
        assert!(parse(&["--http-clients", "0"]).is_err());
        let o = parse(&["--http-profile", "file-file-file", "--http-profile", "memory"])
            .unwrap()
            .unwrap();
        let names: Vec<&str> = o.http_profiles.iter().map(|p| p.name).collect();
        assert_eq!(names, ["file-file-file", "memory"]);
        assert!(
            o.http && !o.outbox && o.profiles.is_empty(),
            "--http-profile implies --http alone"
        );
        assert!(parse(&["--http-profile", "nonesuch"]).is_err());
    }

    fn test_context(command: &str) -> RunContext {
        RunContext {
            command: command.into(),
            nproc: "2".into(),
            kernel: "6.1".into(),
            cpu_model: None,
            sendium_version: "sendium 0.1.0".into(),
            bin: PathBuf::from("sendium"),
            settings: "s".into(),
            settings_json: Value::Null,
        }
    }

    fn measured_row(profile: &str, round: usize, phase: Phase, msgs_per_sec: f64, p99_ms: f64) -> Row {
        Row {
            profile: profile.into(),
            round: Some(round),
            phase: Some(phase),
            measured: Some(Measured {
                messages: 100,
                elapsed_s: 1.0,
                msgs_per_sec,
                p50_ms: 1.0,
                p99_ms,
                peak_rss_mib: None,
                cpu_s_per_10k: None,
                receipts_missing: 0,
                errors: 0,
            }),
            note: String::new(),
            failed: false,
            detail: Value::Null,
        }
    }

    #[test]
    fn spread_median_and_range() {
        assert_eq!(Spread::of(Vec::new()), None);
        let odd = Spread::of(vec![9.0, 1.0, 5.0]).unwrap();
        assert_eq!(
            odd,
            Spread {
                median: 5.0,
                min: 1.0,
                max: 9.0
            }
        );
        let even = Spread::of(vec![4.0, 10.0, 2.0, 6.0]).unwrap();
        assert_eq!(
            even,
            Spread {
                median: 5.0,
                min: 2.0,
                max: 10.0
            }
        );
        assert_eq!(even.show(1), "5.0 (2.0–10.0)");
    }

    #[test]
    fn summary_over_rounds() {
        let mut failed = measured_row("memory", 3, Phase::Latency, 1.0, 999.0);
        failed.failed = true;
        let rows = vec![
            measured_row("file-file-file", 1, Phase::Throughput, 30_000.0, 60.0),
            measured_row("file-file-file", 1, Phase::Latency, 15_000.0, 7.0),
            measured_row("memory", 1, Phase::Latency, 28_000.0, 2.0),
            measured_row("file-file-file", 2, Phase::Throughput, 26_000.0, 80.0),
            measured_row("file-file-file", 2, Phase::Latency, 13_000.0, 5.0),
            measured_row("memory", 2, Phase::Latency, 26_000.0, 1.0),
            failed,
            Row {
                round: Some(3),
                ..Row::note_only("memory", "skipped".into(), true)
            },
        ];
        let summary = summarize(&rows);
        let keys: Vec<(&str, &str, usize)> = summary
            .iter()
            .map(|s| (s.profile.as_str(), s.phase.name(), s.rounds))
            .collect();
        assert_eq!(
            keys,
            [
                ("file-file-file", "throughput", 2),
                ("file-file-file", "latency", 2),
                ("memory", "latency", 2)
            ]
        );
        assert_eq!(
            summary[1].p99_ms,
            Spread {
                median: 6.0,
                min: 5.0,
                max: 7.0
            }
        );
        assert_eq!(summary[0].msgs_per_sec.median, 28_000.0);
        assert_eq!(summary[2].p99_ms.max, 2.0, "the failed round is left out");

        let one_round: Vec<Row> = rows.into_iter().map(|r| Row { round: None, ..r }).collect();
        assert!(summarize(&one_round).is_empty(), "no summary for a single round");

        let ctx = test_context("sendium-bench --rounds 2 --markdown");
        let rows = vec![
            measured_row("memory", 1, Phase::Latency, 28_000.0, 2.0),
            measured_row("memory", 2, Phase::Latency, 26_000.0, 1.0),
        ];
        let md = markdown(&rows, &ctx);
        assert!(md.contains("| memory #2 | latency |"), "{md}");
        assert!(
            md.contains("| memory | latency | 2 | 27000 (26000–28000) | 1.00 (1.00–1.00) | 1.50 (1.00–2.00) |"),
            "{md}"
        );
        let json = json_output(&rows, &ctx);
        assert_eq!(json["rows"][1]["round"], 2);
        assert_eq!(json["summary"][0]["p99_ms"]["median"], 1.5);
        let text = text_grid(
            &SUMMARY_HEADERS,
            summarize(&rows).iter().map(summary_cells).collect(),
            summary_right,
        );
        assert_eq!(text.lines().count(), 2);
    }

    #[test]
    fn tables() {
        let mut row = measured_row("memory", 1, Phase::Throughput, 10.0, 2.0);
        row.round = None;
        if let Some(m) = &mut row.measured {
            m.messages = 10;
            m.peak_rss_mib = Some(20.0);
        }
        let rows = vec![
            row,
            Row::note_only("file-file-file", "refused | at startup".into(), false),
        ];
        let text = text_table(&rows);
        assert_eq!(text.lines().count(), 3);
        assert!(text.contains("refused | at startup"));
        let ctx = test_context("sendium-bench --markdown");
        let md = markdown(&rows, &ctx);
        assert!(md.contains("| memory | throughput | 10 | 1.00 | 10 | 1.00 | 2.00 | 20.0 | - | 0 | 0 |  |"));
        assert!(md.contains("refused \\| at startup"));
        assert_eq!(json_output(&rows, &ctx)["rows"][0]["messages"], 10);
        assert_eq!(shell_quote("--mix=gsm=1"), "--mix=gsm=1");
        assert_eq!(shell_quote("a b"), "'a b'");
    }
}
