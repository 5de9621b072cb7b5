//! The PostgreSQL routed-work stage, [`PgRoutedWorkStore`]: `sms_routed`, one row per
//! routed unit (its envelope and how many branches are open); each write one
//! transaction.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use super::{Db, whole_table_row};
use crate::backend::{Backend, StageCapabilities};
use crate::envelope::{self, RecordKind};
use crate::error::RoutedWorkError;
use crate::ids::{MessageId, UnitId};
use crate::postgresql::OpError;
use crate::routed_work::{RoutedUnit, RoutedWorkStats, RoutedWorkStore, RoutedWrite};

/// The PostgreSQL routed-work store.
#[derive(Debug)]
pub struct PgRoutedWorkStore {
    db: Arc<Db>,
}

fn open_count(unit: &RoutedUnit) -> i32 {
    i32::try_from(unit.branches.iter().filter(|b| b.outcome.is_none()).count()).unwrap_or(i32::MAX)
}

impl PgRoutedWorkStore {
    pub(super) fn new(db: Arc<Db>) -> Self {
        Self { db }
    }

    fn encode(&self, unit: &RoutedUnit) -> Result<Vec<u8>, OpError> {
        envelope::encode(RecordKind::RoutedUnit, unit).map_err(|e| self.db.corrupt(format_args!("sms_routed: {e}")))
    }

    fn decode(&self, bytes: &[u8]) -> Result<RoutedUnit, OpError> {
        envelope::decode(RecordKind::RoutedUnit, bytes).map_err(|e| self.db.corrupt(format_args!("sms_routed: {e}")))
    }

    async fn apply_tx(&self, tx: &mut PgConnection, write: &RoutedWrite) -> Result<(), OpError> {
        if !write.record.is_empty() {
            let ids: Vec<Uuid> = write.record.iter().map(|u| u.id.as_uuid()).collect();
            let open: Vec<i32> = write.record.iter().map(open_count).collect();
            let bytes = write
                .record
                .iter()
                .map(|u| self.encode(u))
                .collect::<Result<Vec<_>, _>>()?;
            // Routing decisions are not redone: the first record stays. The partition is
            // the unit's own (read from the pending stage in the same statement).
            sqlx::query(
                "INSERT INTO sms_routed (unit, partition, open_branches, routed) \
                 SELECT r.unit, coalesce(u.partition, 0), r.open, r.routed \
                 FROM UNNEST($1::uuid[], $2::int4[], $3::bytea[]) AS r(unit, open, routed) \
                 LEFT JOIN sms_units u ON u.id = r.unit \
                 ON CONFLICT (unit) DO NOTHING",
            )
            .bind(&ids)
            .bind(&open)
            .bind(&bytes)
            .execute(&mut *tx)
            .await?;
            // The router-queue stage lives in the same database: a routed unit leaves
            // it in the same transaction, so no restart finds a unit both staged and
            // routed (the Selector's own release later finds nothing left).
            sqlx::query("DELETE FROM sms_staged WHERE unit = ANY($1)")
                .bind(&ids)
                .execute(&mut *tx)
                .await?;
        }
        if !write.moves.is_empty() || !write.complete.is_empty() {
            // Each touched unit is read (locked), changed and written back once.
            let touched: Vec<Uuid> = write
                .moves
                .iter()
                .map(|m| m.unit)
                .chain(write.complete.iter().map(|d| d.unit))
                .map(|u| u.as_uuid())
                .collect();
            let rows = sqlx::query("SELECT unit, routed FROM sms_routed WHERE unit = ANY($1) FOR UPDATE")
                .bind(&touched)
                .fetch_all(&mut *tx)
                .await?;
            let mut units: HashMap<UnitId, RoutedUnit> = HashMap::with_capacity(rows.len());
            for row in rows {
                let unit = self.decode(&row.try_get::<Vec<u8>, _>("routed")?)?;
                units.insert(MessageId::from_uuid(row.try_get("unit")?), unit);
            }
            let mut changed: Vec<UnitId> = Vec::new();
            for m in &write.moves {
                if let Some(branch) = units
                    .get_mut(&m.unit)
                    .and_then(|u| u.branches.iter_mut().find(|b| b.no == m.branch))
                    && branch.moved_from(&m.from)
                {
                    changed.push(m.unit);
                }
            }
            for d in &write.complete {
                if let Some(branch) = units
                    .get_mut(&d.unit)
                    .and_then(|u| u.branches.iter_mut().find(|b| b.no == d.branch))
                    && branch.outcome.is_none()
                {
                    branch.outcome = Some(d.outcome.clone());
                    changed.push(d.unit);
                }
            }
            changed.sort_unstable();
            changed.dedup();
            if !changed.is_empty() {
                let mut ids = Vec::with_capacity(changed.len());
                let mut open = Vec::with_capacity(changed.len());
                let mut bytes = Vec::with_capacity(changed.len());
                for id in &changed {
                    if let Some(unit) = units.get(id) {
                        ids.push(id.as_uuid());
                        open.push(open_count(unit));
                        bytes.push(self.encode(unit)?);
                    }
                }
                sqlx::query(
                    "UPDATE sms_routed r SET open_branches = u.open, routed = u.routed \
                     FROM UNNEST($1::uuid[], $2::int4[], $3::bytea[]) AS u(unit, open, routed) \
                     WHERE r.unit = u.unit",
                )
                .bind(&ids)
                .bind(&open)
                .bind(&bytes)
                .execute(&mut *tx)
                .await?;
            }
        }
        if !write.remove.is_empty() {
            let ids: Vec<Uuid> = write.remove.iter().map(MessageId::as_uuid).collect();
            sqlx::query("DELETE FROM sms_routed WHERE unit = ANY($1)")
                .bind(&ids)
                .execute(&mut *tx)
                .await?;
        }
        Ok(())
    }
}

#[async_trait]
impl RoutedWorkStore for PgRoutedWorkStore {
    fn capabilities(&self) -> StageCapabilities {
        StageCapabilities::durable(Backend::Postgresql)
    }

    /// One transaction: a restart does not redo what it recorded.
    async fn apply(&self, write: RoutedWrite) -> Result<(), RoutedWorkError> {
        if write.is_empty() {
            return Ok(());
        }
        let db = &self.db;
        db.may_write()?;
        db.timed(async { in_transaction!(db, tx => self.apply_tx(tx, &write).await?) })
            .await
    }

    async fn load_after(&self, after: Option<UnitId>, limit: usize) -> Result<Vec<RoutedUnit>, RoutedWorkError> {
        let db = &self.db;
        let after = after.map(|a| a.as_uuid()).unwrap_or(Uuid::nil());
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        db.timed(async {
            let r: Result<Vec<RoutedUnit>, OpError> = async {
                let rows = sqlx::query(
                    "SELECT routed FROM sms_routed WHERE unit > $1 AND partition = ANY($3) ORDER BY unit LIMIT $2",
                )
                .bind(after)
                .bind(limit)
                .bind(&*db.selectable())
                .fetch_all(&db.pool)
                .await?;
                rows.iter()
                    .map(|row| self.decode(&row.try_get::<Vec<u8>, _>("routed")?))
                    .collect()
            }
            .await;
            db.done(r)
        })
        .await
    }

    async fn stats(&self) -> Result<RoutedWorkStats, RoutedWorkError> {
        let db = &self.db;
        db.timed(async {
            let r: Result<RoutedWorkStats, OpError> = async {
                let row = whole_table_row(
                    &db.pool,
                    "SELECT count(*) AS units, coalesce(sum(open_branches), 0) AS open FROM sms_routed",
                )
                .await?;
                Ok(RoutedWorkStats {
                    units: u64::try_from(row.try_get::<i64, _>("units")?).unwrap_or(0),
                    open_branches: u64::try_from(row.try_get::<i64, _>("open")?).unwrap_or(0),
                })
            }
            .await;
            db.done(r)
        })
        .await
    }
}
