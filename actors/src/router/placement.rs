//! Where an open branch goes: the first reachable destination in its preference order
//! ([`Branch::preference`](sendium_storage::Branch::preference)), or a wait until one is
//! reachable, and its end with an EXPIRED receipt if none becomes reachable before the
//! message's validity runs out.
//!
//! A branch is *placed* when it is routed or restored, when its destination goes down
//! before taking it, and when a worker hands it back (a submission left unanswered, a
//! destination unreachable or throttling for `failover-after`). A handed-back branch
//! first has the failover recorded in routed-work (so a restart does not send it back),
//! then goes to the next reachable destination at once. A branch that finds nothing
//! reachable waits: it goes to its first preference as soon as that one is reachable,
//! and to any other reachable target once it has waited that destination's
//! `failover-after` — so a destination that is only reconnecting, at startup or after a
//! blip, keeps its traffic.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sendium_storage::{Branch, BranchFailure, BranchKind, BranchOutcome, Disposition, Timestamp, Unit};

use super::{BranchKey, RouterState, Tracked};

/// A branch held by the Router because no destination can take it now.
#[derive(Clone, Debug)]
pub(super) struct Waiting {
    /// Since when it waits (the oldest-age metric, `failover-after`).
    pub since: Instant,
    /// Not placed before this: a branch handed back by the only destination that can
    /// take it tries again later, not in a loop.
    pub next_try: Instant,
    /// The destination that handed it back, if one did (for the failover metric).
    pub left: Option<Arc<str>>,
}

/// How a branch comes to be placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Occasion<'a> {
    /// Routed, restored, or its destination went down before taking it.
    Fresh,
    /// Handed back by this destination.
    Leaving(&'a str),
    /// Waiting for this long.
    Waited(Duration),
}

/// Where to put a branch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Choice<'a> {
    Go(&'a str),
    Wait,
}

/// Choose among `preference` (the branch's targets in the order to try them) given
/// which are reachable; `failover_after` is that of the first preference.
pub(super) fn choose<'a, S: AsRef<str>>(
    preference: &'a [S],
    reachable: impl Fn(&str) -> bool,
    occasion: Occasion<'_>,
    failover_after: Duration,
) -> Choice<'a> {
    let Some(target) = preference.iter().map(AsRef::as_ref).find(|d| reachable(d)) else {
        return Choice::Wait;
    };
    let first = preference.first().map(AsRef::as_ref) == Some(target);
    match occasion {
        Occasion::Leaving(from) if from == target => Choice::Wait,
        Occasion::Fresh | Occasion::Leaving(_) => Choice::Go(target),
        Occasion::Waited(_) if first => Choice::Go(target),
        Occasion::Waited(waited) if waited >= failover_after => Choice::Go(target),
        Occasion::Waited(_) => Choice::Wait,
    }
}

/// How long a branch handed back by its only reachable destination waits before it is
/// tried there again: 1 s, doubling with each hand-back, at most a minute.
pub(super) fn retry_delay(bounces: u32) -> Duration {
    let factor = 1u32 << bounces.saturating_sub(1).min(6);
    (Duration::from_secs(1) * factor).min(Duration::from_secs(60))
}

/// The moment a unit's validity runs out: the earliest validity period any of its
/// submissions gave, and at most `max_age` after its first acceptance.
pub(super) fn deadline(unit: &Unit, max_age: Duration) -> Timestamp {
    let accepted = unit
        .parts
        .iter()
        .map(|p| p.accepted_at)
        .min()
        .unwrap_or_else(Timestamp::now);
    unit.parts
        .iter()
        .filter_map(|p| p.valid_until)
        .fold(accepted.saturating_add(max_age), Timestamp::min)
}

impl RouterState {
    /// Put an open branch on the first reachable destination in its preference order, or
    /// make it wait (see the module docs).
    pub(super) fn place(&mut self, key: BranchKey, occasion: Occasion<'_>) {
        let now = Instant::now();
        let Some(t) = self.units.get(&key.unit) else {
            return;
        };
        if !self.takes(self.partition(&t.unit)) {
            // Its partition is leaving: the next owner places it.
            self.waiting.remove(&key);
            if let Some(t) = self.units.get_mut(&key.unit) {
                t.clear_dispatched(key.branch);
            }
            return;
        }
        let Some(branch) = t.branch(key.branch) else {
            return;
        };
        if branch.targets.is_empty() {
            self.fail_unroutable(key);
            return;
        }
        if t.deadline <= Timestamp::now() {
            self.expire(key);
            return;
        }
        let preference = self.targets_now(t, branch);
        if preference.is_empty() {
            // Its destinations were removed and the current routes match nothing.
            self.fail_unroutable(key);
            return;
        }
        let failover_after = preference
            .first()
            .and_then(|d| self.dests.get(d.as_ref()))
            .map_or(Duration::ZERO, |d| d.failover_after);
        let choice = choose(
            &preference,
            |d| self.dests.get(d).is_some_and(|s| s.up),
            occasion,
            failover_after,
        );
        let target = match choice {
            Choice::Go(target) => target.to_string(),
            Choice::Wait => {
                let bounces = t.bounces(key.branch);
                let (left, next_try) = match occasion {
                    Occasion::Leaving(from) => (Some(Arc::from(from)), now + retry_delay(bounces)),
                    _ => (None, now),
                };
                let waiting = self.waiting.entry(key).or_insert(Waiting {
                    since: now,
                    next_try,
                    left: None,
                });
                waiting.next_try = next_try;
                if left.is_some() {
                    waiting.left = left;
                }
                if let Some(t) = self.units.get_mut(&key.unit) {
                    t.clear_dispatched(key.branch);
                }
                return;
            }
        };
        let left = match occasion {
            Occasion::Leaving(from) => Some(Arc::<str>::from(from)),
            _ => self.waiting.get(&key).and_then(|w| w.left.clone()),
        };
        self.waiting.remove(&key);
        if let Some(from) = left
            && from.as_ref() != target
        {
            metrics::counter!(
                "sendium_branches_failed_over_total",
                "from" => from.to_string(),
                "to" => target.clone()
            )
            .increment(1);
        }
        if let Some(dest) = self.dests.get_mut(&target) {
            let name = dest.name.clone();
            let priority = match self.units.get_mut(&key.unit) {
                Some(t) => {
                    t.set_dispatched(key.branch, name);
                    t.priority
                }
                None => 0,
            };
            dest.queue.push(key, priority);
            self.pump(&target);
        }
    }

    /// Place the waiting branches that may go somewhere now (all of them when `only_to`
    /// is `None`, else those whose first preference is that destination), and end those
    /// whose validity ran out.
    pub(super) fn place_waiting(&mut self, only_to: Option<&str>) {
        if self.waiting.is_empty() {
            return;
        }
        let now = Instant::now();
        let expired_at = Timestamp::now();
        let mut due = Vec::new();
        let mut expired = Vec::new();
        for (key, w) in &self.waiting {
            let Some(t) = self.units.get(&key.unit) else {
                continue;
            };
            if t.deadline <= expired_at {
                expired.push(*key);
                continue;
            }
            if w.next_try > now {
                continue;
            }
            let first_is = |name: &str| {
                t.branch(key.branch)
                    .is_some_and(|b| self.targets_now(t, b).first().is_some_and(|f| f.as_ref() == name))
            };
            if only_to.is_none_or(first_is) {
                due.push((*key, now.duration_since(w.since)));
            }
        }
        for key in expired {
            self.waiting.remove(&key);
            self.expire(key);
        }
        // In admission order (unit ids are time-ordered): messages that waited out an
        // outage go out in the order they came.
        due.sort_unstable_by_key(|(key, _)| *key);
        for (key, waited) in due {
            self.place(key, Occasion::Waited(waited));
        }
    }

    /// Where a branch may go now, in the order to try: its recorded targets that are
    /// still configured; when none is — a reload (or a restart with another
    /// configuration) removed them — the targets the current route table gives its
    /// message. Only a primary branch is routed again: a copy exists for the one
    /// destination it copies to. Empty: nowhere, and the branch fails as unroutable.
    pub(super) fn targets_now(&self, t: &Tracked, branch: &Branch) -> Vec<Arc<str>> {
        let configured = |d: &str| self.dests.get(d).map(|s| s.name.clone());
        let recorded: Vec<Arc<str>> = branch.preference().filter_map(configured).collect();
        if !recorded.is_empty() || branch.kind != BranchKind::Primary || t.unit.disposition != Disposition::Deliver {
            return recorded;
        }
        let Some(first) = t.unit.parts.first() else {
            return recorded;
        };
        let routes = self.routes.current();
        super::plan::resolve(&routes, &t.unit, first)
            .map(|r| r.to.iter().filter_map(|d| configured(d)).collect())
            .unwrap_or_default()
    }

    /// The message's validity ran out before any destination took this branch.
    pub(super) fn expire(&mut self, key: BranchKey) {
        self.waiting.remove(&key);
        metrics::counter!("sendium_branches_expired_total").increment(1);
        let failure = BranchOutcome::Failed {
            destination: None,
            failure: BranchFailure::Expired,
        };
        self.outcome(key, failure, Vec::new());
    }

    /// Branches waiting, and how long the oldest has waited.
    pub(super) fn waiting_stats(&self) -> (u64, Duration) {
        let now = Instant::now();
        let oldest = self
            .waiting
            .values()
            .map(|w| now.duration_since(w.since))
            .max()
            .unwrap_or_default();
        (self.waiting.len() as u64, oldest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FA: Duration = Duration::from_secs(10);

    fn reachable<'a>(up: &'a [&'a str]) -> impl Fn(&str) -> bool + 'a {
        move |d| up.contains(&d)
    }

    #[test]
    fn a_fresh_branch_goes_to_the_first_reachable_target() {
        let pref = ["up", "backup"];
        assert_eq!(
            choose(&pref, reachable(&["up", "backup"]), Occasion::Fresh, FA),
            Choice::Go("up")
        );
        assert_eq!(
            choose(&pref, reachable(&["backup"]), Occasion::Fresh, FA),
            Choice::Go("backup")
        );
        assert_eq!(choose(&pref, reachable(&[]), Occasion::Fresh, FA), Choice::Wait);
    }

    #[test]
    fn a_handed_back_branch_moves_on_at_once_but_not_back_to_where_it_left() {
        // Its preference already has the destination it left last.
        let pref = ["backup", "up"];
        assert_eq!(
            choose(&pref, reachable(&["up", "backup"]), Occasion::Leaving("up"), FA),
            Choice::Go("backup")
        );
        // Nothing else reachable: it waits rather than going straight back.
        assert_eq!(
            choose(&pref, reachable(&["up"]), Occasion::Leaving("up"), FA),
            Choice::Wait
        );
        assert_eq!(
            choose(&["up"], reachable(&["up"]), Occasion::Leaving("up"), FA),
            Choice::Wait
        );
    }

    #[test]
    fn a_waiting_branch_keeps_to_its_first_preference_for_failover_after() {
        let pref = ["up", "backup"];
        let waited = |s| Occasion::Waited(Duration::from_secs(s));
        assert_eq!(
            choose(&pref, reachable(&["up", "backup"]), waited(0), FA),
            Choice::Go("up")
        );
        assert_eq!(choose(&pref, reachable(&["backup"]), waited(9), FA), Choice::Wait);
        assert_eq!(
            choose(&pref, reachable(&["backup"]), waited(10), FA),
            Choice::Go("backup")
        );
        assert_eq!(choose(&pref, reachable(&[]), waited(100), FA), Choice::Wait);
    }

    #[test]
    fn retries_back_off_to_a_minute() {
        assert_eq!(retry_delay(0), Duration::from_secs(1));
        assert_eq!(retry_delay(1), Duration::from_secs(1));
        assert_eq!(retry_delay(2), Duration::from_secs(2));
        assert_eq!(retry_delay(6), Duration::from_secs(32));
        assert_eq!(retry_delay(7), Duration::from_secs(60));
        assert_eq!(retry_delay(u32::MAX), Duration::from_secs(60));
    }

    #[test]
    fn the_deadline_is_the_earliest_validity_within_max_age() {
        let part = |at: u64, valid: Option<u64>| sendium_storage::PendingRecord {
            id: sendium_storage::MessageId::generate(),
            account: "esme1".into(),
            channel: sendium_storage::Channel::Smpp,
            source: Default::default(),
            destination: Default::default(),
            service_type: String::new(),
            esm_class: 0,
            protocol_id: 0,
            priority: 0,
            data_coding: 0,
            payload: b"x".to_vec(),
            part: None,
            registered_delivery: 0,
            callback_url: None,
            idempotency_key: None,
            accepted_at: Timestamp(at),
            valid_until: valid.map(Timestamp),
            dlr_mask: None,
            route_priority: 0,
            destination_hint: None,
            deliver_at: None,
        };
        let unit = |parts: Vec<sendium_storage::PendingRecord>| Unit {
            id: parts[0].id,
            disposition: sendium_storage::Disposition::Deliver,
            parts,
        };
        let hour = Duration::from_secs(3600);
        assert_eq!(
            deadline(&unit(vec![part(1_000, None)]), hour),
            Timestamp(1_000 + 3_600_000)
        );
        assert_eq!(deadline(&unit(vec![part(1_000, Some(5_000))]), hour), Timestamp(5_000));
        // A validity beyond max-age is cut to max-age.
        assert_eq!(
            deadline(&unit(vec![part(1_000, Some(99_000_000))]), hour),
            Timestamp(1_000 + 3_600_000)
        );
        // The earliest part counts.
        assert_eq!(
            deadline(&unit(vec![part(2_000, Some(9_000)), part(1_000, Some(7_000))]), hour),
            Timestamp(7_000)
        );
    }
}
