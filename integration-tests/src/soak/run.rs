//! The soak run: start everything, load with faults and kills, drain, reckon, report.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::callback::CallbackServer;
use crate::gateway::{GatewayProcess, locate_binary};
use crate::smsc::{SmscConfig, TestSmsc};

use super::config::{TEMPLATE, callback_allow_for};
use super::faults::FaultSchedule;
use super::ledger::{self, CallbackSeen, Evaluation};
use super::options::{SoakOptions, format_duration};
use super::procstat::{self, Incarnation, ProcSample, RssVerdict};
use super::traffic::{self, Traffic, TrafficStats};

/// How long the sessions get to bind again after a restart.
const REBIND_TIMEOUT: Duration = Duration::from_secs(30);
/// Progress lines while loading.
const PROGRESS_EVERY: Duration = Duration::from_secs(30);
/// Reckonings while draining.
const DRAIN_POLL: Duration = Duration::from_secs(10);
/// HTTP client names (one per 10 messages per second).
const HTTP_CLIENTS: [&str; 8] = [
    "http-1", "http-2", "http-3", "http-4", "http-5", "http-6", "http-7", "http-8",
];

type Incarnations = Arc<Mutex<Vec<Incarnation>>>;

struct Soak {
    opts: SoakOptions,
    clock: Instant,
    smsc: TestSmsc,
    callbacks: CallbackServer,
    traffic: Arc<Traffic>,
    incarnations: Incarnations,
    schedule: FaultSchedule,
    gw: Option<GatewayProcess>,
    /// The gateway's data directory (the same for every incarnation).
    data_dir: PathBuf,
    kills: u32,
    /// Kills that landed while submissions waited for their answers.
    kills_in_flight: u32,
    unexpected_exits: u32,
    /// SIGKILL (or exit) to ready, seconds.
    restart_secs: Vec<f64>,
    /// Ready to every session bound again, seconds.
    rebind_secs: Vec<f64>,
    violations: Vec<String>,
    notes: Vec<String>,
}

fn secs_since(clock: Instant) -> f64 {
    clock.elapsed().as_secs_f64()
}

fn sample_now(pid: u32, clock: Instant, data_dir: &Path) -> Option<ProcSample> {
    procstat::read(pid).ok().map(|(rss_kb, fds)| ProcSample {
        t: secs_since(clock),
        rss_kb,
        fds,
        caches_kb: procstat::store_caches_kb(data_dir),
    })
}

/// Reads RSS and descriptors of the running incarnation every `every`.
async fn sampler(
    incarnations: Incarnations,
    clock: Instant,
    data_dir: PathBuf,
    every: Duration,
    done: Arc<AtomicBool>,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while !done.load(Ordering::Acquire) {
        tick.tick().await;
        let pid = incarnations.lock().last().filter(|i| i.end.is_none()).map(|i| i.pid);
        let Some(pid) = pid else { continue };
        let Some(sample) = sample_now(pid, clock, &data_dir) else {
            continue;
        };
        let mut incs = incarnations.lock();
        if let Some(inc) = incs.last_mut().filter(|i| i.pid == pid && i.end.is_none()) {
            inc.samples.push(sample);
        }
    }
}

/// Runs `fut` in a task so a panic of the kit (a gateway that does not become ready) is
/// an error here, not the end of the soak without a report.
async fn guarded<T: Send + 'static>(fut: impl Future<Output = T> + Send + 'static) -> Result<T, String> {
    tokio::spawn(fut).await.map_err(|e| {
        let text = e.to_string();
        let short: String = text.chars().take(600).collect();
        format!("{short}{}", if text.len() > short.len() { " …" } else { "" })
    })
}

impl Soak {
    fn t(&self) -> f64 {
        secs_since(self.clock)
    }

    fn pid(&self) -> u32 {
        self.gw.as_ref().and_then(GatewayProcess::pid).unwrap_or(0)
    }

    /// After a start: wait for every session to bind to incarnation `n`, take the quiet
    /// reading, let the traffic go.
    async fn resume(&mut self, n: u32, ready_at: Instant) {
        let deadline = Instant::now() + REBIND_TIMEOUT;
        while !self.traffic.all_bound_to(n) {
            if Instant::now() >= deadline {
                let unbound: Vec<&str> = self
                    .traffic
                    .slots
                    .iter()
                    .filter(|s| s.bound_in.load(Ordering::Acquire) != n)
                    .map(|s| s.name)
                    .collect();
                self.violations.push(format!(
                    "incarnation {n}: sessions {unbound:?} could not bind within {}s of readiness",
                    REBIND_TIMEOUT.as_secs()
                ));
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.rebind_secs.push(ready_at.elapsed().as_secs_f64());
        let start = sample_now(self.pid(), self.clock, &self.data_dir);
        if let Some(inc) = self.incarnations.lock().last_mut() {
            inc.start = start;
        }
        self.traffic.paused.send_replace(false);
    }

    /// SIGKILL (`kill`) or an unexpected exit: restart on the same data, rebind, resume.
    async fn restart(&mut self, kill: bool) -> Result<(), String> {
        let Some(mut gw) = self.gw.take() else {
            return Err("no gateway to restart".to_owned());
        };
        let pid = gw.pid().unwrap_or(0);
        let end = if kill {
            sample_now(pid, self.clock, &self.data_dir)
        } else {
            None
        };
        {
            let mut incs = self.incarnations.lock();
            if let Some(inc) = incs.last_mut() {
                inc.end = end.or_else(|| inc.samples.last().copied());
                inc.killed = kill;
            }
        }
        if kill {
            // Land on work in flight: wait (briefly) for a submission awaiting its answer.
            let deadline = Instant::now() + Duration::from_secs(2);
            while self.traffic.in_flight.load(Ordering::Acquire) == 0 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            if self.traffic.in_flight.load(Ordering::Acquire) > 0 {
                self.kills_in_flight += 1;
            }
            gw.kill();
            self.kills += 1;
        }
        self.traffic.paused.send_replace(true);
        let down_at = Instant::now();
        let n = self.traffic.incarnation.fetch_add(1, Ordering::AcqRel) + 1;
        let gw = guarded(async move {
            gw.restart().await;
            gw
        })
        .await
        .map_err(|e| format!("incarnation {n} did not become ready after the restart: {e}"))?;
        let ready_at = Instant::now();
        self.restart_secs.push(down_at.elapsed().as_secs_f64());
        let pid = gw.pid().unwrap_or(0);
        self.gw = Some(gw);
        self.incarnations.lock().push(Incarnation::new(n, pid, self.t()));
        self.resume(n, ready_at).await;
        Ok(())
    }

    fn evaluate(&self) -> Evaluation {
        let messages = self.smsc.messages();
        let callbacks: Vec<CallbackSeen> = self
            .callbacks
            .accepted()
            .into_iter()
            .filter_map(|r| {
                let json = r.json.as_ref()?;
                Some(CallbackSeen {
                    id: json.get("id")?.as_str()?.to_owned(),
                    status: json.get("status")?.as_str()?.to_owned(),
                    at: r.received_at,
                })
            })
            .collect();
        let ledger = self.traffic.ledger.lock();
        ledger::evaluate(&ledger, &messages, &callbacks, self.opts.multipart_expiry)
    }

    fn progress(&self) {
        let (smpp, http) = self.traffic.ledger.lock().acked_counts();
        let smpp_receipts = self.traffic.ledger.lock().smpp_receipts_total();
        let callbacks = self.callbacks.accepted().len();
        let s = self.smsc.stats();
        let reading = sample_now(self.pid(), self.clock, &self.data_dir)
            .map(|r| format!("rss {} fds {}", procstat::mib(r.rss_kb), r.fds))
            .unwrap_or_default();
        println!(
            "[{:>6.0}s] acked smpp {smpp} http {http} | smsc accepted {} completed {} | receipts smpp {smpp_receipts} callbacks {callbacks} | {reading} | kills {} | fault: {}",
            self.t(),
            s.accepted,
            s.messages_completed,
            self.kills,
            self.schedule.current.name()
        );
    }
}

fn default_out_dir() -> PathBuf {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    PathBuf::from(format!("/tmp/sendium-soak-{now}"))
}

/// What the gateway's logs say about trouble.
#[derive(Debug, Default)]
struct LogFindings {
    errors: u64,
    /// Panics per incarnation (index 0: incarnation 1).
    panics: Vec<u64>,
    /// The first few ERROR lines and panic messages, shortened.
    examples: Vec<String>,
}

/// Copies the gateway's logs and configuration to `out` and reads them for ERROR lines
/// and panics.
fn copy_logs(gw: &GatewayProcess, out: &Path) -> LogFindings {
    let mut found = LogFindings::default();
    let Some(dir) = gw.config_path().parent() else {
        return found;
    };
    let _ = fs::copy(gw.config_path(), out.join("sendium.toml"));
    for run in 1..=gw.starts() {
        let mut panics = 0;
        for stream in ["stdout", "stderr"] {
            let from = dir.join(format!("{stream}.{run}.log"));
            if let Ok(text) = fs::read_to_string(&from) {
                let lines: Vec<&str> = text.lines().collect();
                for (i, line) in lines.iter().enumerate() {
                    let example = if line.contains("panicked") {
                        panics += 1;
                        let message = lines.get(i + 1).copied().unwrap_or_default();
                        Some(format!("incarnation {run}: {line} {message}"))
                    } else if line.contains("ERROR") {
                        found.errors += 1;
                        Some(format!("incarnation {run}: {line}"))
                    } else {
                        None
                    };
                    if let Some(example) = example.filter(|_| found.examples.len() < 6) {
                        found.examples.push(example.chars().take(400).collect());
                    }
                }
            }
            let _ = fs::copy(&from, out.join(format!("gateway-{stream}.{run}.log")));
        }
        found.panics.push(panics);
    }
    found
}

/// Runs the soak; `Ok(true)` when every check passed. `Err`: it could not run.
pub async fn run(opts: SoakOptions) -> Result<bool, String> {
    let out_dir = opts.out_dir.clone().unwrap_or_else(default_out_dir);
    fs::create_dir_all(&out_dir).map_err(|e| format!("cannot create {}: {e}", out_dir.display()))?;
    let bin = locate_binary()?;
    let expiry = format_duration(opts.multipart_expiry);
    let callback_allow = callback_allow_for(&bin, &out_dir, &expiry)?;
    let clock = Instant::now();
    println!(
        "sendium soak: {} of load, binary {}, output in {}",
        format_duration(opts.duration),
        bin.display(),
        out_dir.display()
    );

    let smsc = TestSmsc::start_in_thread(SmscConfig {
        receipt_delay: Duration::from_millis(100),
        ..SmscConfig::default()
    });
    let callbacks = CallbackServer::start().await;
    let builder = GatewayProcess::builder(TEMPLATE)
        .smsc_port(smsc.port())
        .var("multipart_expiry", &expiry)
        .var("callback_allow", callback_allow);
    let gw = guarded(builder.start())
        .await
        .map_err(|e| format!("the gateway did not start: {e}"))?;
    let traffic = Arc::new(Traffic::new(
        gw.smpp_addr(),
        gw.http_addr(),
        format!("http://{}", callbacks.addr()),
        opts.smpp_rate,
    ));
    let incarnations: Incarnations = Arc::new(Mutex::new(vec![Incarnation::new(
        1,
        gw.pid().unwrap_or(0),
        secs_since(clock),
    )]));
    let ready_at = Instant::now();
    let mut soak = Soak {
        schedule: FaultSchedule::new(opts.seed),
        opts,
        clock,
        smsc,
        callbacks,
        traffic: traffic.clone(),
        incarnations: incarnations.clone(),
        data_dir: gw.data_dir().to_path_buf(),
        gw: Some(gw),
        kills: 0,
        kills_in_flight: 0,
        unexpected_exits: 0,
        restart_secs: Vec::new(),
        rebind_secs: Vec::new(),
        violations: Vec::new(),
        notes: Vec::new(),
    };
    let opts = soak.opts.clone();

    // Clients and the sampler.
    let mut clients: Vec<JoinHandle<()>> = Vec::new();
    for i in 0..traffic.slots.len() {
        clients.push(tokio::spawn(traffic::smpp_client(
            traffic.clone(),
            i,
            opts.seed.wrapping_mul(31).wrapping_add(i as u64),
        )));
    }
    let http_workers = ((opts.http_rate / 10.0).ceil() as usize).clamp(1, HTTP_CLIENTS.len());
    if opts.http_rate > 0.0 {
        for (i, name) in HTTP_CLIENTS.iter().enumerate().take(http_workers) {
            let key = if i % 2 == 0 { "key-1" } else { "key-2" };
            clients.push(tokio::spawn(traffic::http_client(
                traffic.clone(),
                name,
                key,
                opts.http_rate / http_workers as f64,
                opts.seed.wrapping_mul(131).wrapping_add(i as u64),
            )));
        }
    }
    let sampler_done = Arc::new(AtomicBool::new(false));
    let sampler_task = tokio::spawn(sampler(
        incarnations.clone(),
        clock,
        soak.data_dir.clone(),
        opts.sample_every,
        sampler_done.clone(),
    ));
    soak.resume(1, ready_at).await;

    // The load.
    let load_start = Instant::now();
    let load_start_t = soak.t();
    let load_end = load_start + opts.duration;
    let kill_end = load_start + opts.kill_phase_end();
    let mut next_kill = opts.kill_every.map(|k| load_start + k).filter(|t| *t < kill_end);
    let mut next_fault = opts.faults.then(|| load_start + opts.fault_every);
    let mut short_fault_end: Option<Instant> = None;
    let mut next_progress = load_start + PROGRESS_EVERY;
    let mut fatal: Option<String> = None;
    // The longest stretch without a new acknowledgement while the clients were sending:
    // (seconds, from when).
    let mut acks_seen = 0u64;
    let mut last_ack_change = Instant::now();
    let mut longest_stall = (0.0f64, 0.0f64);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    println!(
        "load: SMPP {}/s over {} sessions, HTTP {}/s over {http_workers} clients; kills every {} until {}s; faults {}",
        opts.smpp_rate,
        traffic.slots.iter().filter(|s| s.rate > 0.0).count(),
        opts.http_rate,
        opts.kill_every.map_or("never".to_owned(), format_duration),
        opts.kill_phase_end().as_secs(),
        if opts.faults {
            format!("every {}", format_duration(opts.fault_every))
        } else {
            "off".to_owned()
        }
    );
    loop {
        let now = Instant::now();
        if now >= load_end {
            break;
        }
        let wake = [
            Some(load_end),
            next_kill,
            next_fault,
            short_fault_end,
            Some(next_progress),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(load_end)
        .min(now + Duration::from_secs(1));
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => {}
            _ = &mut ctrl_c => {
                soak.notes.push(format!("interrupted (Ctrl-C) after {:.0}s of load", load_start.elapsed().as_secs_f64()));
                break;
            }
        }
        let now = Instant::now();
        let acks = {
            let stats = traffic.stats.lock();
            stats.smpp_ok + stats.http_accepted
        };
        if acks != acks_seen || *traffic.paused.borrow() {
            acks_seen = acks;
            last_ack_change = now;
        } else {
            let stall = now.duration_since(last_ack_change).as_secs_f64();
            if stall > longest_stall.0 {
                longest_stall = (stall, soak.t() - stall);
            }
        }
        if let Some(status) = soak.gw.as_mut().and_then(GatewayProcess::try_wait) {
            soak.unexpected_exits += 1;
            soak.violations.push(format!(
                "incarnation {} exited by itself at {:.0}s: {status}",
                soak.traffic.incarnation.load(Ordering::Acquire),
                soak.t()
            ));
            if let Err(e) = soak.restart(false).await {
                fatal = Some(e);
                break;
            }
            last_ack_change = Instant::now();
        }
        if short_fault_end.is_some_and(|t| now >= t) {
            short_fault_end = None;
            soak.schedule.clear(&soak.smsc, &soak.callbacks);
        }
        if let Some(at) = next_fault.filter(|t| now >= *t) {
            let phase = soak.schedule.advance(&soak.smsc, &soak.callbacks);
            short_fault_end = FaultSchedule::short_phase_length(phase).map(|d| now + d);
            next_fault = Some(at + opts.fault_every);
            println!("[{:>6.0}s] fault: {}", soak.t(), phase.name());
        }
        if let Some(at) = next_kill.filter(|t| now >= *t) {
            println!("[{:>6.0}s] SIGKILL {}", soak.t(), soak.pid());
            if let Err(e) = soak.restart(true).await {
                fatal = Some(e);
                break;
            }
            last_ack_change = Instant::now();
            println!(
                "[{:>6.0}s] incarnation {} ready (pid {}) in {:.1}s",
                soak.t(),
                soak.traffic.incarnation.load(Ordering::Acquire),
                soak.pid(),
                soak.restart_secs.last().copied().unwrap_or(0.0)
            );
            next_kill = opts
                .kill_every
                .map(|k| at + k)
                .filter(|t| *t < kill_end && *t < load_end);
        }
        if now >= next_progress {
            soak.progress();
            next_progress += PROGRESS_EVERY;
        }
    }
    let load_end_t = soak.t();
    let load_secs = load_end_t - load_start_t;

    // The drain: no new messages, no faults.
    traffic.stop.store(true, Ordering::Release);
    soak.schedule.clear(&soak.smsc, &soak.callbacks);
    let mut evaluation = Evaluation::default();
    let drain_start = Instant::now();
    if fatal.is_none() {
        println!(
            "[{:>6.0}s] load over; draining (at most {})",
            soak.t(),
            format_duration(opts.drain)
        );
        let deadline = drain_start + opts.drain;
        loop {
            tokio::time::sleep(if drain_start.elapsed() < Duration::from_secs(5) {
                Duration::from_secs(5)
            } else {
                DRAIN_POLL
            })
            .await;
            if let Some(status) = soak.gw.as_mut().and_then(GatewayProcess::try_wait) {
                soak.unexpected_exits += 1;
                soak.violations
                    .push(format!("the gateway exited by itself while draining: {status}"));
                break;
            }
            evaluation = soak.evaluate();
            println!(
                "[{:>6.0}s] drain: not at the SMSC {}, receipts missing {} (smpp {}, http {}), multipart parts unacknowledged {}",
                soak.t(),
                evaluation.lost,
                evaluation.receipts_missing,
                evaluation.receipts_missing_smpp,
                evaluation.receipts_missing_http,
                evaluation.partial_open
            );
            if evaluation.complete() || Instant::now() >= deadline {
                break;
            }
        }
    }
    let drain_secs = drain_start.elapsed().as_secs_f64();

    // Descriptors back to the quiet reading after the last start (pooled callback
    // connections close when idle, so give them time).
    let baseline = soak.incarnations.lock().last().and_then(|i| i.start);
    let mut settle_secs = 0.0;
    let mut final_sample = None;
    if fatal.is_none() && soak.gw.is_some() {
        let settle_start = Instant::now();
        loop {
            final_sample = sample_now(soak.pid(), clock, &soak.data_dir);
            let settled = match (baseline, final_sample) {
                (Some(b), Some(f)) => f.fds <= b.fds + opts.fd_tolerance,
                _ => true,
            };
            if settled || settle_start.elapsed() >= opts.fd_settle {
                break;
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        settle_secs = settle_start.elapsed().as_secs_f64();
    }
    sampler_done.store(true, Ordering::Release);
    sampler_task.abort();
    if let Some(inc) = soak.incarnations.lock().last_mut() {
        inc.end = final_sample.or(inc.end);
    }

    // Clients finish (collecting their last receipts), then the reckoning.
    traffic.finished.store(true, Ordering::Release);
    for client in clients {
        let _ = tokio::time::timeout(Duration::from_secs(10), client).await;
    }
    if fatal.is_none() {
        evaluation = soak.evaluate();
    }
    let logs = soak.gw.as_ref().map(|gw| copy_logs(gw, &out_dir)).unwrap_or_default();
    let log_panics: u64 = logs.panics.iter().sum();
    let smsc_stats = soak.smsc.stats();
    let incomplete_groups = soak.smsc.incomplete_groups();
    let stats = traffic.stats.lock().clone();
    let incarnations = soak.incarnations.lock().clone();
    drop(soak.gw.take());

    // Verdicts.
    let mut violations = std::mem::take(&mut soak.violations);
    if let Some(e) = &fatal {
        violations.push(format!("FATAL: {e}"));
    }
    let e = &evaluation;
    if e.lost > 0 {
        violations.push(format!(
            "{} acknowledged messages never reached the SMSC (and did not fail legitimately)",
            e.lost
        ));
    }
    if e.receipts_missing > 0 {
        violations.push(format!(
            "{} receipts owed never reached their client (SMPP {}, HTTP {})",
            e.receipts_missing, e.receipts_missing_smpp, e.receipts_missing_http
        ));
    }
    if e.wrong_states > 0 {
        violations.push(format!(
            "{} receipts with a state the message's fate does not explain",
            e.wrong_states
        ));
    }
    if e.text_mismatches > 0 {
        violations.push(format!(
            "{} messages reached the SMSC with another text",
            e.text_mismatches
        ));
    }
    if e.partial_open > 0 {
        violations.push(format!(
            "{} multipart messages still had unacknowledged parts at the end",
            e.partial_open
        ));
    }
    if fatal.is_none() {
        if e.smpp_acked == 0 && opts.smpp_rate > 0.0 {
            violations.push("no SMPP message was acknowledged".to_owned());
        }
        if e.http_acked == 0 && opts.http_rate > 0.0 {
            violations.push(format!(
                "no HTTP message was acknowledged (first refusal: {})",
                stats.http_first_refusal.as_deref().unwrap_or("none")
            ));
        }
    }
    let last = incarnations.last();
    let warmup = last.map_or(0.0, |inc| {
        let length = (load_end_t - inc.started).max(0.0);
        opts.warmup.map_or((length / 4.0).min(120.0), |w| w.as_secs_f64())
    });
    let rss: Option<RssVerdict> =
        last.and_then(|inc| procstat::rss_verdict(inc, inc.started + warmup, load_end_t, opts.rss_growth_pct));
    match &rss {
        Some(v) if !v.flat() => violations.push(format!(
            "RSS of the last incarnation grew {:.1}% after warm-up ({} -> {}), past {} ({}% more, plus {} the stores' caches may hold)",
            v.growth_pct,
            procstat::mib(v.after_warmup_kb),
            procstat::mib(v.at_end_kb),
            procstat::mib(v.allowed_kb()),
            v.bound_pct,
            procstat::mib(v.caches_kb)
        )),
        Some(_) => {}
        None => soak
            .notes
            .push("RSS not judged: the last incarnation had fewer than 4 readings after warm-up".to_owned()),
    }
    let fds_back = match (baseline, final_sample) {
        (Some(b), Some(f)) => {
            let ok = f.fds <= b.fds + opts.fd_tolerance;
            if !ok {
                violations.push(format!(
                    "open descriptors did not return to the baseline: {} after the drain vs {} (tolerance {})",
                    f.fds, b.fds, opts.fd_tolerance
                ));
            }
            Some((b.fds, f.fds, ok))
        }
        _ => None,
    };
    if longest_stall.0 > opts.max_stall.as_secs_f64() {
        violations.push(format!(
            "the gateway acknowledged nothing for {:.0}s (from {:.0}s) while the clients were sending",
            longest_stall.0, longest_stall.1
        ));
    }
    if log_panics > 0 {
        let which: Vec<String> = logs
            .panics
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(i, n)| format!("incarnation {}: {n}", i + 1))
            .collect();
        violations.push(format!(
            "the gateway panicked {log_panics} times ({}; see the log examples)",
            which.join(", ")
        ));
        if logs.panics.last().is_some_and(|n| *n > 0) && std::env::var_os("RUST_BACKTRACE").is_some() {
            soak.notes.push(
                "the last incarnation panicked with RUST_BACKTRACE set: symbolizing the backtrace loads the binary's \
                 debug info, which adds to its RSS"
                    .to_owned(),
            );
        }
    }

    // The summary.
    let mut s = String::new();
    let _ = writeln!(s, "== sendium soak summary ==");
    let _ = writeln!(
        s,
        "run        load {:.0}s ({}), drain {:.0}s, fd settle {:.0}s, seed {}",
        load_secs,
        opts.kill_every.map_or("no kills".to_owned(), |k| format!(
            "SIGKILL every {} in the first {}s",
            format_duration(k),
            opts.kill_phase_end().as_secs()
        )),
        drain_secs,
        settle_secs,
        opts.seed
    );
    let _ = writeln!(
        s,
        "profile    file/file/file, dlr file; SMPP {}/s (3 sessions + 1 receiver), HTTP {}/s ({http_workers} clients)",
        opts.smpp_rate, opts.http_rate
    );
    let _ = writeln!(
        s,
        "gateway    {} incarnations, {} SIGKILLs ({} with submissions in flight), {} unexpected exits; restart to ready {}; ready to rebound {}",
        incarnations.len(),
        soak.kills,
        soak.kills_in_flight,
        soak.unexpected_exits,
        min_max(&soak.restart_secs),
        min_max(&soak.rebind_secs)
    );
    let _ = writeln!(
        s,
        "           longest time without an acknowledgement while sending: {:.0}s (from {:.0}s; bound {}s)",
        longest_stall.0,
        longest_stall.1,
        opts.max_stall.as_secs()
    );
    let _ = writeln!(s, "messages");
    let _ = writeln!(
        s,
        "  sent {}, acknowledged {} (SMPP {}, HTTP {}), parts acknowledged {}",
        e.messages_sent, e.messages_acked, e.smpp_acked, e.http_acked, e.parts_acked
    );
    let _ = writeln!(
        s,
        "  reached the SMSC {} | rejected by the provider as expected {} | expired as expected {} | LOST {}",
        e.delivered, e.rejected_as_expected, e.expired_as_expected, e.lost
    );
    let _ = writeln!(
        s,
        "  duplicates at the SMSC: {} messages, {} extra copies | delivered without an acknowledgement (answer lost to a kill) {}",
        e.duplicated_messages, e.duplicate_copies, e.delivered_unacked
    );
    let _ = writeln!(
        s,
        "  multipart: parts resent {}, messages abandoned {} (partial, acknowledged parts owe EXPIRED receipts), still open {}",
        stats.multipart_resent_parts, e.partial_abandoned, e.partial_open
    );
    let _ = writeln!(s, "  text mismatches {}", e.text_mismatches);
    let _ = write!(s, "{}", e.kind_table());
    let _ = writeln!(s, "receipts");
    let _ = writeln!(
        s,
        "  owed {} (SMPP {}, HTTP {}), delivered {}, MISSING {}",
        e.receipts_owed, e.receipts_owed_smpp, e.receipts_owed_http, e.receipts_delivered, e.receipts_missing
    );
    let _ = writeln!(
        s,
        "  duplicates: {} ids got more than one ({} extra) | wrong states {} | receipts for unacknowledged ids {}",
        e.receipt_duplicated_ids, e.receipt_duplicate_copies, e.wrong_states, e.receipts_for_unacked
    );
    let states: Vec<String> = e.states.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let _ = writeln!(
        s,
        "  states: {} | SMPP receipts received {}, callbacks accepted {}",
        states.join(" "),
        e.smpp_receipts_total,
        e.callbacks_total
    );
    let _ = writeln!(
        s,
        "  latency from acknowledgement to first receipt: SMPP {} | HTTP {}",
        latency(&e.receipt_latency_smpp),
        latency(&e.receipt_latency_http)
    );
    let _ = writeln!(s, "clients");
    let _ = writeln!(s, "  {}", client_line(&stats));
    let _ = writeln!(s, "provider (test SMSC)");
    let _ = writeln!(
        s,
        "  submits {}, accepted {}, rejected {}, throttled {}, unanswered {}, binds {}; receipts sent {}, acked {}; messages completed {}, incomplete groups {}",
        smsc_stats.submits,
        smsc_stats.accepted,
        smsc_stats.rejected,
        smsc_stats.throttled,
        smsc_stats.unanswered,
        smsc_stats.binds,
        smsc_stats.receipts_sent,
        smsc_stats.receipts_acked,
        smsc_stats.messages_completed,
        incomplete_groups
    );
    let phases: Vec<String> = soak
        .schedule
        .applied
        .iter()
        .map(|(p, n)| format!("{}={n}", p.name()))
        .collect();
    let _ = writeln!(
        s,
        "  fault phases: {}",
        if phases.is_empty() {
            "none".to_owned()
        } else {
            phases.join("; ")
        }
    );
    let _ = writeln!(s, "memory and descriptors (per incarnation)");
    let _ = write!(s, "{}", procstat::table(&incarnations));
    match &rss {
        Some(v) => {
            let _ = writeln!(
                s,
                "  RSS of the last incarnation, {:.0}s..{:.0}s (after {:.0}s warm-up, {} readings): {} -> {} ({:+.1}%), max {}; bound {} ({}% more, plus {} the stores' caches may hold): {}",
                v.from,
                v.to,
                warmup,
                v.samples,
                procstat::mib(v.after_warmup_kb),
                procstat::mib(v.at_end_kb),
                v.growth_pct,
                procstat::mib(v.max_kb),
                procstat::mib(v.allowed_kb()),
                v.bound_pct,
                procstat::mib(v.caches_kb),
                if v.flat() { "flat" } else { "GROWING" }
            );
        }
        None => {
            let _ = writeln!(s, "  RSS: not judged (too few readings after warm-up)");
        }
    }
    match fds_back {
        Some((b, f, ok)) => {
            let _ = writeln!(
                s,
                "  descriptors: baseline {b} (quiet, after the last start), {f} after the drain (tolerance {}): {}",
                opts.fd_tolerance,
                if ok { "back" } else { "NOT BACK" }
            );
        }
        None => {
            let _ = writeln!(s, "  descriptors: no baseline");
        }
    }
    let _ = writeln!(
        s,
        "gateway logs: {} lines with ERROR, {log_panics} panics (copied to {})",
        logs.errors,
        out_dir.display()
    );
    for example in &logs.examples {
        let _ = writeln!(s, "  {example}");
    }
    for (title, list) in [
        ("lost messages", &e.lost_examples),
        ("missing receipts", &e.missing_receipt_examples),
        ("wrong receipt states", &e.wrong_state_examples),
        ("text mismatches", &e.text_mismatch_examples),
    ] {
        if !list.is_empty() {
            let _ = writeln!(s, "examples of {title}:");
            for line in list {
                let _ = writeln!(s, "  {line}");
            }
        }
    }
    for note in &soak.notes {
        let _ = writeln!(s, "note: {note}");
    }
    if violations.is_empty() {
        let _ = writeln!(s, "VERDICT: PASS");
    } else {
        let _ = writeln!(s, "VERDICT: FAIL");
        for v in &violations {
            let _ = writeln!(s, "  - {v}");
        }
    }
    print!("{s}");
    let _ = fs::write(out_dir.join("summary.txt"), &s);
    let _ = fs::write(out_dir.join("samples.csv"), procstat::csv(&incarnations));
    Ok(violations.is_empty())
}

fn latency(h: &crate::histogram::Histogram) -> String {
    if h.is_empty() {
        return "-".to_owned();
    }
    format!(
        "p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        h.percentile_ms(50.0).unwrap_or(0.0),
        h.percentile_ms(99.0).unwrap_or(0.0),
        h.max().unwrap_or(0) as f64 / 1000.0
    )
}

fn min_max(values: &[f64]) -> String {
    if values.is_empty() {
        return "-".to_owned();
    }
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(0.0, f64::max);
    format!("{min:.1}..{max:.1}s")
}

fn client_line(stats: &TrafficStats) -> String {
    let smpp_statuses: Vec<String> = stats.smpp_statuses.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let http_statuses: Vec<String> = stats.http_statuses.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!(
        "SMPP submit_sm {} (ok {}, no response {}, other {}); binds {} (failed attempts {}) | HTTP posts {} (202 {}, no answer {}, other {}){}",
        stats.smpp_submits,
        stats.smpp_ok,
        stats.smpp_no_response,
        if smpp_statuses.is_empty() {
            "none".to_owned()
        } else {
            smpp_statuses.join(" ")
        },
        stats.binds,
        stats.bind_failures,
        stats.http_posts,
        stats.http_accepted,
        stats.http_errors,
        if http_statuses.is_empty() {
            "none".to_owned()
        } else {
            http_statuses.join(" ")
        },
        stats
            .http_first_refusal
            .as_ref()
            .map(|r| format!("; first refusal: {r}"))
            .unwrap_or_default()
    )
}
