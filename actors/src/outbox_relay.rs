//! The outbox relay: Sendium reads applications' outbox tables (`[[outbox.sources]]`)
//! and admits their committed rows like HTTP submissions, with each row's `event_id`
//! as the idempotency key.
//!
//! Per source, one worker per partition loops: begin a delivery (on PostgreSQL a short
//! transaction holding the partition's advisory lock), check each row, admit the
//! batch in order through Ingress, and settle the rows in the delivery once their
//! admission is as durable as the pending stage promises. A crash between admission
//! and settlement leaves the rows to be read again; their event ids make the second
//! admission a duplicate, answered with the first one's message id, so nothing is
//! sent twice.
//!
//! Order within a `group_key`: rows are read in `id` order, admitted as a prefix (the
//! first refused row refuses the rest of the batch), and a group's later rows wait
//! while an earlier one waits for its retry. A row Sendium refuses for what it says
//! (unknown account, invalid number, empty body) is retried with a growing delay and
//! goes dead after `max-attempts`; only its own group waits for that.
//!
//! Workers wake when the source notifies (PostgreSQL's `LISTEN` on the table's name,
//! fed by the schema's trigger) and poll every `poll-interval` in any case. A source
//! whose database is down is retried with backoff and named by `/readyz`; the rest of
//! the gateway is not affected.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use sendium_outbox::relay::{OutboxRow, OutboxSource, RelayError, RelaySettings, RowOutcome, Settled, SourceStats};
use sendium_outbox::{Dialect, TableName};
use sendium_profiles::{Config, OutboxSourceConfig};
use sendium_protocols::callback::CallbackTargets;
use sendium_protocols::http::validate_submission;
use sendium_storage::PendingRecord;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::context::Shared;
use crate::http_ingress;
use crate::ingress::{self, Admission, ReceiptPolicy, Refusal};

/// How often a source's backlog is counted and its expired relayed rows forgotten.
const STATS_EVERY: Duration = Duration::from_secs(2);
/// Relayed rows past their retention deleted per sweep at most.
const FORGET_BATCH: i64 = 10_000;
/// First delay after a transient refusal or a failing database; it doubles up to the
/// source's `max-backoff`.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// First delay before a refused row is tried again; it doubles with each attempt.
const FIRST_REFUSAL_DELAY: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct OutboxConfigError {
    pub key: String,
    pub reason: String,
}

/// What the relay needs to know of the gateway to check a row before admitting it.
struct Admissions {
    shared: Arc<Shared>,
    /// `[[smpp.accounts]]` system ids: a row's account must be one of them (replaced by
    /// a reload).
    accounts: parking_lot::RwLock<HashSet<String>>,
    /// Receipt requests are refused (`dlr.backend = "disabled"`, refuse policy).
    refuse_receipts: bool,
    /// Where a row's `callback_url` may point.
    callback_targets: CallbackTargets,
}

/// The relays of every configured source.
pub struct OutboxRelays {
    sources: Vec<Arc<SourceRelay>>,
    admissions: Option<Arc<Admissions>>,
}

/// One source: its connections, its workers' shared state, and what dashboards read.
pub struct SourceRelay {
    name: String,
    dialect: Dialect,
    source: OutboxSource,
    poll_interval: Duration,
    max_backoff: Duration,
    /// One per partition: the listener wakes the worker of the lane a commit inserted into.
    wake: Vec<Notify>,
    reachable: AtomicBool,
    last_error: Mutex<Option<String>>,
    held: Vec<AtomicBool>,
    relayed: AtomicU64,
    retries: AtomicU64,
    went_dead: AtomicU64,
    stats: Mutex<Option<StatsReading>>,
}

#[derive(Clone, Copy)]
struct StatsReading {
    stats: SourceStats,
    relayed_per_second: f64,
}

/// `/admin/outbox`: one source as an operator sees it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SourceView {
    pub name: String,
    pub dialect: &'static str,
    pub table: String,
    pub partitions: u16,
    /// Partitions this process relays now (the others are relayed by another process).
    pub held: Vec<u16>,
    /// The database answered the last delivery or count.
    pub reachable: bool,
    pub error: Option<String>,
    /// Rows not relayed yet, the age of the oldest, and dead rows (last count).
    pub backlog: Option<u64>,
    pub oldest_seconds: Option<f64>,
    pub dead: Option<u64>,
    /// Rows admitted per second over the last counting interval.
    pub relayed_per_second: Option<f64>,
    /// Since start: rows relayed, retries (transient and refusals), rows that went dead.
    pub relayed_total: u64,
    pub retries_total: u64,
    pub dead_total: u64,
}

impl OutboxRelays {
    /// Open every source (nothing is connected yet) and start their workers; they stop
    /// when `shutdown` is cancelled. A URL that cannot be parsed fails startup.
    pub fn start(
        cfg: &Config,
        shared: Arc<Shared>,
        receipts: ReceiptPolicy,
        shutdown: &CancellationToken,
    ) -> Result<(OutboxRelays, Vec<JoinHandle<()>>), OutboxConfigError> {
        let admissions = Arc::new(Admissions {
            shared,
            accounts: parking_lot::RwLock::new(
                cfg.smpp
                    .iter()
                    .flat_map(|s| s.accounts.iter().map(|a| a.system_id.clone()))
                    .collect(),
            ),
            refuse_receipts: receipts == ReceiptPolicy::Refuse,
            callback_targets: crate::spec::callback_targets(cfg),
        });
        let mut sources = Vec::new();
        let mut tasks = Vec::new();
        for (i, c) in cfg.outbox.sources.iter().enumerate() {
            let relay = Arc::new(SourceRelay::open(i, c)?);
            for partition in 0..c.partitions.max(1) {
                tasks.push(tokio::spawn(work_partition(
                    relay.clone(),
                    partition,
                    admissions.clone(),
                    shutdown.clone(),
                )));
            }
            if relay.dialect == Dialect::Postgresql {
                tasks.push(tokio::spawn(listen(relay.clone(), shutdown.clone())));
            }
            tasks.push(tokio::spawn(count(relay.clone(), shutdown.clone())));
            tracing::info!(
                source = %c.name,
                dialect = %relay.dialect,
                table = %c.table,
                partitions = c.partitions,
                "relaying outbox source"
            );
            sources.push(relay);
        }
        Ok((
            OutboxRelays {
                sources,
                admissions: Some(admissions),
            },
            tasks,
        ))
    }

    /// No sources.
    pub fn none() -> OutboxRelays {
        OutboxRelays {
            sources: Vec::new(),
            admissions: None,
        }
    }

    /// A reload's account list: rows of other accounts are refused from now on.
    pub fn set_accounts(&self, accounts: HashSet<String>) {
        if let Some(a) = &self.admissions {
            *a.accounts.write() = accounts;
        }
    }

    pub fn views(&self) -> Vec<SourceView> {
        self.sources.iter().map(|s| s.view()).collect()
    }

    /// Sources whose database does not answer, with the error.
    pub fn unreachable(&self) -> Vec<String> {
        self.sources
            .iter()
            .filter(|s| !s.reachable.load(Ordering::Acquire))
            .map(|s| {
                format!(
                    "outbox source {}: {}",
                    s.name,
                    s.last_error.lock().clone().unwrap_or_else(|| "unreachable".into())
                )
            })
            .collect()
    }

    pub async fn close(&self) {
        for s in &self.sources {
            s.source.close().await;
        }
    }
}

/// The source `outbox.sources[i]` (`c`), not connected yet. Errors name the key.
pub fn open_source(i: usize, c: &OutboxSourceConfig) -> Result<OutboxSource, OutboxConfigError> {
    let key = |k: &str| format!("outbox.sources[{i}].{k}");
    let table = TableName::new(&c.table).map_err(|e| OutboxConfigError {
        key: key("table"),
        reason: e.to_string(),
    })?;
    let settings = RelaySettings {
        table,
        partitions: c.partitions.max(1),
        batch_size: c.batch_size.max(1),
        retention: c.retention,
        max_attempts: c.max_attempts.max(1),
    };
    OutboxSource::open(c.url.expose(), settings).map_err(|e| OutboxConfigError {
        key: key("url"),
        // The URL itself is not repeated: it may carry a password.
        reason: match e {
            RelayError::Database { source, .. } => format!("cannot be used: {source}"),
            other => other.to_string(),
        },
    })
}

impl SourceRelay {
    fn open(i: usize, c: &OutboxSourceConfig) -> Result<SourceRelay, OutboxConfigError> {
        let source = open_source(i, c)?;
        Ok(SourceRelay {
            name: c.name.clone(),
            dialect: match source {
                OutboxSource::Postgresql(_) => Dialect::Postgresql,
                OutboxSource::Sqlite(_) => Dialect::Sqlite,
            },
            source,
            poll_interval: c.poll_interval,
            max_backoff: c.max_backoff.max(FIRST_BACKOFF),
            wake: (0..c.partitions.max(1)).map(|_| Notify::new()).collect(),
            // Until the first delivery says otherwise.
            reachable: AtomicBool::new(true),
            last_error: Mutex::new(None),
            held: (0..c.partitions.max(1)).map(|_| AtomicBool::new(false)).collect(),
            relayed: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            went_dead: AtomicU64::new(0),
            stats: Mutex::new(None),
        })
    }

    fn view(&self) -> SourceView {
        let settings = self.source.settings();
        let reading = *self.stats.lock();
        SourceView {
            name: self.name.clone(),
            dialect: self.dialect.as_str(),
            table: settings.table.to_string(),
            partitions: settings.partitions,
            held: (0u16..)
                .zip(&self.held)
                .filter(|(_, h)| h.load(Ordering::Relaxed))
                .map(|(p, _)| p)
                .collect(),
            reachable: self.reachable.load(Ordering::Acquire),
            error: self.last_error.lock().clone(),
            backlog: reading.map(|r| r.stats.backlog),
            oldest_seconds: reading.map(|r| r.stats.oldest.map_or(0.0, |d| d.as_secs_f64())),
            dead: reading.map(|r| r.stats.dead),
            relayed_per_second: reading.map(|r| r.relayed_per_second),
            relayed_total: self.relayed.load(Ordering::Relaxed),
            retries_total: self.retries.load(Ordering::Relaxed),
            dead_total: self.went_dead.load(Ordering::Relaxed),
        }
    }

    fn answered(&self) {
        if !self.reachable.swap(true, Ordering::AcqRel) {
            tracing::info!(source = %self.name, "outbox source reachable again");
        }
        *self.last_error.lock() = None;
    }

    fn failed(&self, e: &RelayError) {
        let text = e.to_string();
        if self.reachable.swap(false, Ordering::AcqRel) {
            tracing::error!(source = %self.name, error = %text, "outbox source unreachable: retrying with backoff");
        }
        *self.last_error.lock() = Some(text);
    }

    fn settled(&self, s: Settled) {
        let name = self.name.clone();
        self.relayed.fetch_add(s.admitted, Ordering::Relaxed);
        self.retries.fetch_add(s.retried, Ordering::Relaxed);
        self.went_dead.fetch_add(s.dead, Ordering::Relaxed);
        metrics::counter!("sendium_outbox_relayed_total", "source" => name.clone()).increment(s.admitted);
        metrics::counter!("sendium_outbox_retries_total", "source" => name.clone()).increment(s.retried);
        if s.dead > 0 {
            metrics::counter!("sendium_outbox_dead_total", "source" => name).increment(s.dead);
            tracing::warn!(
                source = %self.name,
                rows = s.dead,
                "outbox rows refused max-attempts times are dead (sendium outbox dead lists them)"
            );
        }
    }
}

/// What one delivery did, for the worker's pacing.
enum Cycle {
    /// Another process relays this partition now.
    Held,
    /// As many rows as a batch holds: there may be more due.
    Full,
    /// Fewer: wait for a notification or the poll interval.
    Drained,
    /// A row was refused for a reason that passes (pipeline full, a store failing).
    Pushback,
}

async fn work_partition(
    relay: Arc<SourceRelay>,
    partition: u16,
    admissions: Arc<Admissions>,
    shutdown: CancellationToken,
) {
    let mut backoff = Duration::ZERO;
    let held = &relay.held[usize::from(partition)];
    let mut position = ReadPosition::new();
    loop {
        // Registered before the delivery, so a commit notified while it runs is not missed.
        let notified = relay.wake[usize::from(partition)].notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let after = position.start(relay.poll_interval);
        let cycle = tokio::select! {
            c = deliver(&relay, partition, &admissions, backoff, after) => c,
            () = shutdown.cancelled() => break,
        };
        let pause = match cycle {
            Ok((c, next)) => {
                position.after = next;
                relay.answered();
                held.store(!matches!(c, Cycle::Held), Ordering::Relaxed);
                match c {
                    Cycle::Full => {
                        backoff = Duration::ZERO;
                        continue;
                    }
                    Cycle::Drained | Cycle::Held => {
                        backoff = Duration::ZERO;
                        None
                    }
                    Cycle::Pushback => {
                        backoff = next_backoff(backoff, relay.max_backoff);
                        Some(backoff)
                    }
                }
            }
            Err(e) => {
                held.store(false, Ordering::Relaxed);
                relay.failed(&e);
                backoff = next_backoff(backoff, relay.max_backoff);
                Some(backoff)
            }
        };
        match pause {
            Some(d) => tokio::select! {
                () = tokio::time::sleep(d) => {}
                () = shutdown.cancelled() => break,
            },
            None => tokio::select! {
                () = &mut notified => {}
                () = tokio::time::sleep(relay.poll_interval) => {}
                () = shutdown.cancelled() => break,
            },
        }
    }
    held.store(false, Ordering::Relaxed);
}

/// Where a partition's next read starts: after the rows its last delivery finished,
/// and from the start at least every `poll-interval` (for rows that committed after
/// rows with higher ids were read, and for retries that came due).
struct ReadPosition {
    after: i64,
    full_read_at: Option<Instant>,
}

impl ReadPosition {
    fn new() -> Self {
        Self {
            after: 0,
            full_read_at: None,
        }
    }

    /// The id the next read starts after.
    fn start(&mut self, every: Duration) -> i64 {
        if self.full_read_at.is_none_or(|at| at.elapsed() >= every) {
            self.full_read_at = Some(Instant::now());
            self.after = 0;
        }
        self.after
    }
}

fn next_backoff(current: Duration, max: Duration) -> Duration {
    if current.is_zero() {
        FIRST_BACKOFF.min(max)
    } else {
        (current * 2).min(max)
    }
}

/// One delivery of `partition` reading after id `after`: read, check, admit in order,
/// settle. Returns where the next read may start: before the first row to read again
/// soon (skipped, or waiting for a transient retry), else after the last row read.
async fn deliver(
    relay: &SourceRelay,
    partition: u16,
    admissions: &Admissions,
    backoff: Duration,
    after: i64,
) -> Result<(Cycle, i64), RelayError> {
    let Some(delivery) = relay.source.begin_after(partition, after).await? else {
        return Ok((Cycle::Held, after));
    };
    let read_at = Instant::now();
    let rows = delivery.rows();
    let batch = usize::try_from(relay.source.settings().batch_size).unwrap_or(usize::MAX);
    if rows.is_empty() {
        delivery.abandon().await?;
        return Ok((Cycle::Drained, after));
    }
    let full = rows.len() >= batch;
    let mut outcomes: Vec<(i64, RowOutcome)> = Vec::with_capacity(rows.len());
    // Groups whose earlier row was not admitted in this delivery: their later rows wait.
    let mut stuck: HashSet<&str> = HashSet::new();
    let mut records = Vec::with_capacity(rows.len());
    let mut admitting = Vec::with_capacity(rows.len());
    for row in rows {
        let group = row.message.group_key.as_deref();
        if group.is_some_and(|g| stuck.contains(g)) {
            outcomes.push((row.id, RowOutcome::Skipped));
            continue;
        }
        match admissions.record(row) {
            Ok(record) => {
                admitting.push(row);
                records.push(record);
            }
            Err(error) => {
                outcomes.push((
                    row.id,
                    RowOutcome::Refused {
                        error,
                        after: refusal_delay(row.attempts, relay.max_backoff),
                    },
                ));
                if let Some(g) = group {
                    stuck.insert(g);
                }
            }
        }
    }
    let mut pushback = false;
    if !records.is_empty() {
        let answers = ingress::admit_in_order(&admissions.shared, records).await;
        let mut refused = false;
        for (row, answer) in admitting.iter().zip(answers) {
            let outcome = match answer {
                Admission::Accepted(_) | Admission::Duplicate(_) => {
                    // From the row's insert to its admission.
                    let delay = (row.age + read_at.elapsed()).as_secs_f64();
                    metrics::histogram!("sendium_outbox_relay_delay_seconds", "source" => relay.name.clone())
                        .record(delay);
                    RowOutcome::Admitted
                }
                // The first refusal is the row's own; the rest of the batch was cut off
                // behind it and is read again as it is.
                Admission::Refused(_) if refused => RowOutcome::Skipped,
                // What the row says: it will not change by waiting.
                Admission::Refused(reason @ Refusal::IdempotencyKeyReused) => {
                    refused = true;
                    RowOutcome::Refused {
                        error: describe(reason).into(),
                        after: refusal_delay(row.attempts, relay.max_backoff),
                    }
                }
                Admission::Refused(reason) => {
                    refused = true;
                    pushback = true;
                    RowOutcome::Retry {
                        error: describe(reason).into(),
                        after: next_backoff(backoff, relay.max_backoff),
                    }
                }
            };
            outcomes.push((row.id, outcome));
        }
    }
    // Admitted, not settled: a crash here leaves the rows to be read again.
    sendium_storage::failpoint::hit("outbox-admitted");
    let again = outcomes
        .iter()
        .filter(|(_, o)| matches!(o, RowOutcome::Skipped | RowOutcome::Retry { .. }))
        .map(|(id, _)| id - 1)
        .min();
    let next = again.unwrap_or_else(|| outcomes.iter().map(|(id, _)| *id).max().unwrap_or(after));
    let settled = delivery.settle(&outcomes).await?;
    relay.settled(settled);
    let cycle = if pushback {
        Cycle::Pushback
    } else if full {
        Cycle::Full
    } else {
        Cycle::Drained
    };
    Ok((cycle, next))
}

/// How long a row refused `attempts` times before waits for its next attempt.
fn refusal_delay(attempts: u32, max: Duration) -> Duration {
    FIRST_REFUSAL_DELAY
        .checked_mul(1u32 << attempts.min(20))
        .unwrap_or(max)
        .min(max)
}

fn describe(refusal: Refusal) -> &'static str {
    match refusal {
        Refusal::QueueFull => "the pending stage is full",
        Refusal::ReceiptCapacity => "the receipt store is at capacity",
        Refusal::ReceiptStoreUnavailable => "the receipt store is failing",
        Refusal::ReceiptsDisabled => "receipts are disabled on this gateway",
        Refusal::Unavailable => "the pipeline is not accepting",
        Refusal::IdempotencyKeyReused => "event_id: already relayed for a different message",
    }
}

impl Admissions {
    /// The pending record of a row, or why Sendium refuses it for what it says.
    fn record(&self, row: &OutboxRow) -> Result<PendingRecord, String> {
        let m = &row.message;
        if !self.accounts.read().contains(&m.account) {
            return Err(format!(
                "account {:?} is not configured in [[smpp.accounts]]",
                m.account
            ));
        }
        if m.callback_url.is_some() && self.refuse_receipts {
            return Err("callback_url: receipts are disabled on this gateway (dlr.backend = \"disabled\")".into());
        }
        let event_id = row.event_id.to_string();
        let submission = validate_submission(
            &m.account,
            &m.source_addr,
            &m.destination_addr,
            &m.body,
            m.callback_url.as_deref(),
            Some(&event_id),
            &self.callback_targets,
        )
        .map_err(|e| format!("{}: {}", column(e.field), e.reason))?;
        http_ingress::record(submission).map_err(|(field, reason)| format!("{}: {reason}", column(field)))
    }
}

/// The outbox column of a submission field.
fn column(field: &str) -> &str {
    match field {
        "from" => "source_addr",
        "to" => "destination_addr",
        "text" => "body",
        "idempotency_key" => "event_id",
        other => other,
    }
}

/// Wake the workers of a PostgreSQL source when its trigger notifies: the payload is
/// the lane a commit inserted into, and only that lane's worker wakes.
async fn listen(relay: Arc<SourceRelay>, shutdown: CancellationToken) {
    let OutboxSource::Postgresql(pg) = &relay.source else {
        return;
    };
    let wake_all = || relay.wake.iter().for_each(Notify::notify_waiters);
    let mut backoff = Duration::ZERO;
    loop {
        if let Ok(mut listener) = pg.listen().await {
            backoff = Duration::ZERO;
            // Anything committed while not listening is due now.
            wake_all();
            loop {
                tokio::select! {
                    n = listener.recv() => match n {
                        Ok(n) => match n.payload().parse::<usize>() {
                            Ok(lane) => relay.wake[lane % relay.wake.len()].notify_waiters(),
                            Err(_) => wake_all(),
                        },
                        Err(_) => break,
                    },
                    () = shutdown.cancelled() => return,
                }
            }
        }
        backoff = next_backoff(backoff, relay.max_backoff);
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

/// Count a source's backlog for dashboards, and forget relayed rows past retention.
async fn count(relay: Arc<SourceRelay>, shutdown: CancellationToken) {
    let mut last: Option<(Instant, u64)> = None;
    let mut rate = 0.0;
    loop {
        match relay.source.stats().await {
            Ok(stats) => {
                relay.answered();
                let now = Instant::now();
                let relayed = relay.relayed.load(Ordering::Relaxed);
                if let Some((at, before)) = last {
                    let secs = now.duration_since(at).as_secs_f64();
                    if secs > 0.0 {
                        rate = relayed.saturating_sub(before) as f64 / secs;
                    }
                }
                last = Some((now, relayed));
                *relay.stats.lock() = Some(StatsReading {
                    stats,
                    relayed_per_second: rate,
                });
                if let Err(e) = relay.source.forget_relayed(FORGET_BATCH).await {
                    tracing::warn!(source = %relay.name, error = %e, "cannot forget relayed outbox rows");
                }
            }
            Err(e) => relay.failed(&e),
        }
        tokio::select! {
            () = tokio::time::sleep(STATS_EVERY) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_and_stop_at_the_cap() {
        let max = Duration::from_secs(60);
        assert_eq!(refusal_delay(0, max), Duration::from_secs(1));
        assert_eq!(refusal_delay(3, max), Duration::from_secs(8));
        assert_eq!(refusal_delay(40, max), max);
        let mut b = Duration::ZERO;
        let mut seen = Vec::new();
        for _ in 0..12 {
            b = next_backoff(b, Duration::from_secs(5));
            seen.push(b);
        }
        assert_eq!(seen[0], FIRST_BACKOFF);
        assert_eq!(seen[1], FIRST_BACKOFF * 2);
        assert_eq!(*seen.last().unwrap(), Duration::from_secs(5));
    }
}
