//! Provider receipts of a step, inside its transaction: the batch runs in rounds, each
//! matching the receipts to their branches, recording each part's final state once,
//! resolving the branches now decided, and keeping unmatched receipts as orphans.
//!
//! A part's final state is accepted once: a conditional `UPDATE … WHERE state IS NULL` on
//! its correlation row, re-evaluated on the newest row version, so a concurrent writer's
//! state is seen. An orphan is stored under the same primary key as a correlation
//! (destination, provider id), so a receipt and the handoff of the same id wait for each
//! other and the later one sees the earlier.

use std::collections::{HashMap, HashSet};

use sqlx::{PgConnection, Row};
use uuid::Uuid;

use super::records::{ms, plus, state_code};
use super::rounds::{MAX_STALLED_ROUNDS, merge_sorted, pick_round};
use super::tracks::{ClaimBudget, TrackKey, TrackState, TrackWrites};
use super::{OpError, PostgresDlrStore};
use crate::dlr::{ProviderReceipt, ReceiptMatch};
use crate::ids::MessageId;

pub(super) struct Rcpt {
    destination: String,
    /// Candidate ids, best first, duplicates removed.
    keys: Vec<String>,
    state: i16,
    error: String,
    done_at: i64,
}

impl Rcpt {
    pub(super) fn of(r: &ProviderReceipt) -> Self {
        let mut seen = HashSet::new();
        Self {
            destination: r.destination.clone(),
            keys: r.keys.iter().filter(|k| seen.insert(k.as_str())).cloned().collect(),
            state: state_code(r.outcome.state),
            error: r.outcome.error.clone(),
            done_at: ms(r.outcome.done_at),
        }
    }
}

impl PostgresDlrStore {
    pub(super) async fn record_receipts_tx(
        &self,
        conn: &mut PgConnection,
        receipts: &[Rcpt],
        now: i64,
        claim: &mut ClaimBudget,
    ) -> Result<Vec<ReceiptMatch>, OpError> {
        let mut out: Vec<Option<ReceiptMatch>> = vec![None; receipts.len()];
        let mut pending: Vec<usize> = Vec::new();
        for (i, r) in receipts.iter().enumerate() {
            if r.keys.is_empty() {
                // Nothing to correlate by, now or later.
                out[i] = Some(ReceiptMatch::Orphaned);
            } else {
                pending.push(i);
            }
        }
        let mut stalls = 0;
        while !pending.is_empty() {
            let (round, later) = pick_round(&pending, |i| {
                let r = &receipts[i];
                r.keys.iter().map(move |k| (r.destination.as_str(), k.as_str()))
            });
            let deferred = self
                .receipts_round(conn, receipts, &round, &mut out, now, claim)
                .await?;
            stalls = if deferred.len() == round.len() { stalls + 1 } else { 0 };
            if stalls > MAX_STALLED_ROUNDS {
                return Err(self.contention());
            }
            pending = merge_sorted(deferred, later);
        }
        out.into_iter()
            .map(|m| m.ok_or_else(|| self.corrupt("a receipt was left without a result")))
            .collect()
    }

    async fn receipts_round(
        &self,
        conn: &mut PgConnection,
        receipts: &[Rcpt],
        round: &[usize],
        out: &mut [Option<ReceiptMatch>],
        now: i64,
        claim: &mut ClaimBudget,
    ) -> Result<Vec<usize>, OpError> {
        let mut deferred = Vec::new();
        // Flattened candidates: (receipt, rank).
        let mut cand: Vec<(usize, usize)> = Vec::new();
        let (mut ci, mut cd, mut ck) = (Vec::<i32>::new(), Vec::<String>::new(), Vec::<String>::new());
        for &i in round {
            for (rank, k) in receipts[i].keys.iter().enumerate() {
                ci.push(i32::try_from(cand.len()).unwrap_or(i32::MAX));
                cd.push(receipts[i].destination.clone());
                ck.push(k.clone());
                cand.push((i, rank));
            }
        }

        // 1. Find the correlated branches and lock their tracks, in order.
        let rows = sqlx::query(
            "
SELECT x.i, t.unit, t.branch, t.destination, t.gen, t.parts, t.parts_done, t.fail_state, t.fail_error,
       t.fail_done_at, t.last_done_at, t.resolved_at IS NOT NULL AS resolved
  FROM UNNEST($1::int4[], $2::text[], $3::text[]) AS x(i, d, k)
  JOIN dlr_correlations c ON c.destination = x.d AND c.provider_key = x.k
  JOIN dlr_tracks t ON t.unit = c.unit AND t.branch = c.branch
 ORDER BY t.unit, t.branch
   FOR NO KEY UPDATE OF t",
        )
        .bind(ci)
        .bind(cd)
        .bind(ck)
        .fetch_all(&mut *conn)
        .await?;
        let mut tracks: HashMap<TrackKey, TrackState> = HashMap::new();
        // Best matching candidate per receipt: (rank, candidate, track).
        let mut best: HashMap<usize, (usize, usize, TrackKey)> = HashMap::new();
        for row in &rows {
            let c = usize::try_from(row.try_get::<i32, _>("i")?).unwrap_or(usize::MAX);
            let Some(&(r, rank)) = cand.get(c) else {
                return Err(self.corrupt("receipt candidate index out of range"));
            };
            let key: TrackKey = (row.try_get("unit")?, row.try_get("branch")?);
            // Rows come after the lock, so the track state is the newest.
            tracks.insert(key, TrackState::from_row(row)?);
            if best.get(&r).is_none_or(|b| rank < b.0) {
                best.insert(r, (rank, c, key));
            }
        }

        // 2. Record each matched part's final state, once.
        let mut mark = (
            Vec::<i32>::new(),
            Vec::<String>::new(),
            Vec::<String>::new(),
            Vec::<Uuid>::new(),
            Vec::<i32>::new(),
            Vec::<i16>::new(),
            Vec::<String>::new(),
            Vec::<i64>::new(),
        );
        let mut orphans = Vec::new();
        for &i in round {
            let Some(&(rank, _, key)) = best.get(&i) else {
                orphans.push(i);
                continue;
            };
            if tracks.get(&key).is_some_and(|t| t.resolved) {
                out[i] = Some(ReceiptMatch::Duplicate {
                    unit: MessageId::from_uuid(key.0),
                });
                continue;
            }
            let r = &receipts[i];
            mark.0.push(i32::try_from(i).unwrap_or(i32::MAX));
            mark.1.push(r.destination.clone());
            mark.2.push(r.keys[rank].clone());
            mark.3.push(key.0);
            mark.4.push(key.1);
            mark.5.push(r.state);
            mark.6.push(r.error.clone());
            mark.7.push(r.done_at);
        }
        let mut applied: Vec<(usize, i32)> = Vec::new();
        let mut not_applied: Vec<usize> = Vec::new();
        if !mark.0.is_empty() {
            let asked: Vec<usize> = mark
                .0
                .iter()
                .map(|&i| usize::try_from(i).unwrap_or(usize::MAX))
                .collect();
            let rows = sqlx::query(
                "
UPDATE dlr_correlations c SET state = x.s, error = x.e, done_at = x.a
  FROM UNNEST($1::int4[], $2::text[], $3::text[], $4::uuid[], $5::int4[], $6::int2[], $7::text[], $8::int8[])
    AS x(i, d, k, u, b, s, e, a)
 WHERE c.destination = x.d AND c.provider_key = x.k AND c.unit = x.u AND c.branch = x.b AND c.state IS NULL
RETURNING x.i, c.gen",
            )
            .bind(mark.0)
            .bind(mark.1)
            .bind(mark.2)
            .bind(mark.3)
            .bind(mark.4)
            .bind(mark.5)
            .bind(mark.6)
            .bind(mark.7)
            .fetch_all(&mut *conn)
            .await?;
            let mut done = HashSet::new();
            for row in &rows {
                let i = usize::try_from(row.try_get::<i32, _>("i")?).unwrap_or(usize::MAX);
                done.insert(i);
                applied.push((i, row.try_get("gen")?));
            }
            not_applied = asked.into_iter().filter(|i| !done.contains(i)).collect();
        }

        // 2b. Not applied: either that part is already final (a duplicate receipt), or
        //     the id moved to another message meanwhile (redo in the next round).
        if !not_applied.is_empty() {
            let (mut xi, mut xd, mut xk) = (Vec::new(), Vec::new(), Vec::new());
            for &i in &not_applied {
                let (rank, _, _) = best[&i];
                xi.push(i32::try_from(i).unwrap_or(i32::MAX));
                xd.push(receipts[i].destination.clone());
                xk.push(receipts[i].keys[rank].clone());
            }
            let rows = sqlx::query(
                "
SELECT x.i, c.unit, c.branch, c.state IS NOT NULL AS final
  FROM UNNEST($1::int4[], $2::text[], $3::text[]) AS x(i, d, k)
  JOIN dlr_correlations c ON c.destination = x.d AND c.provider_key = x.k",
            )
            .bind(xi)
            .bind(xd)
            .bind(xk)
            .fetch_all(&mut *conn)
            .await?;
            let mut duplicate = HashSet::new();
            for row in &rows {
                let i = usize::try_from(row.try_get::<i32, _>("i")?).unwrap_or(usize::MAX);
                let unit: Option<Uuid> = row.try_get("unit")?;
                let branch: Option<i32> = row.try_get("branch")?;
                let fin: bool = row.try_get("final")?;
                if let (Some(u), Some(b)) = (unit, branch)
                    && best.get(&i).is_some_and(|x| x.2 == (u, b))
                    && fin
                {
                    duplicate.insert(i);
                }
            }
            for i in not_applied {
                if duplicate.contains(&i) {
                    out[i] = Some(ReceiptMatch::Duplicate {
                        unit: MessageId::from_uuid(best[&i].2.0),
                    });
                } else {
                    deferred.push(i);
                }
            }
        }

        // 3. Count the new outcomes in receipt order; write the tracks back.
        applied.sort_unstable();
        let mut changed: HashSet<TrackKey> = HashSet::new();
        for (i, generation) in applied {
            let key = best[&i].2;
            let unit = MessageId::from_uuid(key.0);
            let Some(t) = tracks.get_mut(&key) else {
                return Err(self.corrupt("receipt matched a track that was not locked"));
            };
            let r = &receipts[i];
            out[i] = Some(if t.resolved {
                // Resolved earlier in this batch: the message's state is already out.
                ReceiptMatch::Duplicate { unit }
            } else if generation != t.generation {
                // An id of an earlier submission of this branch: recognised and
                // recorded, but the resubmission's ids decide the message.
                ReceiptMatch::Matched { unit, resolved: false }
            } else {
                t.count(r.state, &r.error, r.done_at);
                changed.insert(key);
                if t.decided() {
                    t.resolved = true;
                }
                ReceiptMatch::Matched {
                    unit,
                    resolved: t.resolved,
                }
            });
        }
        let mut w = TrackWrites::default();
        for key in &changed {
            if let Some(t) = tracks.get(key) {
                w.push(*key, t, t.resolved);
            }
        }
        self.write_tracks(conn, w, now, claim).await?;

        // 4. Keep uncorrelated receipts as orphans under their best id; a later
        //    handoff adopts them. If the id got correlated meanwhile, redo it.
        if !orphans.is_empty() {
            let mut o = (
                Vec::<String>::new(),
                Vec::<String>::new(),
                Vec::<i16>::new(),
                Vec::<String>::new(),
                Vec::<i64>::new(),
                Vec::<i64>::new(),
            );
            let expires = plus(now, self.retention.orphan_retention);
            for &i in &orphans {
                let r = &receipts[i];
                o.0.push(r.destination.clone());
                o.1.push(r.keys[0].clone());
                o.2.push(r.state);
                o.3.push(r.error.clone());
                o.4.push(r.done_at);
                o.5.push(expires);
            }
            let rows = sqlx::query(
                "
INSERT INTO dlr_correlations (destination, provider_key, state, error, done_at, orphan_expires_at)
SELECT * FROM UNNEST($1::text[], $2::text[], $3::int2[], $4::text[], $5::int8[], $6::int8[])
    AS x(d, k, s, e, a, x)
 ORDER BY d, k
ON CONFLICT (destination, provider_key) DO UPDATE
   SET state = EXCLUDED.state, error = EXCLUDED.error, done_at = EXCLUDED.done_at,
       orphan_expires_at = EXCLUDED.orphan_expires_at
 WHERE dlr_correlations.unit IS NULL
RETURNING destination, provider_key",
            )
            .bind(o.0)
            .bind(o.1)
            .bind(o.2)
            .bind(o.3)
            .bind(o.4)
            .bind(o.5)
            .fetch_all(&mut *conn)
            .await?;
            let mut stored: HashSet<(String, String)> = HashSet::with_capacity(rows.len());
            for row in &rows {
                stored.insert((row.try_get("destination")?, row.try_get("provider_key")?));
            }
            let mut missed = Vec::new();
            for i in orphans {
                let r = &receipts[i];
                if stored.contains(&(r.destination.clone(), r.keys[0].clone())) {
                    out[i] = Some(ReceiptMatch::Orphaned);
                } else {
                    missed.push(i);
                }
            }
            // Not stored: the id is a correlation now (a handoff committed meanwhile:
            // redo, it will match) — or a correlation whose track is gone, which the
            // schema's invariants exclude; should one exist, answer Orphaned instead of
            // retrying forever (a later handoff of that id takes the row over).
            if !missed.is_empty() {
                let (mut xi, mut xd, mut xk) = (Vec::new(), Vec::new(), Vec::new());
                for &i in &missed {
                    xi.push(i32::try_from(i).unwrap_or(i32::MAX));
                    xd.push(receipts[i].destination.clone());
                    xk.push(receipts[i].keys[0].clone());
                }
                let rows = sqlx::query(
                    "
SELECT x.i FROM UNNEST($1::int4[], $2::text[], $3::text[]) AS x(i, d, k)
  JOIN dlr_correlations c ON c.destination = x.d AND c.provider_key = x.k
 WHERE c.unit IS NOT NULL
   AND NOT EXISTS (SELECT 1 FROM dlr_tracks t WHERE t.unit = c.unit AND t.branch = c.branch)",
                )
                .bind(xi)
                .bind(xd)
                .bind(xk)
                .fetch_all(&mut *conn)
                .await?;
                let mut dangling = HashSet::new();
                for row in &rows {
                    dangling.insert(usize::try_from(row.try_get::<i32, _>("i")?).unwrap_or(usize::MAX));
                }
                if !dangling.is_empty() {
                    tracing::warn!(
                        receipts = dangling.len(),
                        "dlr store: provider ids correlated to branches that no longer exist; receipts counted as unmatched"
                    );
                }
                for i in missed {
                    if dangling.contains(&i) {
                        out[i] = Some(ReceiptMatch::Orphaned);
                    } else {
                        deferred.push(i);
                    }
                }
            }
        }
        Ok(deferred)
    }
}
