//! The HTTP phase of `sendium-bench`: `POST /v1/messages` throughput and the gateway's CPU
//! per message, with and without a `callback_url`, on the memory profile and on
//! file/file/file with the file DLR store.
//!
//! Per profile one release gateway (the bench's template plus an `[http]` listener, an API
//! key for the `bench` account and `callback-allow = ["127.0.0.0/8"]`, without which the
//! loopback callback is refused at submission) with the test SMSC as its destination, and
//! two rows on it (their order alternates by round):
//!
//! - **no callback**: the gateway asks the provider for no receipt (`registered_delivery`
//!   0), so the row ends when the test SMSC has accepted every message and the gateway
//!   has completed them (`sendium_completed_total`);
//! - **callback_url**: the row ends when every accepted message's receipt callback has
//!   reached the bench's callback sink (the test SMSC sends the receipt after
//!   `--receipt-delay-ms`).
//!
//! The load: `--http-clients` tasks, each on its own keep-alive HTTP/1.1 connection (a
//! new one when the server closes it), one message per request, until `--http-messages`
//! are accepted. The client and the sink are written by hand over `TcpStream` with reused
//! buffers: they share the two cores with the gateway, and a heavier client would lower
//! the gateway's throughput without changing its CPU per message. The window runs from
//! the first request (connections are open before it) to the row's end; the gateway's
//! utime+stime over it, per accepted message, is the CPU figure.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use sendium_integration_tests::gateway::GatewayProcess;
use sendium_integration_tests::histogram::Histogram;
use sendium_integration_tests::http_load::{ClientReport, Load, Sink, SinkShared, client, connect};
use sendium_integration_tests::smsc::{SmscConfig, TestSmsc};
use serde_json::{Value, json};

use super::{
    Bench, FSYNCS_TOTAL, GATEWAY_TEMPLATE, Profile, Spread, busy_share, dump_log, fetch_series, find_profile,
    gateway_smpp_window, machine_cpu_ticks, metric_sums, own_cpu_ticks, sample_proc, stop_gateway,
};

/// The profiles the phase runs, in order, unless `--http-profile` names others.
const PROFILES: [&str; 2] = ["memory", "file-file-file+dlr-file"];
/// The API key of the `bench` account (`max-tps = 0` in the bench's template).
const API_KEY: &str = "bench-http";
/// Appended to the bench's gateway template: the HTTP listener and its key.
const HTTP_SECTION: &str = r#"
[http]
listen = "127.0.0.1:{http_port}"
callback-allow = ["127.0.0.0/8"]
[[http.api-keys]]
key = "bench-http"
account = "bench"
"#;
/// Units the router has finished with: for a message without a receipt, its end.
const COMPLETED: &str = "sendium_completed_total";
/// How often the end of a row is checked: the window's precision.
const POLL: Duration = Duration::from_millis(5);
/// A row whose receipts stop arriving for this long ends as failed.
const STALL: Duration = Duration::from_secs(30);
/// The pause before each row.
const SETTLE: Duration = Duration::from_secs(1);

/// The two kinds of row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpPath {
    /// `POST /v1/messages` without `callback_url`.
    Plain,
    /// With `callback_url` at the bench's sink.
    Callback,
}

impl HttpPath {
    pub fn name(self) -> &'static str {
        match self {
            HttpPath::Plain => "POST",
            HttpPath::Callback => "POST + callback_url",
        }
    }

    /// The `to` numbers of the row: 4475… and 4474…, twelve digits.
    fn number_prefix(self) -> &'static str {
        match self {
            HttpPath::Plain => "4475",
            HttpPath::Callback => "4474",
        }
    }
}

/// The figures of a row that ran to its end.
#[derive(Debug, Clone, Default)]
pub struct HttpMeasured {
    /// Requests answered 202.
    pub accepted: u64,
    /// First request to the row's end.
    pub window_s: f64,
    /// First request to the last 202.
    pub posting_s: f64,
    pub msgs_per_s: f64,
    /// Gateway utime+stime over the window per accepted message.
    pub cpu_us_per_msg: Option<f64>,
    /// Of the 202 answers, request written to response read.
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Accepted ids whose callback arrived (callback rows).
    pub callbacks: Option<u64>,
    /// 429 and 503 answers (each retried).
    pub retried: u64,
    /// Other statuses and I/O failures.
    pub errors: u64,
}

/// One row of the phase.
#[derive(Debug, Clone)]
pub struct HttpRun {
    pub round: Option<usize>,
    pub path: HttpPath,
    pub profile: &'static str,
    pub measured: Option<HttpMeasured>,
    pub note: String,
    pub failed: bool,
    pub detail: Value,
}

pub const HEADERS: [&str; 10] = [
    "path",
    "profile",
    "msgs/s",
    "gateway CPU µs/msg",
    "p50 ms",
    "p99 ms",
    "callbacks",
    "messages",
    "window s",
    "note",
];

/// The table's figures (between the profile and the note) are right-aligned.
pub fn right(i: usize) -> bool {
    (2..HEADERS.len() - 1).contains(&i)
}

pub const SUMMARY_HEADERS: [&str; 7] = [
    "path",
    "profile",
    "rounds",
    "msgs/s",
    "gateway CPU µs/msg",
    "p50 ms",
    "p99 ms",
];

pub fn summary_right(i: usize) -> bool {
    i >= 2
}

impl HttpRun {
    fn failed(path: HttpPath, profile: &'static str, note: String) -> HttpRun {
        HttpRun {
            round: None,
            path,
            profile,
            measured: None,
            note,
            failed: true,
            detail: Value::Null,
        }
    }

    pub fn cells(&self) -> Vec<String> {
        let profile = match self.round {
            Some(k) => format!("{} #{k}", self.profile),
            None => self.profile.to_owned(),
        };
        let mut out = vec![self.path.name().to_owned(), profile];
        match &self.measured {
            Some(m) => out.extend([
                format!("{:.0}", m.msgs_per_s),
                m.cpu_us_per_msg.map_or("-".to_owned(), |c| format!("{c:.1}")),
                format!("{:.2}", m.p50_ms),
                format!("{:.2}", m.p99_ms),
                m.callbacks.map_or("-".to_owned(), |c| format!("{c}/{}", m.accepted)),
                m.accepted.to_string(),
                format!("{:.2}", m.window_s),
            ]),
            None => out.extend(std::iter::repeat_n("-".to_owned(), 7)),
        }
        out.push(self.note.clone());
        out
    }

    pub fn json(&self) -> Value {
        let mut v = json!({
            "round": self.round,
            "path": self.path.name(),
            "profile": self.profile,
            "note": self.note,
            "failed": self.failed,
            "detail": self.detail,
        });
        if let Some(m) = &self.measured {
            v["accepted"] = json!(m.accepted);
            v["window_s"] = json!(m.window_s);
            v["posting_s"] = json!(m.posting_s);
            v["msgs_per_sec"] = json!(m.msgs_per_s);
            v["gateway_cpu_us_per_msg"] = json!(m.cpu_us_per_msg);
            v["p50_ms"] = json!(m.p50_ms);
            v["p99_ms"] = json!(m.p99_ms);
            v["callbacks"] = json!(m.callbacks);
            v["retried"] = json!(m.retried);
            v["errors"] = json!(m.errors);
        }
        v
    }
}

/// One path and profile over the rounds of `--rounds`.
pub struct HttpSummary {
    path: HttpPath,
    profile: &'static str,
    rounds: usize,
    msgs_per_s: Spread,
    cpu_us_per_msg: Option<Spread>,
    p50_ms: Spread,
    p99_ms: Spread,
}

/// Per path and profile, in first-seen order, over the rounds that ran to their end
/// (none with a single round).
pub fn summarize(runs: &[HttpRun]) -> Vec<HttpSummary> {
    let mut groups: Vec<(HttpPath, &'static str, Vec<&HttpMeasured>)> = Vec::new();
    for run in runs.iter().filter(|r| r.round.is_some() && !r.failed) {
        let Some(m) = &run.measured else {
            continue;
        };
        match groups
            .iter_mut()
            .find(|(p, pr, _)| *p == run.path && *pr == run.profile)
        {
            Some((_, _, ms)) => ms.push(m),
            None => groups.push((run.path, run.profile, vec![m])),
        }
    }
    groups
        .into_iter()
        .filter_map(|(path, profile, ms)| {
            let spread = |f: fn(&HttpMeasured) -> f64| Spread::of(ms.iter().map(|m| f(m)).collect());
            Some(HttpSummary {
                path,
                profile,
                rounds: ms.len(),
                msgs_per_s: spread(|m| m.msgs_per_s)?,
                cpu_us_per_msg: Spread::of(ms.iter().filter_map(|m| m.cpu_us_per_msg).collect()),
                p50_ms: spread(|m| m.p50_ms)?,
                p99_ms: spread(|m| m.p99_ms)?,
            })
        })
        .collect()
}

impl HttpSummary {
    pub fn cells(&self) -> Vec<String> {
        vec![
            self.path.name().to_owned(),
            self.profile.to_owned(),
            self.rounds.to_string(),
            self.msgs_per_s.show(0),
            self.cpu_us_per_msg.as_ref().map_or("-".to_owned(), |s| s.show(1)),
            self.p50_ms.show(2),
            self.p99_ms.show(2),
        ]
    }

    pub fn json(&self) -> Value {
        json!({
            "path": self.path.name(),
            "profile": self.profile,
            "rounds": self.rounds,
            "msgs_per_sec": self.msgs_per_s.json(),
            "gateway_cpu_us_per_msg": self.cpu_us_per_msg.as_ref().map(Spread::json),
            "p50_ms": self.p50_ms.json(),
            "p99_ms": self.p99_ms.json(),
        })
    }
}

/// The settings line printed over the phase's table.
pub fn settings(clients: usize, messages: u64, receipt_delay: Duration) -> String {
    format!(
        "{clients} clients, each one keep-alive HTTP/1.1 connection and one request at a time; {messages} messages \
         per row (one GSM part each); callbacks to a keep-alive sink on 127.0.0.1; test SMSC receipt delay {} ms. \
         Gateway CPU: its utime+stime from the first request to the last callback (or, without a callback, to the \
         last message completed), per accepted message.",
        receipt_delay.as_millis()
    )
}

// ---------------------------------------------------------------------------------------
// the phase

/// What a row follows while it runs.
struct Follow<'a> {
    label: &'a str,
    path: HttpPath,
    load: &'a Load,
    smsc: &'a TestSmsc,
    sink: Option<&'a Sink>,
    /// The gateway's `sendium_completed_total` before the row.
    completed_before: Option<f64>,
    /// The test SMSC's accepted `submit_sm` before the first request.
    smsc_before: u64,
}

impl Follow<'_> {
    fn progress(&self, started: Instant) {
        eprintln!(
            "  [{}] {:>4} s: {} accepted (202), SMSC accepted {}{}",
            self.label,
            started.elapsed().as_secs(),
            self.load.accepted.load(Ordering::Relaxed),
            self.smsc.stats().accepted.saturating_sub(self.smsc_before),
            self.sink
                .map_or(String::new(), |k| format!(", callbacks {}", k.distinct()))
        );
    }
}

/// CPU and machine load over a row.
struct Resources {
    /// The gateway's utime+stime over the window, in ticks.
    gateway: Option<u64>,
    /// This process's (load generator, sink and test SMSC) over the row, in ticks.
    bench: Option<u64>,
    machine_busy: Option<f64>,
    /// `submit_sm` the test SMSC accepted during the row.
    smsc_accepted: u64,
    /// `sendium_storage_fsyncs_total` over the row (none on the memory profile).
    fsyncs: Option<f64>,
}

/// How a row's load and wait ended, before its figures are worked out.
struct Driven {
    reports: Vec<ClientReport>,
    started: Instant,
    /// The row's end (every receipt back), or why it did not get there.
    ended: Result<Instant, String>,
    /// The sink's tallies (callback rows).
    sink: Option<Arc<SinkShared>>,
}

impl Bench {
    /// Each profile, two rows each. `round` (from 1) chooses which row runs first on a
    /// gateway, so neither always runs on the fresher one.
    pub fn run_http(&self, round: usize) -> Vec<HttpRun> {
        let paths = if round.is_multiple_of(2) {
            [HttpPath::Callback, HttpPath::Plain]
        } else {
            [HttpPath::Plain, HttpPath::Callback]
        };
        let names: Vec<&'static str> = if self.opts.http_profiles.is_empty() {
            PROFILES.to_vec()
        } else {
            self.opts.http_profiles.iter().map(|p| p.name).collect()
        };
        let mut runs = Vec::new();
        for name in names {
            runs.extend(self.http_profile(name, paths));
        }
        runs
    }

    fn http_profile(&self, name: &'static str, paths: [HttpPath; 2]) -> Vec<HttpRun> {
        eprintln!("== HTTP phase: {name} ==");
        let o = &self.opts;
        let Some(profile) = find_profile(name) else {
            return paths
                .iter()
                .map(|p| HttpRun::failed(*p, name, format!("no profile {name}")))
                .collect();
        };
        let smsc = TestSmsc::start_in_thread(SmscConfig {
            record: false,
            receipt_delay: o.receipt_delay,
            ..SmscConfig::default()
        });
        let template = format!(
            "{}{HTTP_SECTION}",
            GATEWAY_TEMPLATE.replacen("{storage}", &profile.storage(), 1)
        );
        let mut gw = GatewayProcess::builder(&template)
            .smsc_port(smsc.port())
            .var("smpp_window", &gateway_smpp_window(o.window).to_string())
            .var("max_binds", "8")
            .ready_timeout(o.ready_timeout)
            .spawn();
        if o.show_config {
            eprintln!(
                "--- config for the HTTP phase on {name} ---\n{}--- end of config ---",
                gw.config()
            );
        }
        let mut runs = Vec::new();
        match self.started(profile, &mut gw) {
            Err(row) => runs.extend(paths.iter().map(|p| HttpRun::failed(*p, name, row.note.clone()))),
            Ok(()) => {
                if !self.ctl.block_on(smsc.wait_bound(1, Duration::from_secs(10))) {
                    eprintln!("  warning: the gateway's destination did not bind to the test SMSC within 10 s");
                }
                for path in paths {
                    // What the gateway still does after the previous row (or its start)
                    // is not counted in this one's CPU.
                    std::thread::sleep(SETTLE);
                    runs.push(self.http_row(path, profile, &mut gw, &smsc));
                    if gw.try_wait().is_some() {
                        break;
                    }
                }
            }
        }
        if let Some(note) = stop_gateway(&self.ctl, &mut gw) {
            eprintln!("  {note}");
        }
        self.ctl.block_on(smsc.shutdown());
        runs
    }

    fn http_row(&self, path: HttpPath, profile: &Profile, gw: &mut GatewayProcess, smsc: &TestSmsc) -> HttpRun {
        let label = format!("{} {}", profile.name, path.name());
        let o = &self.opts;
        eprintln!(
            "  [{label}] {} messages, {} keep-alive clients",
            o.http_messages, o.http_clients
        );
        let runtime = match self.loadgen_runtime() {
            Ok(r) => r,
            Err(e) => return HttpRun::failed(path, profile.name, e),
        };
        let pid = gw.pid().unwrap_or(0);
        let smsc_before = smsc.stats();
        let machine_before = machine_cpu_ticks();
        let bench_before = own_cpu_ticks();
        let mut cpu_before = None;
        let mut fsyncs_before = None;
        let driven = runtime.block_on(async {
            let sink = match path {
                HttpPath::Plain => None,
                HttpPath::Callback => Some(Sink::start().await.map_err(|e| format!("callback sink: {e}"))?),
            };
            let load = Load::new(
                gw.http_addr(),
                o.http_messages,
                API_KEY,
                path.number_prefix(),
                sink.as_ref().map(Sink::url).as_deref(),
            );
            let load = Arc::new(load);
            // A counter the gateway has not incremented yet is not in the scrape.
            let sums_before = fetch_series(gw.admin_addr()).await.map(|s| metric_sums(&s));
            let completed_before = sums_before.as_ref().map(|s| s.get(COMPLETED).copied().unwrap_or(0.0));
            fsyncs_before = sums_before.and_then(|s| s.get(FSYNCS_TOTAL).copied());
            // Connections are open before the window starts: it measures messages.
            let mut streams = Vec::with_capacity(o.http_clients);
            for _ in 0..o.http_clients {
                streams.push(connect(load.addr).await.map_err(|e| format!("cannot connect: {e}"))?);
            }
            cpu_before = sample_proc(pid);
            let started = Instant::now();
            let clients: Vec<_> = streams
                .into_iter()
                .map(|s| tokio::spawn(client(load.clone(), s)))
                .collect();
            let follow = Follow {
                label: &label,
                path,
                load: &load,
                smsc,
                sink: sink.as_ref(),
                completed_before,
                smsc_before: smsc_before.accepted,
            };
            let mut reports = Vec::new();
            let ended = self.follow_http(&follow, clients, &mut reports, gw).await;
            Ok::<Driven, String>(Driven {
                reports,
                started,
                ended,
                sink: sink.as_ref().map(|s| s.shared.clone()),
            })
        });
        let cpu_after = sample_proc(pid);
        let bench_after = own_cpu_ticks();
        let machine_busy = busy_share(machine_before, machine_cpu_ticks());
        // Scraped after the window closed: the scrape's own CPU is not the row's.
        let fsyncs = fsyncs_before.zip(runtime.block_on(async {
            fetch_series(gw.admin_addr())
                .await
                .and_then(|s| metric_sums(&s).get(FSYNCS_TOTAL).copied())
        }));
        runtime.shutdown_timeout(Duration::from_secs(2));
        let driven = match driven {
            Ok(d) => d,
            Err(e) => {
                eprintln!("  [{label}] {e}");
                return HttpRun::failed(path, profile.name, e);
            }
        };
        let resources = Resources {
            gateway: cpu_before
                .zip(cpu_after)
                .map(|(b, a)| a.cpu_ticks.saturating_sub(b.cpu_ticks)),
            bench: bench_before.zip(bench_after).map(|(b, a)| a.saturating_sub(b)),
            machine_busy,
            smsc_accepted: smsc.stats().accepted.saturating_sub(smsc_before.accepted),
            fsyncs: fsyncs.map(|(b, a)| a - b),
        };
        self.http_figures(path, profile, gw, &label, driven, resources)
    }

    /// Waits for the clients, then for the row's end: every callback at the sink, or
    /// (without callbacks) every message accepted by the test SMSC and then completed by
    /// the gateway. Progress every 10 s; `Err` says why the row did not end.
    async fn follow_http(
        &self,
        f: &Follow<'_>,
        clients: Vec<tokio::task::JoinHandle<ClientReport>>,
        reports: &mut Vec<ClientReport>,
        gw: &mut GatewayProcess,
    ) -> Result<Instant, String> {
        let started = Instant::now();
        let deadline = started + self.opts.phase_timeout;
        let mut last_progress = Instant::now();
        let joined = async {
            let mut out = Vec::with_capacity(clients.len());
            for c in clients {
                out.push(c.await.map_err(|e| format!("client task: {e}"))?);
            }
            Ok::<_, String>(out)
        };
        tokio::pin!(joined);
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                done = &mut joined => {
                    *reports = done?;
                    break;
                }
                _ = tick.tick() => {
                    if let Some(status) = gw.try_wait() {
                        return Err(format!("gateway exited ({status}) while messages were posted"));
                    }
                    if Instant::now() > deadline {
                        return Err(format!("posting not done after {} s", self.opts.phase_timeout.as_secs()));
                    }
                    if last_progress.elapsed() >= Duration::from_secs(10) {
                        f.progress(started);
                        last_progress = Instant::now();
                    }
                }
            }
        }
        let accepted: u64 = reports.iter().map(|r| r.accepted).sum();
        // Followed without the gateway's help (a scrape costs it CPU): the sink's ids, or
        // the SMSC's accepted submits.
        let what = match f.path {
            HttpPath::Callback => "callbacks",
            HttpPath::Plain => "messages at the SMSC",
        };
        let mut last = (0, Instant::now());
        let mut polls = 0u64;
        loop {
            let count = match f.sink {
                Some(k) => k.distinct(),
                None => f.smsc.stats().accepted.saturating_sub(f.smsc_before),
            };
            if count >= accepted {
                break;
            }
            let now = Instant::now();
            if count != last.0 {
                last = (count, now);
            }
            if now.duration_since(last.1) > STALL || now > deadline {
                f.progress(started);
                return Err(format!(
                    "{count} of {accepted} {what} after {:.0} s",
                    started.elapsed().as_secs_f64()
                ));
            }
            polls += 1;
            if polls.is_multiple_of(50) && gw.try_wait().is_some() {
                return Err(format!("gateway exited with {count} of {accepted} {what}"));
            }
            if last_progress.elapsed() >= Duration::from_secs(10) {
                f.progress(started);
                last_progress = Instant::now();
            }
            tokio::time::sleep(POLL).await;
        }
        if f.sink.is_none() {
            // The router completes a message when its submit_sm_resp is in, a moment
            // after the SMSC counted it: scraped only now, and briefly.
            let Some(before) = f.completed_before else {
                return Err("no gateway metrics before the row".to_owned());
            };
            let waiting = Instant::now();
            loop {
                let completed = fetch_series(gw.admin_addr())
                    .await
                    .map(|s| metric_sums(&s).get(COMPLETED).copied().unwrap_or(0.0) - before);
                if completed.is_some_and(|c| c >= accepted as f64) {
                    break;
                }
                if waiting.elapsed() > STALL {
                    return Err(format!(
                        "the gateway completed {} of {accepted} messages the SMSC accepted",
                        completed.map_or("?".to_owned(), |c| format!("{c:.0}"))
                    ));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        Ok(Instant::now())
    }

    /// The row's figures and notes from what the clients, the sink and /proc saw.
    fn http_figures(
        &self,
        path: HttpPath,
        profile: &Profile,
        gw: &mut GatewayProcess,
        label: &str,
        driven: Driven,
        res: Resources,
    ) -> HttpRun {
        let mut latency = Histogram::new();
        let (mut retried, mut refused) = (BTreeMap::<u16, u64>::new(), BTreeMap::<u16, u64>::new());
        let (mut reconnects, mut io_errors, mut accepted) = (0, 0, 0);
        let mut gave_up = Vec::new();
        let mut first_refusal = None;
        let mut last_accepted = None;
        for r in &driven.reports {
            latency.merge(&r.latency);
            for (status, n) in &r.retried {
                *retried.entry(*status).or_default() += n;
            }
            for (status, n) in &r.refused {
                *refused.entry(*status).or_default() += n;
            }
            reconnects += r.reconnects;
            io_errors += r.io_errors;
            accepted += r.accepted;
            gave_up.extend(r.gave_up.clone());
            if first_refusal.is_none() {
                first_refusal.clone_from(&r.first_refusal);
            }
            last_accepted = last_accepted.max(r.last_accepted);
        }
        let list = |m: &BTreeMap<u16, u64>| m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ");
        let mut notes = Vec::new();
        let mut detail = json!({
            "clients": self.opts.http_clients,
            "messages": self.opts.http_messages,
            "retried": list(&retried),
            "refused": list(&refused),
            "first_refusal": first_refusal,
            "reconnects": reconnects,
            "io_errors": io_errors,
            "gave_up": gave_up,
            "smsc_accepted": res.smsc_accepted,
            "gateway_cpu_s": res.gateway.map(|t| t as f64 / self.ticks_per_s as f64),
            "bench_cpu_s": res.bench.map(|t| t as f64 / self.ticks_per_s as f64),
            "machine_busy": res.machine_busy,
        });
        let end = match driven.ended {
            Ok(end) => end,
            Err(e) => {
                let note = format!("{e}; {accepted} accepted");
                eprintln!("  [{label}] {note}");
                dump_log(gw, profile.name, "HTTP row did not end");
                return HttpRun {
                    note,
                    detail,
                    ..HttpRun::failed(path, profile.name, String::new())
                };
            }
        };
        let window_s = end.duration_since(driven.started).as_secs_f64();
        let per_msg = |ticks: u64| ticks as f64 / self.ticks_per_s as f64 / accepted as f64 * 1e6;
        let mut callbacks = None;
        let mut missing = 0;
        if let Some(sink) = &driven.sink {
            let state = sink.state.lock();
            let ids: HashSet<&str> = driven
                .reports
                .iter()
                .flat_map(|r| r.ids.iter().map(String::as_str))
                .collect();
            let matched = ids.iter().filter(|id| state.ids.contains(**id)).count() as u64;
            missing = accepted.saturating_sub(matched);
            callbacks = Some(matched);
            let unexpected = state.ids.len() as u64 - matched;
            let statuses: Vec<String> = state.statuses.iter().map(|(k, v)| format!("{k}={v}")).collect();
            if state.statuses.keys().any(|s| s != "DELIVRD") {
                notes.push(format!("receipt statuses {}", statuses.join(" ")));
            }
            if unexpected > 0 {
                notes.push(format!("{unexpected} callbacks for ids never accepted"));
            }
            if state.repeated > 0 {
                notes.push(format!("{} callbacks repeated", state.repeated));
            }
            if state.unparsed > 0 {
                notes.push(format!("{} callbacks without an id", state.unparsed));
            }
            let connections = sink.connections.load(Ordering::Relaxed);
            notes.push(format!("callbacks over {connections} connections"));
            detail["callback_statuses"] = json!(statuses);
            detail["callback_requests"] = json!(sink.requests.load(Ordering::Relaxed));
            detail["callback_connections"] = json!(connections);
            detail["callbacks_missing"] = json!(missing);
            detail["callbacks_unexpected"] = json!(unexpected);
        }
        let refused_total: u64 = refused.values().sum();
        let errors = refused_total + gave_up.len() as u64;
        let measured = HttpMeasured {
            accepted,
            window_s,
            posting_s: last_accepted.map_or(0.0, |t| t.duration_since(driven.started).as_secs_f64()),
            msgs_per_s: if window_s > 0.0 {
                accepted as f64 / window_s
            } else {
                0.0
            },
            cpu_us_per_msg: res.gateway.filter(|_| accepted > 0).map(per_msg),
            p50_ms: latency.percentile_ms(50.0).unwrap_or(0.0),
            p99_ms: latency.percentile_ms(99.0).unwrap_or(0.0),
            callbacks,
            retried: retried.values().sum(),
            errors,
        };
        if accepted > 0 {
            notes.push(format!(
                "posted in {:.2} s ({:.0}/s)",
                measured.posting_s,
                accepted as f64 / measured.posting_s.max(1e-9)
            ));
        }
        if !retried.is_empty() {
            notes.push(format!("retried {}", list(&retried)));
        }
        if !refused.is_empty() {
            notes.push(format!(
                "refused {} (first: {})",
                list(&refused),
                first_refusal.as_deref().unwrap_or("?")
            ));
        }
        for g in &gave_up {
            notes.push(format!("a client gave up: {g}"));
        }
        if io_errors > 0 || reconnects > 0 {
            notes.push(format!("{io_errors} I/O errors, {reconnects} reconnects"));
        }
        if res.smsc_accepted != accepted {
            notes.push(format!("SMSC accepted {} submit_sm", res.smsc_accepted));
        }
        if let Some(ticks) = res.bench.filter(|_| accepted > 0) {
            // The load generator, the sink and the test SMSC share the cores with it.
            notes.push(format!("bench {:.1} µs/msg", per_msg(ticks)));
        }
        if let Some(busy) = res.machine_busy {
            notes.push(format!("machine {:.0}% busy", busy * 100.0));
        }
        if let Some(n) = res.fsyncs.filter(|n| *n > 0.0 && accepted > 0) {
            // Every store file's fdatasyncs: a flush costs the gateway tens of µs of CPU.
            notes.push(format!("{:.3} fsyncs/msg", n / accepted as f64));
            detail["fsyncs"] = json!(n);
        }
        let exited = gw.try_wait();
        if let Some(status) = &exited {
            notes.push(format!("gateway exited ({status})"));
        }
        let failed = errors > 0 || missing > 0 || accepted == 0 || exited.is_some();
        if failed {
            dump_log(gw, profile.name, "HTTP row with errors");
        }
        eprintln!(
            "  [{label}] {accepted} accepted in {window_s:.2} s = {:.0} msg/s; gateway CPU {} µs/msg; \
             202 p50 {:.2} ms p99 {:.2} ms{}",
            measured.msgs_per_s,
            measured.cpu_us_per_msg.map_or("?".to_owned(), |c| format!("{c:.1}")),
            measured.p50_ms,
            measured.p99_ms,
            callbacks.map_or(String::new(), |c| format!("; callbacks {c}/{accepted}")),
        );
        HttpRun {
            round: None,
            path,
            profile: profile.name,
            measured: Some(measured),
            note: notes.join("; "),
            failed,
            detail,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use sendium_integration_tests::http_load::{TEXT, parse_head};

    use super::*;

    #[test]
    fn requests_carry_their_length_and_vary_the_number() {
        let addr: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let load = Load::new(
            addr,
            10,
            API_KEY,
            HttpPath::Callback.number_prefix(),
            Some("http://127.0.0.1:9/dlr"),
        );
        let mut out = Vec::new();
        for (n, to) in [(7, "447400000007"), (123_456_789, "447423456789")] {
            load.request(n, &mut out);
            assert!(out.starts_with(b"POST /v1/messages HTTP/1.1\r\n"));
            let head = parse_head(&out).unwrap().unwrap();
            let body = &out[head.body_start..];
            assert_eq!(head.content_length, Some(body.len()));
            let v: Value = serde_json::from_slice(body).unwrap();
            assert_eq!(v["to"], to);
            assert_eq!(v["from"], "Bench");
            assert_eq!(v["text"], TEXT);
            assert_eq!(v["callback_url"], "http://127.0.0.1:9/dlr");
        }
        assert!(load.keep_ids);
        let plain = Load::new(addr, 10, API_KEY, HttpPath::Plain.number_prefix(), None);
        plain.request(1, &mut out);
        let head = parse_head(&out).unwrap().unwrap();
        let v: Value = serde_json::from_slice(&out[head.body_start..]).unwrap();
        assert_eq!(v["to"], "447500000001");
        assert!(v.get("callback_url").is_none() && !plain.keep_ids);
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains(&format!("Authorization: Bearer {API_KEY}\r\n")));
        assert!(HTTP_SECTION.contains(&format!("key = \"{API_KEY}\"")));
        let profile = find_profile(PROFILES[1]).unwrap();
        let template = format!(
            "{}{HTTP_SECTION}",
            GATEWAY_TEMPLATE.replacen("{storage}", &profile.storage(), 1)
        );
        let vars: Vec<(&str, String)> = [
            "smpp_port",
            "http_port",
            "admin_port",
            "data_dir",
            "smsc_port",
            "smpp_window",
            "max_binds",
        ]
        .iter()
        .map(|v| (*v, "1".to_owned()))
        .collect();
        let config = sendium_integration_tests::render_template(&template, &vars).unwrap();
        assert!(config.contains("[http]\nlisten = \"127.0.0.1:1\"\ncallback-allow = [\"127.0.0.0/8\"]"));
    }

    #[test]
    fn summary_over_rounds() {
        let run = |round, path, msgs_per_s, cpu| HttpRun {
            round: Some(round),
            path,
            profile: "memory",
            measured: Some(HttpMeasured {
                accepted: 100,
                msgs_per_s,
                cpu_us_per_msg: Some(cpu),
                callbacks: (path == HttpPath::Callback).then_some(100),
                ..HttpMeasured::default()
            }),
            note: String::new(),
            failed: false,
            detail: Value::Null,
        };
        let mut failed = run(3, HttpPath::Plain, 1.0, 1.0);
        failed.failed = true;
        let runs = vec![
            run(1, HttpPath::Plain, 10_000.0, 40.0),
            run(1, HttpPath::Callback, 5_000.0, 90.0),
            run(2, HttpPath::Plain, 12_000.0, 50.0),
            run(2, HttpPath::Callback, 6_000.0, 80.0),
            failed,
        ];
        let summary = summarize(&runs);
        assert_eq!(summary.len(), 2);
        assert_eq!(
            summary[0].cells(),
            [
                "POST",
                "memory",
                "2",
                "11000 (10000–12000)",
                "45.0 (40.0–50.0)",
                "0.00 (0.00–0.00)",
                "0.00 (0.00–0.00)"
            ]
        );
        assert_eq!(runs[1].cells()[6], "100/100");
        assert_eq!(runs[0].cells()[6], "-");
        assert_eq!(runs[0].cells()[1], "memory #1");
        assert_eq!(runs[0].cells().len(), HEADERS.len());
        assert_eq!(runs[1].json()["callbacks"], 100);
        let single: Vec<HttpRun> = runs.into_iter().map(|r| HttpRun { round: None, ..r }).collect();
        assert!(summarize(&single).is_empty());
    }
}
