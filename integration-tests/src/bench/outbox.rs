//! The outbox phase of `sendium-bench`: a backlog of committed rows in an application's
//! PostgreSQL outbox table, relayed into the file profile's pending stage, then a
//! steady trickle of one-row commits and their delay from insert to admission.
//!
//! 1. **backlog**: `--outbox-rows` rows are committed before the gateway starts (the
//!    database is the bench's throwaway cluster, on the same cores); the gateway relays
//!    them with `--outbox-partitions` workers of `--outbox-batch` rows. Rows/s is counted
//!    between 5% and 95% of the backlog (the steady part), and over the whole of it.
//! 2. **trickle**: once the pipeline has sent the backlog, `--trickle-rate` one-row
//!    transactions per second for `--trickle-seconds`; p50 and p99 of the gateway's own
//!    `sendium_outbox_relay_delay_seconds` (insert to admission, bucket upper bounds).

use std::time::{Duration, Instant};

use sendium_integration_tests::gateway::GatewayProcess;
use sendium_integration_tests::outbox_load;
use sendium_integration_tests::pgstats::{PgCost, PgProbe};
use sendium_integration_tests::smsc::{SmscConfig, TestSmsc};
use sendium_storage::postgresql::test_cluster::TestCluster;
use serde_json::{Value, json};

use super::{
    Bench, GATEWAY_TEMPLATE, bucket_quantile, buckets, fetch_series, fetch_text, find_profile, gateway_smpp_window,
    metric_sums, pg_note, sample_proc, stop_gateway, wait_ready,
};

/// The profile the backlog is relayed into.
const PROFILE: &str = "file-file-file";
const RELAYED: &str = "sendium_outbox_relayed_total";
const DELAY_BUCKETS: &str = "sendium_outbox_relay_delay_seconds_bucket{source=\"bench\",le=\"";
const POLL: Duration = Duration::from_millis(100);

/// One round of the outbox phase.
#[derive(Debug, Clone, Default)]
pub struct OutboxRun {
    pub round: Option<usize>,
    pub rows: u64,
    pub commit_s: f64,
    /// Rows/s between 5% and 95% of the backlog, and from the gateway's start to the end.
    pub steady_rows_per_s: Option<f64>,
    pub overall_rows_per_s: Option<f64>,
    /// Gateway CPU over the backlog, in cores.
    pub gateway_cores: Option<f64>,
    pub db: Option<PgCost>,
    pub trickle_rows: u64,
    pub trickle_rate: Option<f64>,
    pub delay_p50_ms: Option<f64>,
    pub delay_p99_ms: Option<f64>,
    /// The application's own inserts (commit included) during the trickle.
    pub commit_p50_ms: Option<f64>,
    pub commit_p99_ms: Option<f64>,
    pub note: String,
    pub failed: bool,
}

impl OutboxRun {
    fn failed(note: String) -> OutboxRun {
        eprintln!("  {note}");
        OutboxRun {
            note,
            failed: true,
            ..OutboxRun::default()
        }
    }

    pub fn json(&self) -> Value {
        json!({
            "round": self.round,
            "rows": self.rows,
            "commit_seconds": self.commit_s,
            "steady_rows_per_second": self.steady_rows_per_s,
            "overall_rows_per_second": self.overall_rows_per_s,
            "gateway_cores": self.gateway_cores,
            "database": self.db.as_ref().map(super::pg_json),
            "trickle_rows": self.trickle_rows,
            "trickle_rate": self.trickle_rate,
            "delay_p50_ms": self.delay_p50_ms,
            "delay_p99_ms": self.delay_p99_ms,
            "commit_p50_ms": self.commit_p50_ms,
            "commit_p99_ms": self.commit_p99_ms,
            "note": self.note,
            "failed": self.failed,
        })
    }

    pub fn cells(&self) -> Vec<String> {
        let f = |v: Option<f64>, prec: usize| v.map_or("-".to_owned(), |v| format!("{v:.prec$}"));
        vec![
            self.round.map_or("-".to_owned(), |r| r.to_string()),
            self.rows.to_string(),
            f(self.steady_rows_per_s, 0),
            f(self.overall_rows_per_s, 0),
            f(self.gateway_cores, 2),
            self.db.as_ref().map_or("-".to_owned(), pg_note),
            format!("{} at {}/s", self.trickle_rows, f(self.trickle_rate, 0)),
            f(self.delay_p50_ms, 1),
            f(self.delay_p99_ms, 1),
            format!("{} / {}", f(self.commit_p50_ms, 1), f(self.commit_p99_ms, 1)),
            self.note.clone(),
        ]
    }
}

pub const HEADERS: [&str; 11] = [
    "round",
    "backlog rows",
    "rows/s (5-95%)",
    "rows/s (all)",
    "gw cores",
    "database",
    "trickle",
    "delay p50 ms",
    "delay p99 ms",
    "app insert p50/p99 ms",
    "note",
];

impl Bench {
    pub fn run_outbox(&self) -> OutboxRun {
        eprintln!("== outbox phase ({PROFILE}) ==");
        let o = &self.opts;
        let cluster = match self
            .pg_cluster
            .get_or_init(|| TestCluster::try_start().map_err(|e| e.to_string()))
        {
            Ok(c) => c,
            Err(e) => return OutboxRun::failed(format!("no PostgreSQL for the outbox table: {e}")),
        };
        let url = match cluster.try_fresh_database() {
            Ok(u) => u,
            Err(e) => return OutboxRun::failed(format!("no database: {e}")),
        };
        let probe = PgProbe {
            url: url.clone(),
            server_pid: cluster.server_pid(),
        };
        let pool = match self.ctl.block_on(outbox_load::create_table(&url)) {
            Ok(p) => p,
            Err(e) => return OutboxRun::failed(format!("cannot create the outbox table: {e}")),
        };
        let commit = match self
            .ctl
            .block_on(outbox_load::commit_backlog(&pool, "bench", "4479", o.outbox_rows))
        {
            Ok(d) => d,
            Err(e) => return OutboxRun::failed(format!("cannot commit the backlog: {e}")),
        };
        eprintln!("  {} rows committed in {:.1} s", o.outbox_rows, commit.as_secs_f64());
        let mut run = OutboxRun {
            rows: o.outbox_rows,
            commit_s: commit.as_secs_f64(),
            ..OutboxRun::default()
        };

        let smsc = TestSmsc::start_in_thread(SmscConfig {
            record: false,
            receipt_delay: o.receipt_delay,
            ..SmscConfig::default()
        });
        let Some(profile) = find_profile(PROFILE) else {
            return OutboxRun::failed(format!("no profile {PROFILE}"));
        };
        let template = format!(
            "{}\n[[outbox.sources]]\nname = \"bench\"\nurl = \"{{pg_url}}\"\npartitions = {}\nbatch-size = {}\n",
            GATEWAY_TEMPLATE.replacen("{storage}", &profile.storage(), 1),
            o.outbox_partitions,
            o.outbox_batch
        );
        let ready_timeout = o.ready_timeout;
        let mut gw = GatewayProcess::builder(&template)
            .smsc_port(smsc.port())
            .var("pg_url", &url)
            .var("smpp_window", &gateway_smpp_window(o.window).to_string())
            .var("max_binds", "8")
            // The whole backlog fits the pending stage: the figure is the relay's, not
            // the provider's pace.
            .env(
                "SENDIUM__SMS__PENDING__MAX_MESSAGES",
                &(o.outbox_rows * 2 + 100_000).to_string(),
            )
            .ready_timeout(ready_timeout)
            .spawn();
        let spawned = Instant::now();
        let pid = gw.pid().unwrap_or(0);
        let cpu_before = sample_proc(pid);
        let db_before = self.ctl.block_on(probe.sample());
        self.relay_backlog(&mut run, &gw, spawned);
        let cpu_after = sample_proc(pid);
        let db_after = self.ctl.block_on(probe.sample());
        if let (Some(b), Some(a), Some(done)) = (cpu_before, cpu_after, run.overall_rows_per_s) {
            let secs = run.rows as f64 / done;
            run.gateway_cores = Some((a.cpu_ticks - b.cpu_ticks) as f64 / self.ticks_per_s as f64 / secs);
        }
        if let (Some(b), Some(a)) = (db_before, db_after) {
            run.db = b.cost_until(&a, run.rows, self.ticks_per_s);
        }
        if !run.failed && wait_ready(&self.ctl, &mut gw, ready_timeout).is_ok() {
            // The pipeline sends the backlog before the trickle is measured.
            let sent = self.ctl.block_on(smsc.wait_accepted(run.rows, o.phase_timeout));
            if !sent {
                run.note = format!("the SMSC got {} of the backlog", smsc.stats().accepted);
            }
            match self.ctl.block_on(outbox_load::vacuum(&pool)) {
                Ok(d) => eprintln!("  table vacuumed after the backlog in {:.1} s", d.as_secs_f64()),
                Err(e) => eprintln!("  cannot vacuum the table: {e}"),
            }
            self.trickle(&mut run, &gw, &pool);
        }
        if let Some(note) = stop_gateway(&self.ctl, &mut gw) {
            eprintln!("  {note}");
        }
        self.ctl.block_on(smsc.shutdown());
        self.ctl.block_on(pool.close());
        run
    }

    /// Follow the relayed counter until the backlog is in.
    fn relay_backlog(&self, run: &mut OutboxRun, gw: &GatewayProcess, spawned: Instant) {
        let rows = run.rows as f64;
        let (mut t5, mut t95) = (None, None);
        let deadline = spawned + self.opts.phase_timeout;
        let mut last_print = Instant::now();
        loop {
            let relayed = self
                .ctl
                .block_on(fetch_series(gw.admin_addr()))
                .map(|s| metric_sums(&s).get(RELAYED).copied().unwrap_or(0.0))
                .unwrap_or(0.0);
            let now = Instant::now();
            if t5.is_none() && relayed >= 0.05 * rows {
                t5 = Some((now, relayed));
            }
            if t95.is_none() && relayed >= 0.95 * rows {
                t95 = Some((now, relayed));
            }
            if relayed >= rows {
                run.overall_rows_per_s = Some(rows / now.duration_since(spawned).as_secs_f64());
                if let (Some((a, na)), Some((b, nb))) = (t5, t95) {
                    let secs = b.duration_since(a).as_secs_f64();
                    run.steady_rows_per_s = (secs > 0.0).then(|| (nb - na) / secs);
                }
                eprintln!(
                    "  relayed {rows} rows in {:.1} s ({:.0} rows/s between 5% and 95%)",
                    now.duration_since(spawned).as_secs_f64(),
                    run.steady_rows_per_s.unwrap_or(0.0)
                );
                return;
            }
            if now > deadline {
                run.failed = true;
                run.note = format!("relayed {relayed} of {rows} rows within {:?}", self.opts.phase_timeout);
                eprintln!("  {}", run.note);
                return;
            }
            if last_print.elapsed() > Duration::from_secs(10) {
                eprintln!("  … {relayed} relayed");
                last_print = Instant::now();
            }
            std::thread::sleep(POLL);
        }
    }

    /// One-row commits at the trickle rate; the delay percentiles from the histogram.
    fn trickle(&self, run: &mut OutboxRun, gw: &GatewayProcess, pool: &sqlx::PgPool) {
        let o = &self.opts;
        let delays = |ctl: &tokio::runtime::Runtime| {
            ctl.block_on(fetch_text(gw.admin_addr()))
                .and_then(|t| buckets(&t, DELAY_BUCKETS))
                .unwrap_or_default()
        };
        let before = delays(&self.ctl);
        let result = self.ctl.block_on(outbox_load::trickle(
            pool,
            "bench",
            "4478",
            o.trickle_rate,
            Duration::from_secs(o.trickle_seconds),
        ));
        let t = match result {
            Ok(t) => t,
            Err(e) => {
                run.failed = true;
                run.note = format!("trickle failed: {e}");
                return;
            }
        };
        let (rows, rate) = (t.rows, t.rate);
        run.trickle_rows = rows;
        run.trickle_rate = Some(rate);
        run.commit_p50_ms = Some(t.commit_p50.as_secs_f64() * 1000.0);
        run.commit_p99_ms = Some(t.commit_p99.as_secs_f64() * 1000.0);
        let want = run.rows as f64 + rows as f64;
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let relayed = self
                .ctl
                .block_on(fetch_series(gw.admin_addr()))
                .map(|s| metric_sums(&s).get(RELAYED).copied().unwrap_or(0.0))
                .unwrap_or(0.0);
            if relayed >= want {
                break;
            }
            std::thread::sleep(POLL);
        }
        let after = delays(&self.ctl);
        run.delay_p50_ms = bucket_quantile(&before, &after, 0.5);
        run.delay_p99_ms = bucket_quantile(&before, &after, 0.99);
        eprintln!(
            "  trickle: {rows} rows at {rate:.0}/s; insert to admission p50 ≤ {:?} ms, p99 ≤ {:?} ms; \
             the application's inserts p50 {:.1} ms, p99 {:.1} ms",
            run.delay_p50_ms,
            run.delay_p99_ms,
            t.commit_p50.as_secs_f64() * 1000.0,
            t.commit_p99.as_secs_f64() * 1000.0
        );
    }
}
