//! The PostgreSQL router-queue stage, [`PgRouterQueueStore`]: `sms_staged`, one row per
//! staged unit, each write one transaction.
//!
//! No selection cursor is stored: the pending stage's selection read leaves out what is
//! staged or routed (the three stages share the database), so selection may start from
//! the beginning after a restart or a partition's takeover and still takes each unit
//! once.

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use super::{Db, whole_table_row};
use crate::backend::{Backend, StageCapabilities};
use crate::error::RouterQueueError;
use crate::ids::{MessageId, ReadyCursor, ReadySeq};
use crate::postgresql::OpError;
use crate::router_queue::{RouterQueueStats, RouterQueueStore, RouterQueueWrite, StagedUnit};

/// The PostgreSQL router-queue store.
#[derive(Debug)]
pub struct PgRouterQueueStore {
    db: Arc<Db>,
}

impl PgRouterQueueStore {
    pub(super) fn new(db: Arc<Db>) -> Self {
        Self { db }
    }

    async fn apply_tx(&self, tx: &mut PgConnection, write: &RouterQueueWrite) -> Result<(), OpError> {
        if !write.stage.is_empty() {
            let ids: Vec<Uuid> = write.stage.iter().map(|u| u.id.as_uuid()).collect();
            let seqs: Vec<i64> = write.stage.iter().map(|u| seq(u.seq)).collect();
            // Staging a unit again keeps its first entry. The partition is the unit's
            // own (read from the pending stage in the same statement).
            sqlx::query(
                "INSERT INTO sms_staged (unit, seq, partition) \
                 SELECT s.unit, s.seq, coalesce(u.partition, 0) \
                 FROM UNNEST($1::uuid[], $2::int8[]) AS s(unit, seq) LEFT JOIN sms_units u ON u.id = s.unit \
                 ON CONFLICT (unit) DO NOTHING",
            )
            .bind(&ids)
            .bind(&seqs)
            .execute(&mut *tx)
            .await?;
        }
        if !write.release.is_empty() {
            let ids: Vec<Uuid> = write.release.iter().map(MessageId::as_uuid).collect();
            sqlx::query("DELETE FROM sms_staged WHERE unit = ANY($1)")
                .bind(&ids)
                .execute(&mut *tx)
                .await?;
        }
        Ok(())
    }

    async fn read<T>(
        &self,
        f: impl AsyncFnOnce(&mut PgConnection) -> Result<T, OpError>,
    ) -> Result<T, RouterQueueError> {
        let db = &self.db;
        db.timed(async {
            let r: Result<T, OpError> = async {
                let mut conn = db.pool.acquire().await?;
                f(&mut conn).await
            }
            .await;
            db.done(r)
        })
        .await
    }
}

fn seq(s: ReadySeq) -> i64 {
    i64::try_from(s.0).unwrap_or(i64::MAX)
}

fn ready_seq(v: i64) -> ReadySeq {
    ReadySeq(u64::try_from(v).unwrap_or(0))
}

#[async_trait]
impl RouterQueueStore for PgRouterQueueStore {
    fn capabilities(&self) -> StageCapabilities {
        StageCapabilities::durable(Backend::Postgresql)
    }

    /// One transaction: the batch and the cursor together, or neither.
    async fn apply(&self, write: RouterQueueWrite) -> Result<(), RouterQueueError> {
        if write.stage.is_empty() && write.release.is_empty() {
            return Ok(());
        }
        let db = &self.db;
        db.may_write()?;
        db.timed(async { in_transaction!(db, tx => self.apply_tx(tx, &write).await?) })
            .await
    }

    async fn staged_after(&self, after: ReadySeq, limit: usize) -> Result<Vec<StagedUnit>, RouterQueueError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.read(async |conn: &mut PgConnection| {
            let rows = sqlx::query(
                "SELECT unit, seq FROM sms_staged WHERE seq > $1 AND partition = ANY($3) ORDER BY seq LIMIT $2",
            )
            .bind(seq(after))
            .bind(limit)
            .bind(&*self.db.selectable())
            .fetch_all(&mut *conn)
            .await?;
            let mut out = Vec::with_capacity(rows.len());
            for row in rows {
                out.push(StagedUnit {
                    id: MessageId::from_uuid(row.try_get("unit")?),
                    seq: ready_seq(row.try_get("seq")?),
                });
            }
            Ok(out)
        })
        .await
    }

    /// None is stored (see the module docs): selection starts from the beginning.
    async fn cursor(&self) -> Result<ReadyCursor, RouterQueueError> {
        Ok(ReadyCursor::START)
    }

    fn keeps_cursor(&self) -> bool {
        false
    }

    async fn stats(&self) -> Result<RouterQueueStats, RouterQueueError> {
        let db = &self.db;
        db.timed(async {
            let r: Result<RouterQueueStats, OpError> = async {
                let row = whole_table_row(&db.pool, "SELECT count(*) AS staged FROM sms_staged").await?;
                Ok(RouterQueueStats {
                    staged: u64::try_from(row.try_get::<i64, _>("staged")?).unwrap_or(0),
                    cursor: ReadyCursor::START,
                })
            }
            .await;
            db.done(r)
        })
        .await
    }
}
