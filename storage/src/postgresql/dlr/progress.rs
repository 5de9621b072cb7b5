//! Kannel progress reports (types 8 and 4) as deliveries: rows of `dlr_deliveries` with
//! the report in `progress` (see `migrations/0006_dlr_progress.sql`), due at once and
//! claimed by the next delivery round like any receipt.

use sqlx::{PgConnection, Row};

use super::records::{StoredProgress, StoredTarget, plus};
use super::{OpError, PostgresDlrStore};
use crate::dlr::{DeliveryContent, IntermediateReceipt, ReceiptTarget, buffered_report};

/// A progress report's row, encoded: the account, the target and the report as JSON.
pub(super) struct ProgressRow {
    account: String,
    target: String,
    report: String,
}

impl ProgressRow {
    /// `None` for content that is no progress report.
    pub(super) fn of(target: &ReceiptTarget, content: &DeliveryContent) -> Result<Option<Self>, serde_json::Error> {
        let DeliveryContent::Progress(p) = content else {
            return Ok(None);
        };
        Ok(Some(Self {
            account: target.account.clone(),
            target: serde_json::to_string(&StoredTarget::of(target))?,
            report: StoredProgress::json(p)?,
        }))
    }
}

impl PostgresDlrStore {
    /// One statement for every report; nothing when there are none.
    pub(super) async fn insert_progress(
        &self,
        conn: &mut PgConnection,
        rows: &[&ProgressRow],
        now: i64,
    ) -> Result<(), OpError> {
        if rows.is_empty() {
            return Ok(());
        }
        let accounts: Vec<&str> = rows.iter().map(|r| r.account.as_str()).collect();
        let targets: Vec<&str> = rows.iter().map(|r| r.target.as_str()).collect();
        let reports: Vec<&str> = rows.iter().map(|r| r.report.as_str()).collect();
        sqlx::query(
            "
INSERT INTO dlr_deliveries (account, smpp, target, progress, attempt, due_at, created_at, expires_at)
SELECT x.a, false, x.t::jsonb, x.p::jsonb, 0, $4::int8, $4::int8, $5::int8
  FROM UNNEST($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS x(a, t, p, n)
 ORDER BY x.n",
        )
        .bind(accounts)
        .bind(targets)
        .bind(reports)
        .bind(now)
        .bind(plus(now, self.retention.retention))
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    /// Type 4 reports of a step's intermediate receipts: each matched by its first
    /// correlated id to a branch still awaiting its final receipt; one statement to find
    /// them, one to store the reports. Returns the positions of the receipts that matched
    /// no correlation.
    pub(super) async fn intermediate_tx(
        &self,
        conn: &mut PgConnection,
        batch: &[IntermediateReceipt],
        now: i64,
    ) -> Result<Vec<usize>, OpError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let (mut dests, mut keys, mut which) = (Vec::new(), Vec::new(), Vec::new());
        for (i, r) in batch.iter().enumerate() {
            for (j, k) in r.keys.iter().enumerate() {
                dests.push(r.destination.as_str());
                keys.push(k.as_str());
                // Receipt and id in one number: a receipt's ids beyond 64 are never its
                // first match in practice (providers send one or two).
                which.push(i64::try_from(i * 64 + j.min(63)).unwrap_or(i64::MAX));
            }
        }
        // A correlation of a resolved track matches (no report); an orphan does not.
        let found = sqlx::query(
            "
SELECT x.w, t.targets::text AS targets, t.resolved_at IS NULL AS awaiting
  FROM UNNEST($1::text[], $2::text[], $3::int8[]) AS x(d, k, w)
  JOIN dlr_correlations c ON c.destination = x.d AND c.provider_key = x.k
  JOIN dlr_tracks t ON t.unit = c.unit AND t.branch = c.branch
 ORDER BY x.w",
        )
        .bind(&dests)
        .bind(&keys)
        .bind(&which)
        .fetch_all(&mut *conn)
        .await?;
        // The first matching id of each receipt (rows come in receipt, then id order).
        let mut matched: Vec<(usize, usize, Option<String>)> = Vec::new();
        for row in &found {
            let w = usize::try_from(row.try_get::<i64, _>("w")?).unwrap_or(usize::MAX);
            let (i, j) = (w / 64, w % 64);
            if matched.last().is_some_and(|(last, _, _)| *last == i) {
                continue;
            }
            let awaiting: bool = row.try_get("awaiting")?;
            matched.push((i, j, awaiting.then(|| row.try_get("targets")).transpose()?));
        }
        let unmatched: Vec<usize> = (0..batch.len())
            .filter(|i| !matched.iter().any(|(m, _, _)| m == i))
            .collect();
        let mut rows = Vec::new();
        for (i, j, targets) in matched {
            let Some(targets) = targets else {
                continue;
            };
            let (Some(r), Some(key)) = (batch.get(i), batch.get(i).and_then(|r| r.keys.get(j))) else {
                continue;
            };
            let stored: Vec<StoredTarget> =
                serde_json::from_str(&targets).map_err(|e| self.corrupt(format_args!("receipt targets: {e}")))?;
            for st in stored {
                let target = st
                    .into_target()
                    .map_err(|(kind, detail)| OpError::Failure(self.loc.failure(kind, detail)))?;
                if let Some(content) = buffered_report(&target, r, key)
                    && let Some(row) =
                        ProgressRow::of(&target, &content).map_err(|e| self.corrupt(format_args!("report: {e}")))?
                {
                    rows.push(row);
                }
            }
        }
        self.insert_progress(conn, &rows.iter().collect::<Vec<_>>(), now)
            .await?;
        Ok(unmatched)
    }
}
