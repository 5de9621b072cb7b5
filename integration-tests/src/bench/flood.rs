//! The flood phase of `sendium-bench`: an ESME's bind time and submit throughput while
//! 5,000 connections that never bind are held open against the SMPP port.
//!
//! The memory profile (so the figure is the listener's, not the disk's). The flood comes
//! from 400 loopback addresses (127.1.x.y, 13 connections each), as a botnet would; the
//! gateway keeps at most its unbound budget of them (`[smpp] max-unbound`, 256) and closes
//! the rest. Throughput is measured in alternating windows — without the flood, with it
//! — `--flood-pairs` times (`--flood-messages` submit_sm, 100 in flight, each; which
//! comes first alternates), and the median ratio is reported: the target is at least 0.9.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use sendium_integration_tests::gateway::GatewayProcess;
use sendium_integration_tests::smsc::{SmscConfig, TestSmsc};
use sendium_integration_tests::{BindKind, SubmitSpec, TestEsme};
use tokio::net::TcpStream;

use super::{Bench, GATEWAY_TEMPLATE, find_profile, gateway_smpp_window, stop_gateway};

const PROFILE: &str = "memory";
const FLOOD: u32 = 5_000;

/// One run of the flood phase.
#[derive(Debug, Clone, Default)]
pub struct FloodRun {
    pub round: Option<usize>,
    /// Connections the flood held open (the client's side).
    pub flood_open: usize,
    pub bind_ms: Option<f64>,
    pub quiet_per_s: Vec<f64>,
    pub flooded_per_s: Vec<f64>,
    pub note: String,
    pub failed: bool,
}

pub const HEADERS: [&str; 6] = [
    "round",
    "flood connections",
    "bind during flood",
    "msgs/s without",
    "msgs/s with",
    "median ratio",
];

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

impl FloodRun {
    pub fn ratio(&self) -> Option<f64> {
        let ratios: Vec<f64> = self
            .quiet_per_s
            .iter()
            .zip(&self.flooded_per_s)
            .map(|(q, f)| f / q)
            .collect();
        median(ratios)
    }

    pub fn cells(&self) -> Vec<String> {
        let f = |v: Option<f64>, digits: usize| v.map_or("-".into(), |x| format!("{x:.digits$}"));
        vec![
            self.round.map_or("-".into(), |r| r.to_string()),
            self.flood_open.to_string(),
            self.bind_ms.map_or("-".into(), |ms| format!("{ms:.1} ms")),
            f(median(self.quiet_per_s.clone()), 0),
            f(median(self.flooded_per_s.clone()), 0),
            f(self.ratio(), 3),
        ]
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "round": self.round,
            "flood_open": self.flood_open,
            "bind_ms": self.bind_ms,
            "quiet_per_s": self.quiet_per_s,
            "flooded_per_s": self.flooded_per_s,
            "median_ratio": self.ratio(),
            "note": self.note,
            "failed": self.failed,
        })
    }
}

async fn connect_from(from: Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((from, 0)))?;
    socket.connect(to).await
}

async fn open_flood(to: SocketAddr) -> Vec<TcpStream> {
    let mut opening = tokio::task::JoinSet::new();
    let mut open = Vec::new();
    for n in 0..FLOOD {
        let (hi, lo) = ((n % 400) / 200, n % 200 + 1);
        let from = Ipv4Addr::new(127, 1, u8::try_from(hi).unwrap_or(0), u8::try_from(lo).unwrap_or(1));
        opening.spawn(connect_from(from, to));
        while opening.len() >= 200 {
            if let Some(Ok(Ok(s))) = opening.join_next().await {
                open.push(s);
            }
        }
    }
    while let Some(done) = opening.join_next().await {
        if let Ok(Ok(s)) = done {
            open.push(s);
        }
    }
    open
}

/// Submits per second over one fresh session.
async fn throughput(to: SocketAddr, n: u64, tag: u64) -> Result<f64, String> {
    let esme = TestEsme::bind(to, "bench", "bench", BindKind::Transceiver)
        .await
        .map_err(|e| format!("bind: {e}"))?;
    let specs: Vec<SubmitSpec> = (0..n)
        .map(|i| SubmitSpec::gsm("Bench", &format!("4470{tag:02}{i:07}"), "flood phase"))
        .collect();
    let started = Instant::now();
    let outcomes = esme.submit_pipelined(&specs, 100).await;
    let secs = started.elapsed().as_secs_f64();
    let ok = outcomes.iter().filter(|o| o.is_ok()).count();
    if ok != specs.len() {
        return Err(format!("{} of {} submits refused", specs.len() - ok, specs.len()));
    }
    Ok(n as f64 / secs)
}

impl Bench {
    pub fn run_flood(&self) -> FloodRun {
        eprintln!("== flood phase ({PROFILE}, {FLOOD} idle connections) ==");
        let o = &self.opts;
        let Some(profile) = find_profile(PROFILE) else {
            eprintln!("  no profile {PROFILE}");
            return FloodRun {
                note: format!("no profile {PROFILE}"),
                failed: true,
                ..FloodRun::default()
            };
        };
        let smsc = TestSmsc::start_in_thread(SmscConfig {
            record: false,
            ..SmscConfig::default()
        });
        let mut gw = GatewayProcess::builder(&GATEWAY_TEMPLATE.replacen("{storage}", &profile.storage(), 1))
            .smsc_port(smsc.port())
            .var("smpp_window", &gateway_smpp_window(o.window).to_string())
            .var("max_binds", "8")
            .ready_timeout(o.ready_timeout)
            .spawn();
        let mut run = FloodRun::default();
        let addr = gw.smpp_addr();
        let result: Result<(), String> = self.ctl.block_on(async {
            gw.wait_ready().await;
            // Warm-up.
            throughput(addr, o.flood_messages, 99).await?;
            for pair in 0..o.flood_pairs {
                let tag = u64::from(pair) * 2;
                // Alternate which comes first, so neither side always runs warmer.
                let quiet_first = pair % 2 == 0;
                if quiet_first {
                    run.quiet_per_s.push(throughput(addr, o.flood_messages, tag).await?);
                }
                let flood = open_flood(addr).await;
                run.flood_open = flood.len();
                // The listener works through its accept queue (closing what exceeds its
                // unbound budget) first; the ESME then binds with the flood held open.
                tokio::time::sleep(Duration::from_secs(1)).await;
                let started = Instant::now();
                let esme = TestEsme::bind(addr, "bench2", "bench2", BindKind::Transceiver)
                    .await
                    .map_err(|e| format!("bind during the flood: {e}"))?;
                let bind_ms = started.elapsed().as_secs_f64() * 1e3;
                run.bind_ms = Some(run.bind_ms.map_or(bind_ms, |b: f64| b.max(bind_ms)));
                drop(esme);
                run.flooded_per_s
                    .push(throughput(addr, o.flood_messages, tag + 1).await?);
                drop(flood);
                tokio::time::sleep(Duration::from_millis(200)).await;
                if !quiet_first {
                    run.quiet_per_s.push(throughput(addr, o.flood_messages, tag).await?);
                }
            }
            Ok(())
        });
        if let Err(e) = result {
            eprintln!("  {e}");
            run.note = e;
            run.failed = true;
        }
        if let Some(note) = stop_gateway(&self.ctl, &mut gw) {
            eprintln!("  {note}");
        }
        self.ctl.block_on(smsc.shutdown());
        eprintln!(
            "  without {:?} msgs/s, with {:?} msgs/s, median ratio {:?}, bind {:?} ms",
            run.quiet_per_s,
            run.flooded_per_s,
            run.ratio(),
            run.bind_ms
        );
        run
    }
}
