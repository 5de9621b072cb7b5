//! The inbound phase of `sendium-bench`: mobile-originated messages from the test SMSC
//! through the gateway to a bound ESME.
//!
//! The test SMSC sends `--mo-messages` single-part GSM messages as `deliver_sm` over the
//! gateway's provider session as fast as the gateway answers them; one `[[mo-routes]]`
//! entry sends them all to the `bench` account, bound as a receiver. Each message is
//! stored in the DLR store before the provider's answer and delivered as one
//! `deliver_sm`. Reported per profile: messages per second from the first `deliver_sm`
//! sent to the last one received by the ESME, and the gateway's CPU per message (utime
//! + stime over the same span).

use std::time::{Duration, Instant};

use sendium_integration_tests::gateway::GatewayProcess;
use sendium_integration_tests::smsc::{MoSpec, SmscConfig, TestSmsc};
use sendium_integration_tests::{BindKind, TestEsme};

use super::rate_run::RateRun;
use super::{Bench, GATEWAY_TEMPLATE, find_profile, gateway_smpp_window, sample_proc, stop_gateway};

/// The profiles the phase runs: the DLR store is what inbound messages are stored in.
pub const PROFILES: [&str; 2] = ["memory", "file-file-file+dlr-file"];

const MO_ROUTE: &str = r#"
[[mo-routes]]
name = "bench"
to-account = "bench"
"#;

impl Bench {
    pub fn run_mo(&self, round: usize) -> Vec<RateRun> {
        PROFILES.iter().map(|p| self.run_mo_profile(p, round)).collect()
    }

    fn run_mo_profile(&self, name: &str, round: usize) -> RateRun {
        eprintln!("== inbound phase ({name}) ==");
        let o = &self.opts;
        let mut run = RateRun::new(name, o.mo_messages);
        let Some(profile) = find_profile(name) else {
            run.fail(format!("no profile {name}"));
            return run;
        };
        let smsc = TestSmsc::start_in_thread(SmscConfig {
            record: false,
            ..SmscConfig::default()
        });
        let template = format!(
            "{}{MO_ROUTE}",
            GATEWAY_TEMPLATE.replacen("{storage}", &profile.storage(), 1)
        );
        let mut gw = GatewayProcess::builder(&template)
            .smsc_port(smsc.port())
            .var("smpp_window", &gateway_smpp_window(o.window).to_string())
            .var("max_binds", "8")
            .ready_timeout(o.ready_timeout)
            .spawn();
        let ticks_per_s = self.ticks_per_s as f64;
        let result: Result<(), String> = self.ctl.block_on(async {
            gw.wait_ready().await;
            if !smsc.wait_bound(1, Duration::from_secs(10)).await {
                return Err("the gateway did not bind to the test SMSC".into());
            }
            let esme = TestEsme::bind(gw.smpp_addr(), "bench", "bench", BindKind::Receiver)
                .await
                .map_err(|e| format!("bind: {e}"))?;
            // Warm-up: a tenth of the load, not measured.
            send_and_receive(&smsc, &esme, (o.mo_messages / 10).max(1), 0, &format!("w{round}-")).await?;
            let pid = gw.pid().ok_or("the gateway is not running")?;
            let before = sample_proc(pid).ok_or("cannot read the gateway's /proc")?;
            let already = esme.mo_count() as u64;
            let took = send_and_receive(&smsc, &esme, o.mo_messages, already, &format!("m{round}-")).await?;
            let after = sample_proc(pid).ok_or("cannot read the gateway's /proc")?;
            let cpu_s = after.cpu_ticks.saturating_sub(before.cpu_ticks) as f64 / ticks_per_s;
            run.measured(took.as_secs_f64(), cpu_s);
            Ok(())
        });
        if let Err(e) = result {
            run.fail(e);
        }
        if let Some(note) = stop_gateway(&self.ctl, &mut gw) {
            eprintln!("  {note}");
        }
        self.ctl.block_on(smsc.shutdown());
        eprintln!(
            "  {:?} msgs/s, {:?} µs of gateway CPU per message",
            run.per_s, run.cpu_us_per_msg
        );
        run
    }
}

/// Send `n` messages in batches (at most 20,000 unanswered at once, so the SMSC's queue
/// stays bounded) and wait until the ESME, which had received `already`, received every
/// one. Returns the time from the first send to the last arrival.
async fn send_and_receive(
    smsc: &TestSmsc,
    esme: &TestEsme,
    n: u64,
    already: u64,
    tag: &str,
) -> Result<Duration, String> {
    let started = Instant::now();
    let answered_before = smsc.mo_answer_count() as u64;
    let mut sent = 0u64;
    while sent < n {
        let batch = (n - sent).min(1_000);
        let specs = (sent..sent + batch)
            .map(|i| {
                MoSpec::gsm(
                    &format!("{tag}{i}"),
                    "447700900001",
                    "81234",
                    &format!("inbound bench {i}"),
                )
            })
            .collect();
        smsc.send_mo("sendium", specs);
        sent += batch;
        while (smsc.mo_answer_count() as u64).saturating_sub(answered_before) + 20_000 < sent {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let want = already + n;
    while (esme.mo_count() as u64) < want {
        if Instant::now() > deadline {
            return Err(format!(
                "the ESME received {} of {n} inbound messages",
                (esme.mo_count() as u64).saturating_sub(already)
            ));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(started.elapsed())
}
