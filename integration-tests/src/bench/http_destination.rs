//! The HTTP-destination phase of `sendium-bench`: messages submitted over SMPP, sent to
//! a `kind = "http"` destination, their receipts posted back by the provider.
//!
//! The provider is the test kit's fake HTTP provider on 127.0.0.1 (counting, not
//! recording): it answers each request 200 with a message id and posts a DELIVRD receipt
//! for every accepted message to the gateway's `/v1/providers/{destination}/receipts`
//! in batches (up to 1,000 every 10 ms, token proof). The load generator submits
//! `--http-destination-messages` single-part messages asking for receipts and waits for
//! every receipt as a `deliver_sm`. Reported per profile: messages per second from the
//! first submit to the last receipt, and the gateway's CPU per message (utime + stime
//! over the same span).

use std::time::Duration;

use sendium_integration_tests::gateway::GatewayProcess;
use sendium_integration_tests::http_provider::FakeProvider;
use sendium_integration_tests::loadgen::{self, LoadConfig};

use super::rate_run::RateRun;
use super::{Bench, GATEWAY_TEMPLATE, Phase, find_profile, gateway_smpp_window, sample_proc, stop_gateway};

/// The profiles the phase runs.
pub const PROFILES: [&str; 2] = ["memory", "file-file-file+dlr-file"];

const DESTINATION: &str = "http-provider";
const RECEIPT_TOKEN: &str = "bench-receipts";

/// Replaces the template's SMPP destination and route.
const HTTP_DESTINATION: &str = r#"
[http]
listen = "127.0.0.1:{http_port}"

[[destinations]]
name = "http-provider"
kind = "http"
url = "http://127.0.0.1:{provider_port}/send"
fields = { to = "{to}", from = "{from}", text = "{text}", ref = "{id}" }
id-pointer = "/message_id"
window = 200
max-tps = 0
receipt-secret = "bench-receipts"
receipt-signature = "token"
receipt-status = { delivered = "DELIVRD" }
receipt-id-pointer = "/id"
receipt-status-pointer = "/status"

[[routes]]
name = "default"
to = ["http-provider"]
"#;

impl Bench {
    pub fn run_http_destination(&self, round: usize) -> Vec<RateRun> {
        PROFILES
            .iter()
            .map(|p| self.run_http_destination_profile(p, round))
            .collect()
    }

    fn run_http_destination_profile(&self, name: &str, round: usize) -> RateRun {
        eprintln!("== HTTP-destination phase ({name}) ==");
        let o = &self.opts;
        let mut run = RateRun::new(name, o.http_destination_messages);
        let Some(profile) = find_profile(name) else {
            run.fail(format!("no profile {name}"));
            return run;
        };
        // The provider runs on the load generator's threads, which keep turning while
        // this thread waits.
        let runtime = match self.loadgen_runtime() {
            Ok(r) => r,
            Err(e) => {
                run.fail(e);
                return run;
            }
        };
        let provider = runtime.block_on(FakeProvider::start_unrecorded());
        let Some(head) = GATEWAY_TEMPLATE.split("[[destinations]]").next() else {
            run.fail("the gateway template has no destination");
            return run;
        };
        let template = format!("{head}{HTTP_DESTINATION}").replacen("{storage}", &profile.storage(), 1);
        let mut builder = GatewayProcess::builder(&template)
            .var("provider_port", &provider.addr().port().to_string())
            .var("smpp_window", &gateway_smpp_window(o.window).to_string())
            .var("max_binds", "8")
            .ready_timeout(o.ready_timeout);
        for p in ["to", "from", "text", "id"] {
            builder = builder.var(p, &format!("{{{p}}}"));
        }
        let mut gw = builder.spawn();
        let ticks_per_s = self.ticks_per_s as f64;
        let result: Result<(), String> = runtime.block_on(async {
            gw.wait_ready().await;
            provider.post_receipts(gw.http_addr(), DESTINATION, RECEIPT_TOKEN);
            let config = |count: u64, prefix: &str| LoadConfig {
                count,
                dest_prefix: prefix.to_owned(),
                ..self.load_config(&gw, Phase::Throughput, None)
            };
            // Warm-up: a tenth of the load, not measured.
            let warm = (o.http_destination_messages / 10).max(1);
            check(loadgen::run(config(warm, &format!("4471{round}"))).await, warm)?;
            let pid = gw.pid().ok_or("the gateway is not running")?;
            let before = sample_proc(pid).ok_or("cannot read the gateway's /proc")?;
            let n = o.http_destination_messages;
            let report = tokio::time::timeout(o.phase_timeout, loadgen::run(config(n, &format!("4472{round}"))))
                .await
                .map_err(|_| format!("not done within {:?}", o.phase_timeout))?;
            let after = sample_proc(pid).ok_or("cannot read the gateway's /proc")?;
            let report = check(report, n)?;
            let cpu_s = after.cpu_ticks.saturating_sub(before.cpu_ticks) as f64 / ticks_per_s;
            run.measured(report.elapsed.as_secs_f64(), cpu_s);
            Ok(())
        });
        if let Err(e) = result {
            run.fail(e);
        }
        if let Some(note) = stop_gateway(&self.ctl, &mut gw) {
            eprintln!("  {note}");
        }
        eprintln!(
            "  {:?} msgs/s, {:?} µs of gateway CPU per message; provider accepted {}, receipts posted {}",
            run.per_s,
            run.cpu_us_per_msg,
            provider.accepted_count(),
            provider.receipts_posted()
        );
        drop(provider);
        runtime.shutdown_timeout(Duration::from_secs(2));
        run
    }
}

/// The report of a run in which every message was accepted and its receipt came back.
fn check(report: Result<loadgen::LoadReport, loadgen::LoadError>, n: u64) -> Result<loadgen::LoadReport, String> {
    let report = report.map_err(|e| format!("load generator: {e}"))?;
    if report.submits_ok < n || report.receipts_matched < n {
        return Err(format!(
            "{} of {n} accepted, {} receipts matched, {} missing, statuses {:?}",
            report.submits_ok, report.receipts_matched, report.receipts_missing, report.statuses
        ));
    }
    Ok(report)
}
