//! Handoffs of a step, inside its transaction: the batch runs in rounds, each creating
//! the new tracks, locking the existing ones, deciding every branch's state, correlating
//! its provider ids (adopting orphan receipts) and writing the tracks back.
//!
//! A repeated handoff with the same provider ids changes nothing, and one after
//! resolution is ignored. One with new ids (a resubmission) starts the branch's next
//! generation: the new ids are the ones counted, the earlier ones stay correlated
//! (recognised, not counted).

use std::collections::{HashMap, HashSet};

use sqlx::{PgConnection, Row};
use uuid::Uuid;

use super::progress::ProgressRow;
use super::records::{ms, plus, state_code, targets_json};
use super::rounds::{MAX_STALLED_ROUNDS, merge_sorted, pick_round};
use super::tracks::{ClaimBudget, Fail, TrackKey, TrackState, TrackWrites};
use super::{OpError, PostgresDlrStore};
use crate::dlr::{Handoff, HandoffOutcome, accepted_reports};

/// A handoff prepared for the database.
pub(super) struct Hand {
    key: TrackKey,
    destination: String,
    /// Provider ids in part order, duplicates removed (a duplicate could never be
    /// counted twice, so the branch would never resolve).
    keys: Option<Vec<String>>,
    failed: Option<Fail>,
    targets: String,
    handed_off_at: i64,
    /// Its type 8 reports, created with a new track.
    accepted: Vec<ProgressRow>,
}

impl Hand {
    pub(super) fn of(h: &Handoff) -> Result<Self, serde_json::Error> {
        let (keys, failed) = match &h.outcome {
            HandoffOutcome::Submitted { provider_keys } => {
                let mut seen = HashSet::new();
                let keys = provider_keys
                    .iter()
                    .filter(|k| seen.insert(k.as_str()))
                    .cloned()
                    .collect();
                (Some(keys), None)
            }
            HandoffOutcome::Failed(o) => (
                None,
                Some(Fail {
                    state: state_code(o.state),
                    error: o.error.clone(),
                    done_at: ms(o.done_at),
                }),
            ),
        };
        let mut accepted = Vec::new();
        for (target, content) in accepted_reports(h) {
            accepted.extend(ProgressRow::of(&target, &content)?);
        }
        Ok(Self {
            accepted,
            key: (h.unit.as_uuid(), i32::from(h.branch)),
            destination: h.destination.clone(),
            keys,
            failed,
            targets: targets_json(&h.targets)?,
            handed_off_at: ms(h.handed_off_at),
        })
    }

    fn correlation_keys(&self) -> impl Iterator<Item = (&str, &str)> {
        self.keys
            .iter()
            .flatten()
            .map(move |k| (self.destination.as_str(), k.as_str()))
    }
}

#[derive(Hash, PartialEq, Eq)]
enum HandConflict<'a> {
    Track(TrackKey),
    Corr(&'a str, &'a str),
}

impl PostgresDlrStore {
    pub(super) async fn hand_off_tx(
        &self,
        conn: &mut PgConnection,
        hands: &[Hand],
        now: i64,
        claim: &mut ClaimBudget,
    ) -> Result<(), OpError> {
        let mut pending: Vec<usize> = (0..hands.len()).collect();
        let mut stalls = 0;
        while !pending.is_empty() {
            let (round, later) = pick_round(&pending, |i| {
                let h = &hands[i];
                std::iter::once(HandConflict::Track(h.key))
                    .chain(h.correlation_keys().map(|(d, k)| HandConflict::Corr(d, k)))
            });
            let deferred = self.hand_off_round(conn, hands, &round, now, claim).await?;
            stalls = if deferred.len() == round.len() { stalls + 1 } else { 0 };
            if stalls > MAX_STALLED_ROUNDS {
                return Err(self.contention());
            }
            pending = merge_sorted(deferred, later);
        }
        Ok(())
    }

    /// One round: items with distinct branches and provider ids. Returns the items to
    /// redo (a concurrent writer changed their rows between two statements).
    async fn hand_off_round(
        &self,
        conn: &mut PgConnection,
        hands: &[Hand],
        round: &[usize],
        now: i64,
        claim: &mut ClaimBudget,
    ) -> Result<Vec<usize>, OpError> {
        let mut deferred = Vec::new();
        // 1. Create the tracks that do not exist yet (the common case). A new track is
        //    locked by its inserting transaction.
        let mut ins = (
            Vec::<Uuid>::new(),
            Vec::<i32>::new(),
            Vec::<String>::new(),
            Vec::<String>::new(),
            Vec::<i32>::new(),
            Vec::<Option<i16>>::new(),
            Vec::<Option<String>>::new(),
            Vec::<Option<i64>>::new(),
            Vec::<i64>::new(),
            Vec::<i64>::new(),
        );
        for &i in round {
            let h = &hands[i];
            ins.0.push(h.key.0);
            ins.1.push(h.key.1);
            ins.2.push(h.destination.clone());
            ins.3.push(h.targets.clone());
            ins.4.push(
                h.keys
                    .as_ref()
                    .map_or(0, |k| i32::try_from(k.len()).unwrap_or(i32::MAX)),
            );
            ins.5.push(h.failed.as_ref().map(|f| f.state));
            ins.6.push(h.failed.as_ref().map(|f| f.error.clone()));
            ins.7.push(h.failed.as_ref().map(|f| f.done_at));
            ins.8.push(h.handed_off_at);
            ins.9.push(plus(h.handed_off_at, self.retention.retention));
        }
        let rows = sqlx::query(
            "
INSERT INTO dlr_tracks (unit, branch, destination, targets, gen, parts, fail_state, fail_error, fail_done_at,
                        handed_off_at, expires_at)
SELECT u, b, d, t::jsonb, 1, p, fs, fe, fd, h, e
  FROM UNNEST($1::uuid[], $2::int4[], $3::text[], $4::text[], $5::int4[], $6::int2[], $7::text[], $8::int8[],
              $9::int8[], $10::int8[]) AS x(u, b, d, t, p, fs, fe, fd, h, e)
 ORDER BY u, b
ON CONFLICT (unit, branch) DO NOTHING
RETURNING unit, branch",
        )
        .bind(ins.0)
        .bind(ins.1)
        .bind(ins.2)
        .bind(ins.3)
        .bind(ins.4)
        .bind(ins.5)
        .bind(ins.6)
        .bind(ins.7)
        .bind(ins.8)
        .bind(ins.9)
        .fetch_all(&mut *conn)
        .await?;
        let mut inserted = HashSet::with_capacity(rows.len());
        for row in &rows {
            inserted.insert((row.try_get::<Uuid, _>("unit")?, row.try_get::<i32, _>("branch")?));
        }
        // A new track's type 8 reports.
        let accepted: Vec<&ProgressRow> = round
            .iter()
            .map(|&i| &hands[i])
            .filter(|h| h.keys.is_some() && inserted.contains(&h.key))
            .flat_map(|h| &h.accepted)
            .collect();
        self.insert_progress(conn, &accepted, now).await?;

        // 2. Lock the existing ones and read their state (and, for a repeated
        //    submission, the provider ids they currently expect).
        let existing_keys: Vec<TrackKey> = round
            .iter()
            .map(|&i| hands[i].key)
            .filter(|k| !inserted.contains(k))
            .collect();
        let mut existing = Self::lock_tracks(conn, &existing_keys).await?;
        let compare: Vec<TrackKey> = round
            .iter()
            .filter(|&&i| hands[i].keys.is_some())
            .map(|&i| hands[i].key)
            .filter(|k| existing.get(k).is_some_and(|s| !s.resolved))
            .collect();
        let mut current: HashMap<TrackKey, Vec<(String, String)>> = HashMap::new();
        if !compare.is_empty() {
            let (u, b): (Vec<Uuid>, Vec<i32>) = compare.iter().copied().unzip();
            let rows = sqlx::query(
                "
SELECT c.unit, c.branch, c.destination, c.provider_key
  FROM dlr_tracks t JOIN dlr_correlations c ON c.unit = t.unit AND c.branch = t.branch AND c.gen = t.gen
 WHERE (t.unit, t.branch) IN (SELECT * FROM UNNEST($1::uuid[], $2::int4[]))
 ORDER BY c.unit, c.branch, c.part",
            )
            .bind(u)
            .bind(b)
            .fetch_all(&mut *conn)
            .await?;
            for row in &rows {
                current
                    .entry((row.try_get("unit")?, row.try_get("branch")?))
                    .or_default()
                    .push((row.try_get("destination")?, row.try_get("provider_key")?));
            }
        }

        // 3. Decide each item's new state; collect the provider ids to correlate.
        let mut states: HashMap<TrackKey, (TrackState, bool)> = HashMap::new(); // (state, must write)
        let mut corr = (
            Vec::<String>::new(),
            Vec::<String>::new(),
            Vec::<Uuid>::new(),
            Vec::<i32>::new(),
            Vec::<i32>::new(),
            Vec::<i32>::new(),
        );
        for &i in round {
            let h = &hands[i];
            let (state, write) = if inserted.contains(&h.key) {
                match (&h.keys, &h.failed) {
                    (_, Some(f)) => {
                        let mut s = TrackState::fresh(&h.destination, 1, 0);
                        s.fail = Some(f.clone());
                        (s, true)
                    }
                    (Some(keys), None) => {
                        let s = TrackState::fresh(&h.destination, 1, i32::try_from(keys.len()).unwrap_or(i32::MAX));
                        // No provider part at all: nothing to wait for.
                        (s, keys.is_empty())
                    }
                    (None, None) => continue,
                }
            } else {
                let Some(mut s) = existing.remove(&h.key) else {
                    // Neither inserted nor found: expired between the two statements.
                    deferred.push(i);
                    continue;
                };
                if s.resolved {
                    // A repeat after resolution does not start the branch over.
                    continue;
                }
                match (&h.keys, &h.failed) {
                    (_, Some(f)) => {
                        // An earlier attempt awaits receipts; the failure decides now.
                        if s.fail.is_none() {
                            s.fail = Some(f.clone());
                        }
                        (s, true)
                    }
                    (Some(keys), None) => {
                        let now_keys: Vec<(&str, &str)> = h.correlation_keys().collect();
                        let cur: Vec<(&str, &str)> = current
                            .get(&h.key)
                            .map(|v| v.iter().map(|(d, k)| (d.as_str(), k.as_str())).collect())
                            .unwrap_or_default();
                        if now_keys == cur {
                            // The same provider outcome again: nothing changes.
                            continue;
                        }
                        // Resubmitted: the new provider ids are the ones that count;
                        // the earlier ones stay correlated (recognised, not counted).
                        let parts = i32::try_from(keys.len()).unwrap_or(i32::MAX);
                        (TrackState::fresh(&h.destination, s.generation + 1, parts), true)
                    }
                    (None, None) => continue,
                }
            };
            if state.fail.is_none() {
                for (part, k) in h.keys.iter().flatten().enumerate() {
                    corr.0.push(h.destination.clone());
                    corr.1.push(k.clone());
                    corr.2.push(h.key.0);
                    corr.3.push(h.key.1);
                    corr.4.push(i32::try_from(part).unwrap_or(i32::MAX));
                    corr.5.push(state.generation);
                }
            }
            states.insert(h.key, (state, write));
        }

        // 4. Correlate. An orphan receipt already waiting under one of the ids becomes
        //    that part's outcome; an id still pointing at another (older) message is
        //    taken over — the provider re-used it, the newer handoff wins.
        if !corr.0.is_empty() {
            let rows = sqlx::query(
                "
INSERT INTO dlr_correlations (destination, provider_key, unit, branch, part, gen)
SELECT * FROM UNNEST($1::text[], $2::text[], $3::uuid[], $4::int4[], $5::int4[], $6::int4[])
    AS x(d, k, u, b, p, g)
 ORDER BY d, k
ON CONFLICT (destination, provider_key) DO UPDATE
   SET unit = EXCLUDED.unit, branch = EXCLUDED.branch, part = EXCLUDED.part, gen = EXCLUDED.gen,
       state = CASE WHEN dlr_correlations.unit IS NULL THEN dlr_correlations.state END,
       error = CASE WHEN dlr_correlations.unit IS NULL THEN dlr_correlations.error END,
       done_at = CASE WHEN dlr_correlations.unit IS NULL THEN dlr_correlations.done_at END,
       orphan_expires_at = NULL
RETURNING unit, branch, part, state, error, done_at",
            )
            .bind(corr.0)
            .bind(corr.1)
            .bind(corr.2)
            .bind(corr.3)
            .bind(corr.4)
            .bind(corr.5)
            .fetch_all(&mut *conn)
            .await?;
            let mut adopted: Vec<(TrackKey, i32, i16, String, i64)> = Vec::new();
            for row in &rows {
                if let Some(state) = row.try_get::<Option<i16>, _>("state")? {
                    adopted.push((
                        (row.try_get("unit")?, row.try_get("branch")?),
                        row.try_get("part")?,
                        state,
                        row.try_get::<Option<String>, _>("error")?.unwrap_or_default(),
                        row.try_get::<Option<i64>, _>("done_at")?.unwrap_or(0),
                    ));
                }
            }
            // In part order, so "the first failure" is the same as receipts in order.
            adopted.sort_by_key(|a| (a.0, a.1));
            for (key, _, state, error, done_at) in adopted {
                if let Some((s, write)) = states.get_mut(&key) {
                    s.count(state, &error, done_at);
                    *write = true;
                }
            }
        }

        // 5. Write changed tracks; decided ones resolve and get their deliveries.
        let mut w = TrackWrites::default();
        for (key, (s, write)) in &states {
            if *write {
                w.push(*key, s, s.decided());
            }
        }
        self.write_tracks(conn, w, now, claim).await?;
        Ok(deferred)
    }
}
