//! The rounds a batch runs in inside its transaction: which items go in the next round,
//! and how many stalled rounds a batch may take; no SQL.

use std::collections::HashSet;

/// A batch runs in rounds inside its transaction: items about the same branch or
/// provider id go in successive rounds (in batch order), and an item whose rows a
/// concurrent writer changed between two statements is redone in the next round.
/// Rounds in a row where every item had to be redone, before the batch fails as
/// `Unavailable` (never reached without pathological contention).
pub(super) const MAX_STALLED_ROUNDS: usize = 16;

/// Pick the items of the next round: in order, skipping any item that shares its
/// conflict keys with an earlier pending item (so order is kept between items about
/// the same branch or provider id, and no statement touches a row twice).
pub(super) fn pick_round<K, I>(pending: &[usize], keys_of: impl Fn(usize) -> I) -> (Vec<usize>, Vec<usize>)
where
    K: std::hash::Hash + Eq,
    I: Iterator<Item = K>,
{
    let mut seen: HashSet<K> = HashSet::new();
    let (mut now, mut later) = (Vec::new(), Vec::new());
    for &i in pending {
        let mut free = true;
        for k in keys_of(i) {
            if !seen.insert(k) {
                free = false;
            }
        }
        if free { now.push(i) } else { later.push(i) }
    }
    (now, later)
}

pub(super) fn merge_sorted(mut a: Vec<usize>, b: Vec<usize>) -> Vec<usize> {
    a.extend(b);
    a.sort_unstable();
    a
}
