//! The soak's clients: SMPP sessions (test ESMEs) submitting with receipts, an SMPP
//! receiver collecting them, and HTTP clients posting `/v1/messages` with a callback URL.
//!
//! Each client paces itself (messages per second), records every message in the
//! [`Ledger`] before sending it and every acknowledgement after, and collects the
//! receipts its session got. A session the gateway closed (a SIGKILL) is bound again,
//! retrying until the restarted gateway answers. A multipart message whose parts were not
//! all acknowledged has its missing parts sent again (same content, same reference: the
//! gateway answers a repeated part with its first id), as an ESME would.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use sendium_protocols::smpp::build::BindKind;
use sendium_protocols::text::Alphabet;
use tokio::sync::watch;

use crate::esme::{Concat, DlrParts, EsmeOptions, SubmitSpec, TestEsme};
use crate::http;
use crate::wire::status_name;

use super::faults::Rng;
use super::ledger::{HTTP_SOURCE, Kind, Ledger, Multi, SMPP_SOURCE, destination, text};

/// Outstanding submit_sm per session.
const WINDOW: usize = 32;
/// How often a sender sends a batch.
const TICK: Duration = Duration::from_millis(250);
/// Attempts at the parts of one multipart message before giving up on it.
const MULTIPART_ATTEMPTS: u32 = 8;

/// One SMPP session of the soak.
#[derive(Debug)]
pub struct Slot {
    pub name: &'static str,
    pub system_id: &'static str,
    pub password: &'static str,
    pub kind: BindKind,
    /// Messages per second (0: a receiver).
    pub rate: f64,
    /// The gateway incarnation it last bound to (0: none yet).
    pub bound_in: AtomicU32,
}

/// Counters of what the clients saw.
#[derive(Debug, Clone, Default)]
pub struct TrafficStats {
    pub smpp_submits: u64,
    pub smpp_ok: u64,
    pub smpp_no_response: u64,
    /// Non-OK submit_sm_resp statuses.
    pub smpp_statuses: BTreeMap<String, u64>,
    pub binds: u64,
    pub bind_failures: u64,
    pub multipart_resent_parts: u64,
    pub multipart_abandoned: u64,
    pub http_posts: u64,
    pub http_accepted: u64,
    /// Non-202 answers.
    pub http_statuses: BTreeMap<u16, u64>,
    /// No answer (connection refused during a restart, timeouts).
    pub http_errors: u64,
    /// The first non-202 answer other than 503/429, for the report.
    pub http_first_refusal: Option<String>,
}

/// State shared by the clients and the controller.
pub struct Traffic {
    pub ledger: Mutex<Ledger>,
    pub stats: Mutex<TrafficStats>,
    /// No new messages (multipart parts still owed are sent).
    pub stop: AtomicBool,
    /// Clients end, closing their sessions.
    pub finished: AtomicBool,
    /// While true, clients send nothing (a restart is under way).
    pub paused: watch::Sender<bool>,
    /// The gateway incarnation now starting or running.
    pub incarnation: AtomicU32,
    /// Submissions (SMPP batches, HTTP requests) waiting for their answers right now:
    /// a SIGKILL waits for one, so it lands on work in flight.
    pub in_flight: AtomicU32,
    pub slots: Vec<Slot>,
    pub smpp_addr: SocketAddr,
    pub http_addr: SocketAddr,
    /// `http://127.0.0.1:PORT` of the callback sink.
    pub callback_base: String,
}

impl Traffic {
    pub fn new(smpp_addr: SocketAddr, http_addr: SocketAddr, callback_base: String, smpp_rate: f64) -> Traffic {
        let slot = |name, system_id, password, kind, rate| Slot {
            name,
            system_id,
            password,
            kind,
            rate,
            bound_in: AtomicU32::new(0),
        };
        Traffic {
            ledger: Mutex::new(Ledger::default()),
            stats: Mutex::new(TrafficStats::default()),
            stop: AtomicBool::new(false),
            finished: AtomicBool::new(false),
            paused: watch::Sender::new(true),
            incarnation: AtomicU32::new(1),
            in_flight: AtomicU32::new(0),
            slots: vec![
                slot("esme1-trx-a", "esme1", "secret", BindKind::Transceiver, smpp_rate * 0.4),
                slot("esme1-trx-b", "esme1", "secret", BindKind::Transceiver, smpp_rate * 0.3),
                slot("esme2-tx", "esme2", "secret2", BindKind::Transmitter, smpp_rate * 0.3),
                slot("esme2-rx", "esme2", "secret2", BindKind::Receiver, 0.0),
            ],
            smpp_addr,
            http_addr,
            callback_base,
        }
    }

    /// True when every session is bound to incarnation `n`.
    pub fn all_bound_to(&self, n: u32) -> bool {
        self.slots.iter().all(|s| s.bound_in.load(Ordering::Acquire) == n)
    }

    fn finished(&self) -> bool {
        self.finished.load(Ordering::Acquire)
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }
}

fn pick_smpp_kind(rng: &mut Rng, n: u64) -> Kind {
    match rng.below(100) {
        0..40 => Kind::SmppGsm,
        40..55 => Kind::SmppUcs2,
        55..65 => Kind::SmppGsmNoDlr,
        65..90 => Kind::SmppMulti(match n % 4 {
            0 => Multi::Udh8First,
            1 => Multi::Udh16Every,
            2 => Multi::SarLast,
            _ => Multi::Ucs2Every,
        }),
        _ => Kind::SmppReject,
    }
}

fn pick_http_kind(rng: &mut Rng) -> Kind {
    match rng.below(100) {
        0..65 => Kind::HttpShort,
        65..80 => Kind::HttpLong,
        80..90 => Kind::HttpUcs2,
        _ => Kind::HttpReject,
    }
}

/// The submit_sm PDUs of message `key`.
pub fn smpp_specs(key: u64, kind: Kind) -> Vec<SubmitSpec> {
    let dest = destination(key, kind);
    let body = text(key, kind);
    match kind {
        Kind::SmppUcs2 => vec![SubmitSpec::ucs2(SMPP_SOURCE, &dest, &body).dlr()],
        Kind::SmppGsmNoDlr => vec![SubmitSpec::gsm(SMPP_SOURCE, &dest, &body)],
        Kind::SmppMulti(style) => {
            let (alphabet, concat, dlr) = match style {
                Multi::Udh8First => (Alphabet::Gsm7, Concat::Udh8(key as u8), DlrParts::First),
                Multi::Udh16Every => (Alphabet::Gsm7, Concat::Udh16(key as u16), DlrParts::Every),
                Multi::SarLast => (Alphabet::Gsm7, Concat::Sar(key as u16), DlrParts::Last),
                Multi::Ucs2Every => (Alphabet::Ucs2, Concat::Udh8(key as u8), DlrParts::Every),
            };
            SubmitSpec::multipart(SMPP_SOURCE, &dest, alphabet, &body, concat, dlr)
        }
        _ => vec![SubmitSpec::gsm(SMPP_SOURCE, &dest, &body).dlr()],
    }
}

/// Records the receipts `esme` got since `seen`.
fn harvest(t: &Traffic, esme: &TestEsme, seen: &mut usize) {
    let receipts = esme.receipts();
    if receipts.len() <= *seen {
        return;
    }
    let mut ledger = t.ledger.lock();
    for r in &receipts[*seen..] {
        let state = r.state().map_or("?", |s| s.stat_text());
        ledger.smpp_receipt(r.message_id(), state, r.received_at);
    }
    *seen = receipts.len();
}

async fn bind(t: &Traffic, slot: &Slot) -> Option<TestEsme> {
    let options = EsmeOptions {
        bind_timeout: Duration::from_secs(5),
        ..EsmeOptions::default()
    };
    let incarnation = t.incarnation.load(Ordering::Acquire);
    match TestEsme::bind_with(t.smpp_addr, slot.system_id, slot.password, slot.kind, options).await {
        Ok(esme) => {
            slot.bound_in.store(incarnation, Ordering::Release);
            t.stats.lock().binds += 1;
            Some(esme)
        }
        Err(_) => {
            t.stats.lock().bind_failures += 1;
            None
        }
    }
}

/// The parts of one multipart message still to be acknowledged.
struct Owed {
    key: u64,
    parts: Vec<(usize, SubmitSpec)>,
}

/// One SMPP session: binds (again after every restart), submits at its rate, resends
/// the missing parts of multipart messages, and records the receipts it receives.
pub async fn smpp_client(t: Arc<Traffic>, slot_index: usize, seed: u64) {
    let Some(slot) = t.slots.get(slot_index) else {
        return;
    };
    let mut rng = Rng::new(seed);
    let mut paused = t.paused.subscribe();
    let mut esme: Option<TestEsme> = None;
    let mut seen = 0usize;
    let mut last_harvest = Instant::now();
    let mut owed: VecDeque<Owed> = VecDeque::new();
    let mut attempts: HashMap<u64, u32> = HashMap::new();
    let mut credit = 0.0f64;
    let mut sent = 0u64;
    let mut next = tokio::time::Instant::now();
    while !t.finished() {
        if esme.as_ref().is_none_or(TestEsme::is_closed) {
            if let Some(old) = esme.take() {
                harvest(&t, &old, &mut seen);
            }
            seen = 0;
            esme = bind(&t, slot).await;
            if esme.is_none() {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        }
        let Some(session) = esme.as_ref() else {
            continue;
        };
        if last_harvest.elapsed() >= Duration::from_secs(1) {
            harvest(&t, session, &mut seen);
            last_harvest = Instant::now();
        }
        if slot.rate <= 0.0 || *paused.borrow_and_update() {
            let _ = tokio::time::timeout(Duration::from_millis(200), paused.changed()).await;
            next = tokio::time::Instant::now();
            continue;
        }

        // This tick's batch: owed parts first, then new messages.
        let mut batch: Vec<(u64, usize, bool, SubmitSpec)> = Vec::new();
        for o in owed.drain(..) {
            for (part, spec) in o.parts {
                batch.push((o.key, part, true, spec));
            }
        }
        let resent = batch.len() as u64;
        if !t.stopped() {
            credit += slot.rate * TICK.as_secs_f64();
            let mut fresh = Vec::new();
            while credit >= 1.0 {
                credit -= 1.0;
                let kind = pick_smpp_kind(&mut rng, sent);
                sent += 1;
                fresh.push(kind);
            }
            if !fresh.is_empty() {
                let mut ledger = t.ledger.lock();
                for kind in fresh {
                    // The key decides the destination and text; register first, then build.
                    let key = ledger.len() as u64;
                    let specs = smpp_specs(key, kind);
                    let wants: Vec<bool> = specs.iter().map(|s| s.registered_delivery & 1 == 1).collect();
                    let added = ledger.add(kind, slot.name, &wants);
                    debug_assert_eq!(added, key);
                    let multi = specs.len() > 1;
                    for (part, spec) in specs.into_iter().enumerate() {
                        batch.push((added, part, multi, spec));
                    }
                }
            }
        }
        if !batch.is_empty() {
            let specs: Vec<SubmitSpec> = batch.iter().map(|b| b.3.clone()).collect();
            t.in_flight.fetch_add(1, Ordering::AcqRel);
            let outcomes = session.submit_pipelined(&specs, WINDOW).await;
            t.in_flight.fetch_sub(1, Ordering::AcqRel);
            let now = Instant::now();
            let mut failed: BTreeMap<u64, Vec<(usize, SubmitSpec)>> = BTreeMap::new();
            {
                let mut ledger = t.ledger.lock();
                let mut stats = t.stats.lock();
                stats.smpp_submits += batch.len() as u64;
                stats.multipart_resent_parts += resent;
                for ((key, part, multi, spec), outcome) in batch.into_iter().zip(outcomes) {
                    match outcome.status {
                        Some(_) if outcome.is_ok() && !outcome.message_id.is_empty() => {
                            stats.smpp_ok += 1;
                            ledger.ack(key, part, &outcome.message_id, now);
                            continue;
                        }
                        Some(status) => *stats.smpp_statuses.entry(status_name(status)).or_default() += 1,
                        None => stats.smpp_no_response += 1,
                    }
                    if multi {
                        failed.entry(key).or_default().push((part, spec));
                    }
                }
                for (key, parts) in failed {
                    let n = attempts.entry(key).or_insert(1);
                    *n += 1;
                    if *n > MULTIPART_ATTEMPTS {
                        ledger.abandon(key);
                        stats.multipart_abandoned += 1;
                        attempts.remove(&key);
                    } else {
                        owed.push_back(Owed { key, parts });
                    }
                }
            }
        }
        let now = tokio::time::Instant::now();
        next += TICK;
        if next + Duration::from_secs(1) < now {
            next = now;
        }
        tokio::time::sleep_until(next).await;
    }
    if let Some(session) = esme.take() {
        harvest(&t, &session, &mut seen);
        let _ = tokio::time::timeout(Duration::from_secs(2), session.unbind()).await;
        session.close().await;
    }
}

/// One HTTP client: `POST /v1/messages` at `rate` with a callback URL naming it.
pub async fn http_client(t: Arc<Traffic>, name: &'static str, api_key: &'static str, rate: f64, seed: u64) {
    if rate <= 0.0 {
        return;
    }
    let mut rng = Rng::new(seed);
    let mut paused = t.paused.subscribe();
    let interval = Duration::from_secs_f64(1.0 / rate);
    let auth = format!("Bearer {api_key}");
    let callback_url = format!("{}/dlr/{name}", t.callback_base);
    let mut next = tokio::time::Instant::now();
    while !t.finished() && !t.stopped() {
        if *paused.borrow_and_update() {
            let _ = tokio::time::timeout(Duration::from_millis(200), paused.changed()).await;
            next = tokio::time::Instant::now();
            continue;
        }
        let kind = pick_http_kind(&mut rng);
        let key = t.ledger.lock().add(kind, name, &[true]);
        let body = serde_json::json!({
            "from": HTTP_SOURCE,
            "to": destination(key, kind),
            "text": text(key, kind),
            "callback_url": callback_url,
        })
        .to_string();
        let headers = [("Authorization", auth.as_str()), ("Content-Type", "application/json")];
        t.in_flight.fetch_add(1, Ordering::AcqRel);
        let answer = http::request_with_timeout(
            t.http_addr,
            "POST",
            "/v1/messages",
            &headers,
            Some(body.as_bytes()),
            Duration::from_secs(10),
        )
        .await;
        t.in_flight.fetch_sub(1, Ordering::AcqRel);
        let now = Instant::now();
        match answer {
            Ok(resp) if resp.status == 202 => {
                let json = resp.json();
                let id = json.get("id").and_then(|v| v.as_str());
                let mut stats = t.stats.lock();
                stats.http_posts += 1;
                match id {
                    Some(id) => {
                        stats.http_accepted += 1;
                        drop(stats);
                        t.ledger.lock().ack(key, 0, id, now);
                    }
                    None => {
                        *stats.http_statuses.entry(202).or_default() += 1;
                        stats
                            .http_first_refusal
                            .get_or_insert_with(|| format!("202 without an id: {}", resp.text()));
                    }
                }
            }
            Ok(resp) => {
                let mut stats = t.stats.lock();
                stats.http_posts += 1;
                *stats.http_statuses.entry(resp.status).or_default() += 1;
                if resp.status != 503 && resp.status != 429 {
                    stats
                        .http_first_refusal
                        .get_or_insert_with(|| format!("{} {}", resp.status, resp.text()));
                }
            }
            Err(_) => {
                let mut stats = t.stats.lock();
                stats.http_posts += 1;
                stats.http_errors += 1;
            }
        }
        let now = tokio::time::Instant::now();
        next += interval;
        if next + Duration::from_secs(1) < now {
            next = now;
        }
        tokio::time::sleep_until(next).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multipart_specs_have_parts_and_receipt_flags() {
        let specs = smpp_specs(5, Kind::SmppMulti(Multi::Udh8First));
        assert!(specs.len() >= 3, "{}", specs.len());
        assert_eq!(specs[0].registered_delivery, 1);
        assert!(specs[1..].iter().all(|s| s.registered_delivery == 0));
        let every = smpp_specs(6, Kind::SmppMulti(Multi::Ucs2Every));
        assert!(every.len() >= 2 && every.iter().all(|s| s.registered_delivery == 1));
        let last = smpp_specs(7, Kind::SmppMulti(Multi::SarLast));
        assert_eq!(last.last().map(|s| s.registered_delivery), Some(1));
        assert_eq!(smpp_specs(8, Kind::SmppGsmNoDlr)[0].registered_delivery, 0);
        assert_eq!(
            smpp_specs(9, Kind::SmppReject)[0].destination,
            destination(9, Kind::SmppReject)
        );
    }
}
