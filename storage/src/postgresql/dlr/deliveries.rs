//! Pending downstream deliveries (`dlr_deliveries`: receipts and inbound messages):
//! decoding a delivery row, and one statement each to claim due deliveries, finish
//! claimed ones and wake an SMPP account's.
//!
//! A claim increments `attempt` and moves `due_at` to the lease end, so a crashed
//! deliverer's claim lapses by itself, and a result is applied only to the attempt it
//! quotes.

use std::collections::HashMap;
use std::time::Duration;

use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};

use super::records::{StoredInbound, StoredProgress, StoredTarget, ms, plus, state_of, ts};
use super::{OpError, PostgresDlrStore};
use crate::dlr::{ClaimScope, Delivery, DeliveryContent, DeliveryFinish, DeliveryId, DeliveryResult, ReceiptOutcome};
use crate::ids::Timestamp;

/// Rows `wake_account` updates per statement.
const WAKE_BATCH: i64 = 10_000;

impl PostgresDlrStore {
    /// A delivery from a row of `id, attempt, target::text AS target, state, error,
    /// done_at, inbound::text AS inbound, inbound_payload, progress::text AS progress,
    /// created_at, expires_at`, as every statement returning deliveries names them.
    pub(super) fn delivery_of(&self, row: &PgRow) -> Result<Delivery, OpError> {
        let id: i64 = row.try_get("id")?;
        let attempt: i32 = row.try_get("attempt")?;
        let target: String = row.try_get("target")?;
        let stored: StoredTarget = serde_json::from_str(&target)
            .map_err(|e| self.corrupt(format_args!("a delivery's receipt target: {e}")))?;
        let located = |(kind, detail): (_, String)| {
            OpError::Failure(self.loc.failure(kind, format_args!("a delivery: {detail}")))
        };
        let target = stored.into_target().map_err(located)?;
        let inbound: Option<String> = row.try_get("inbound")?;
        let progress: Option<String> = row.try_get("progress")?;
        let content = match (inbound, progress) {
            (None, Some(json)) => DeliveryContent::Progress(StoredProgress::decode(&json).map_err(located)?),
            (Some(json), _) => {
                let payload: Vec<u8> = row
                    .try_get::<Option<Vec<u8>>, _>("inbound_payload")?
                    .unwrap_or_default();
                DeliveryContent::Inbound(Box::new(StoredInbound::decode(&json, payload).map_err(located)?))
            }
            (None, None) => {
                let code: Option<i16> = row.try_get("state")?;
                let state = code
                    .and_then(state_of)
                    .ok_or_else(|| self.corrupt(format_args!("a delivery's state {code:?}")))?;
                DeliveryContent::Receipt(ReceiptOutcome {
                    state,
                    error: row.try_get::<Option<String>, _>("error")?.unwrap_or_default(),
                    done_at: ts(row.try_get::<Option<i64>, _>("done_at")?.unwrap_or(0)),
                })
            }
        };
        Ok(Delivery {
            id: DeliveryId(u64::try_from(id).unwrap_or(0)),
            attempt: u32::try_from(attempt).unwrap_or(0),
            target,
            content,
            created_at: ts(row.try_get("created_at")?),
            expires_at: ts(row.try_get("expires_at")?),
        })
    }

    /// One statement. Concurrent claimers skip each other's rows (`SKIP LOCKED`) instead
    /// of waiting. `= ANY(ARRAY(…))`, not `IN (…)`: the planner turns `IN` into a hash
    /// semi-join over a sequential scan of the whole table; `ANY` probes the primary key.
    pub(super) async fn claim_due_op(
        &self,
        now: Timestamp,
        lease: Duration,
        limit: usize,
        scope: ClaimScope<'_>,
    ) -> Result<Vec<Delivery>, OpError> {
        let now = ms(now);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = match scope {
            ClaimScope::All => {
                sqlx::query(
                    "
UPDATE dlr_deliveries d SET attempt = d.attempt + 1, due_at = $2, lease_until = $2
 WHERE d.id = ANY(ARRAY(SELECT id FROM dlr_deliveries WHERE due_at <= $1
                         ORDER BY due_at, id LIMIT $3 FOR UPDATE SKIP LOCKED))
RETURNING d.id, d.attempt, d.target::text AS target, d.state, d.error, d.done_at, d.inbound::text AS inbound,
          d.inbound_payload, d.progress::text AS progress, d.created_at, d.expires_at",
                )
                .bind(now)
                .bind(plus(now, lease))
                .bind(limit)
                .fetch_all(&self.pool)
                .await?
            }
            // HTTP deliveries, and the SMPP ones of the accounts bound here, each through
            // its own partial index: an account bound nowhere is never scanned.
            ClaimScope::SmppAccounts(accounts) => {
                sqlx::query(
                    "
UPDATE dlr_deliveries d SET attempt = d.attempt + 1, due_at = $2, lease_until = $2
 WHERE d.id = ANY(ARRAY(
       SELECT id FROM dlr_deliveries WHERE id = ANY(ARRAY(
              (SELECT id FROM dlr_deliveries WHERE NOT smpp AND due_at <= $1 ORDER BY due_at, id LIMIT $3)
              UNION ALL
              (SELECT id FROM dlr_deliveries WHERE smpp AND account = ANY($4) AND due_at <= $1
                ORDER BY due_at, id LIMIT $3)))
        ORDER BY due_at, id LIMIT $3 FOR UPDATE SKIP LOCKED))
RETURNING d.id, d.attempt, d.target::text AS target, d.state, d.error, d.done_at, d.inbound::text AS inbound,
          d.inbound_payload, d.progress::text AS progress, d.created_at, d.expires_at",
                )
                .bind(now)
                .bind(plus(now, lease))
                .bind(limit)
                .bind(accounts)
                .fetch_all(&self.pool)
                .await?
            }
        };
        let mut out = rows
            .iter()
            .map(|r| self.delivery_of(r))
            .collect::<Result<Vec<_>, _>>()?;
        out.sort_by_key(|d| d.id);
        Ok(out)
    }

    pub(super) async fn finish_tx(&self, conn: &mut PgConnection, results: &[DeliveryFinish]) -> Result<(), OpError> {
        // Per (id, attempt), as if applied in order: a terminal result wins (it removes
        // the delivery), otherwise the last retry time.
        let mut by: HashMap<(i64, i32), Option<i64>> = HashMap::new();
        let mut order = Vec::new();
        for f in results {
            let (Ok(id), Ok(attempt)) = (i64::try_from(f.id.0), i32::try_from(f.attempt)) else {
                continue; // cannot match any stored delivery
            };
            let retry = match f.result {
                DeliveryResult::Delivered | DeliveryResult::Dead => None,
                DeliveryResult::Retry { at } => Some(ms(at)),
            };
            match by.get_mut(&(id, attempt)) {
                Some(slot) => {
                    if slot.is_some() {
                        *slot = retry;
                    }
                }
                None => {
                    by.insert((id, attempt), retry);
                    order.push((id, attempt));
                }
            }
        }
        if order.is_empty() {
            return Ok(());
        }
        // Every statement finds its rows by `id = ANY(…)` on the primary key, and the
        // attempts are compared here: a join with the UNNEST of (id, attempt) pairs is
        // planned from a queue table's statistics (often taken while it was nearly
        // empty), and either walks the whole table or compares every pair with every row.
        let mut ids: Vec<i64> = order.iter().map(|k| k.0).collect();
        ids.sort_unstable();
        ids.dedup();
        let rows = sqlx::query("SELECT id, attempt FROM dlr_deliveries WHERE id = ANY($1) ORDER BY id FOR UPDATE")
            .bind(&ids)
            .fetch_all(&mut *conn)
            .await?;
        let mut current: HashMap<i64, i32> = HashMap::with_capacity(rows.len());
        for row in &rows {
            current.insert(row.try_get("id")?, row.try_get("attempt")?);
        }
        let (mut gone, mut again_ids, mut again_at) = (Vec::new(), Vec::new(), Vec::new());
        for k in order {
            if current.get(&k.0) != Some(&k.1) {
                continue; // finished already, or claimed again since: not this attempt's
            }
            match by.get(&k).copied().flatten() {
                None => gone.push(k.0),
                Some(at) => {
                    again_ids.push(k.0);
                    again_at.push(at);
                }
            }
        }
        if !gone.is_empty() {
            sqlx::query("DELETE FROM dlr_deliveries WHERE id = ANY($1)")
                .bind(gone)
                .execute(&mut *conn)
                .await?;
        }
        if !again_ids.is_empty() {
            sqlx::query(
                "
UPDATE dlr_deliveries d SET due_at = f.retry_at, lease_until = NULL
  FROM UNNEST($1::int8[], $2::int8[]) AS f(id, retry_at)
 WHERE d.id = ANY($1) AND d.id = f.id",
            )
            .bind(again_ids)
            .bind(again_at)
            .execute(&mut *conn)
            .await?;
        }
        Ok(())
    }

    pub(super) async fn wake_account_op(&self, account: &str, now: Timestamp) -> Result<u64, OpError> {
        let now = ms(now);
        let mut woken = 0u64;
        loop {
            let r = sqlx::query(
                "
UPDATE dlr_deliveries SET due_at = $2
 WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM dlr_deliveries
         WHERE account = $1 AND smpp AND due_at > $2 AND (lease_until IS NULL OR lease_until <= $2)
         LIMIT $3 FOR UPDATE SKIP LOCKED))",
            )
            .bind(account)
            .bind(now)
            .bind(WAKE_BATCH)
            .execute(&self.pool)
            .await?;
            woken += r.rows_affected();
            if r.rows_affected() < u64::try_from(WAKE_BATCH).unwrap_or(u64::MAX) {
                return Ok(woken);
            }
        }
    }
}
