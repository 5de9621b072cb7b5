//! The PostgreSQL DLR store, [`PostgresDlrStore`]: one connection pool; every call is one
//! transaction (or one statement) for its whole batch, safe while other processes use
//! the same database.
//!
//! Several Sendium processes may share one database (an SMSC hands a receipt to any
//! bound session, so to any process), so every call here is safe under concurrency
//! across processes. Every write is a batch: one statement per step for the whole
//! batch, rows passed as arrays and expanded with `UNNEST`.
//!
//! The data model, the transaction and locking design (the track row as the message's
//! lock, one key for correlations and orphans, claims and expiry with `SKIP LOCKED`,
//! rounds and retries) and the statements each call costs are described in
//! `docs/postgresql-dlr.md`.
//!
//! This file holds the store, its connection options, the transaction retry loop and
//! the [`DlrStore`] implementation. The work of each call is in its own file:
//!
//! * `records.rs`: how values are stored (times, receipt states, receipt targets).
//! * `tracks.rs`: a branch's track row, read under its lock and written back
//!   (resolving it creates its deliveries, and claims some for the caller).
//! * `rounds.rs`: the rounds a batch runs in inside its transaction.
//! * `handoff.rs`: handoffs of a step.
//! * `receipts.rs`: provider receipts of a step: matched, recorded once, or orphaned.
//! * `deliveries.rs`: claiming, finishing and waking deliveries.
//! * `progress.rs`: Kannel progress reports (types 8 and 4) as deliveries.
//! * `inbound.rs`: inbound messages of a step: multipart parts in their groups, routed
//!   messages as deliveries, groups written; due groups.
//! * `expiry.rs`: expiry and stats.

mod deliveries;
mod expiry;
mod handoff;
mod inbound;
mod progress;
mod receipts;
mod records;
mod rounds;
mod tracks;

#[cfg(test)]
mod tests;

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use self::handoff::Hand;
use self::receipts::Rcpt;
use self::records::ms;
use self::tracks::ClaimBudget;
use super::OpError;
use super::failure::{Location, failure};
use super::migrate;
use crate::backend::Backend;
use crate::dlr::{
    ClaimScope, Delivery, DlrCapabilities, DlrRetention, DlrStats, DlrStore, DlrWrite, DlrWriteOutcome, ExpiryReport,
};
use crate::error::{BackendFailure, DlrError, FailureKind};
use crate::ids::Timestamp;
use crate::inbound::InboundGroup;

/// Connection settings of a [`PostgresDlrStore`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PgDlrOptions {
    /// Pool size of this process.
    pub max_connections: u32,
    /// How long an operation waits for a pooled connection (including connecting).
    /// A stopped or unreachable server answers `Unavailable` after this, not a hang.
    pub acquire_timeout: Duration,
    /// Upper bound on one whole operation (a server that accepts connections but
    /// stops answering would otherwise stall the caller forever).
    pub operation_timeout: Duration,
    pub retention: DlrRetention,
}

impl PgDlrOptions {
    pub fn new(max_connections: u32, retention: DlrRetention) -> Self {
        Self {
            max_connections,
            acquire_timeout: Duration::from_secs(5),
            operation_timeout: Duration::from_secs(30),
            retention,
        }
    }
}

/// The PostgreSQL DLR store. Cheap to share (`Arc`); several processes may open the
/// same database. See `docs/postgresql-dlr.md` for the schema's concurrency design.
#[derive(Debug)]
pub struct PostgresDlrStore {
    pool: PgPool,
    loc: Location,
    retention: DlrRetention,
    operation_timeout: Duration,
}

impl PostgresDlrStore {
    /// Connect, apply the schema migrations (idempotent, safe when several processes
    /// start at once) and open a pool of `max_connections`.
    pub async fn connect(url: &str, max_connections: u32, retention: DlrRetention) -> Result<Self, BackendFailure> {
        Self::connect_with(url, PgDlrOptions::new(max_connections, retention)).await
    }

    pub async fn connect_with(url: &str, options: PgDlrOptions) -> Result<Self, BackendFailure> {
        let connect = PgConnectOptions::from_str(url)
            .map_err(|e| {
                // The URL itself may hold a password: never echo it.
                BackendFailure::new(
                    FailureKind::Unavailable,
                    "postgresql (storage.postgresql.url)",
                    format_args!("invalid database URL: {}", redact(&e.to_string(), url)),
                )
            })?
            .application_name("sendium-dlr")
            .options(crate::postgresql::SESSION_SETTINGS);
        let loc = Location::of(&connect);
        tokio::time::timeout(options.operation_timeout, migrate::run(&connect, &loc))
            .await
            .map_err(|_| loc.failure(FailureKind::Unavailable, "timed out applying schema migrations"))??;
        // Lazy: the migrations just proved the server reachable; connections open on
        // demand and reopen by themselves after a restart of the server.
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections.max(1))
            .acquire_timeout(options.acquire_timeout)
            .connect_lazy_with(connect);
        Ok(Self {
            pool,
            loc,
            retention: options.retention,
            operation_timeout: options.operation_timeout,
        })
    }

    /// `host:port/database` (no credentials), for logs.
    pub fn location(&self) -> String {
        self.loc.to_string()
    }

    /// Close the pool's connections (in-flight operations finish first).
    pub async fn close(&self) {
        self.pool.close().await;
    }

    async fn timed<T>(&self, op: impl Future<Output = Result<T, BackendFailure>>) -> Result<T, DlrError> {
        match tokio::time::timeout(self.operation_timeout, op).await {
            Ok(r) => r.map_err(DlrError::from),
            Err(_) => Err(DlrError::from(self.loc.failure(
                FailureKind::Unavailable,
                format_args!("no answer within {:?}", self.operation_timeout),
            ))),
        }
    }

    fn corrupt(&self, detail: impl std::fmt::Display) -> OpError {
        OpError::Failure(self.loc.failure(FailureKind::Corrupt, detail))
    }

    fn contention(&self) -> OpError {
        OpError::Failure(self.loc.failure(
            FailureKind::Unavailable,
            "batch kept racing concurrent writers; try again",
        ))
    }

    fn done<T>(&self, r: Result<T, OpError>) -> Result<T, BackendFailure> {
        r.map_err(|e| match e {
            OpError::Sql(e) => failure(&self.loc, &e),
            OpError::Failure(f) => f,
        })
    }
}

/// Replace any occurrence of the URL (or its password) in an error text.
fn redact(text: &str, url: &str) -> String {
    let mut out = text.replace(url, "<url>");
    if let Some((_, rest)) = url.split_once("://")
        && let Some((userinfo, _)) = rest.split_once('@')
        && let Some((_, password)) = userinfo.split_once(':')
        && !password.is_empty()
    {
        out = out.replace(password, "<password>");
    }
    out
}

#[async_trait]
impl DlrStore for PostgresDlrStore {
    /// The resolution statement claims what it creates (see `WRITE_TRACKS_SQL` in
    /// `tracks.rs`). Steps commit in parallel on their own connections (row locks and the
    /// shared provider-id key order them exactly as for several processes), a quarter of
    /// the pool (2 with the default 8), the rest left for claims, expiry and stats. At
    /// most 4: more writers make smaller steps, so more statements per message.
    fn capabilities(&self) -> DlrCapabilities {
        DlrCapabilities {
            backend: Backend::Postgresql,
            durable: true,
            reservations: None,
            claims_in_writes: true,
            write_concurrency: (self.pool.options().get_max_connections() as usize / 4).clamp(1, 4),
        }
    }

    async fn claim_due(
        &self,
        now: Timestamp,
        lease: Duration,
        limit: usize,
        scope: ClaimScope<'_>,
    ) -> Result<Vec<Delivery>, DlrError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        self.timed(async { self.done(self.claim_due_op(now, lease, limit, scope).await) })
            .await
    }

    async fn wake_account(&self, account: &str, now: Timestamp) -> Result<u64, DlrError> {
        self.timed(async { self.done(self.wake_account_op(account, now).await) })
            .await
    }

    async fn expire(&self, now: Timestamp, limit: usize) -> Result<ExpiryReport, DlrError> {
        let (now, limit) = (ms(now), i64::try_from(limit).unwrap_or(i64::MAX));
        self.timed(async { in_transaction!(self, tx => self.expire_tx(tx, now, limit).await?) })
            .await
    }

    async fn stats(&self) -> Result<DlrStats, DlrError> {
        self.timed(async { self.done(self.stats_op().await) }).await
    }

    async fn due_inbound_groups(&self, now: Timestamp, limit: usize) -> Result<Vec<InboundGroup>, DlrError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        self.timed(async { self.done(self.due_inbound_groups_op(now, limit).await) })
            .await
    }

    /// The whole step in one transaction: one commit (one WAL flush) for everything the
    /// correlator gathered meanwhile, instead of one per kind of write.
    async fn apply(&self, step: DlrWrite) -> DlrWriteOutcome {
        if step.is_empty() {
            return DlrWriteOutcome::committed(Vec::new(), Vec::new());
        }
        let prepared = step.handoffs.iter().map(Hand::of).collect::<Result<Vec<_>, _>>();
        let hands = match prepared {
            Ok(h) => h,
            Err(e) => {
                // A handoff that cannot be stored must not hold back the receipts and
                // results of the same step.
                let failed = Err(DlrError::from(
                    self.loc
                        .failure(FailureKind::Corrupt, format_args!("receipt targets: {e}")),
                ));
                let rest = DlrWrite {
                    handoffs: Vec::new(),
                    ..step
                };
                return DlrWriteOutcome {
                    handoffs: failed,
                    ..self.apply(rest).await
                };
            }
        };
        let receipts: Vec<Rcpt> = step.receipts.iter().map(Rcpt::of).collect();
        let finishes = step.finishes;
        let (parts, messages, dropped) = (step.inbound_parts, step.inbound, step.inbound_dropped);
        let now = ms(Timestamp::now());
        let result = self
            .timed(async {
                in_transaction!(self, tx => {
                    // Per attempt: a retried transaction claims afresh, its lease counted
                    // from now (not from before the pool and earlier attempts).
                    let mut claim = ClaimBudget::of(step.claim_created, ms(Timestamp::now()));
                    self.hand_off_tx(tx, &hands, now, &mut claim).await?;
                    let unmatched = self.intermediate_tx(tx, &step.intermediate, now).await?;
                    let matches = self.record_receipts_tx(tx, &receipts, now, &mut claim).await?;
                    self.finish_tx(tx, &finishes).await?;
                    let ready = self.inbound_tx(tx, &parts, &messages, &dropped, now, &mut claim).await?;
                    (matches, claim.claimed, ready, unmatched)
                })
            })
            .await;
        match result {
            Ok((matches, claimed, complete_groups, unmatched_intermediate)) => DlrWriteOutcome {
                complete_groups,
                unmatched_intermediate,
                ..DlrWriteOutcome::committed(matches, claimed)
            },
            Err(e) => DlrWriteOutcome::failed(e),
        }
    }
}
