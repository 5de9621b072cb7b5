//! A destination's queue: the branches placed on it beyond its worker's credit, taken
//! highest route `priority` first and in arrival order within one priority, so a
//! one-time password routed with priority 9 overtakes a bulk campaign queued before it.

use std::cmp::Reverse;
use std::collections::{BTreeMap, VecDeque};

use super::BranchKey;

#[derive(Debug, Default)]
pub(super) struct BranchQueue {
    /// Non-empty lanes only; with no priorities configured there is one lane (0).
    lanes: BTreeMap<Reverse<u8>, VecDeque<BranchKey>>,
    len: usize,
}

impl BranchQueue {
    pub(super) fn push(&mut self, key: BranchKey, priority: u8) {
        self.lanes.entry(Reverse(priority)).or_default().push_back(key);
        self.len += 1;
    }

    /// The next branch to give the worker: the oldest of the highest priority.
    pub(super) fn pop(&mut self) -> Option<BranchKey> {
        let mut lane = self.lanes.first_entry()?;
        let key = lane.get_mut().pop_front();
        if lane.get().is_empty() {
            lane.remove();
        }
        if key.is_some() {
            self.len -= 1;
        }
        key
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Everything queued, in the order it would have been taken.
    pub(super) fn take_all(&mut self) -> Vec<BranchKey> {
        self.len = 0;
        std::mem::take(&mut self.lanes).into_values().flatten().collect()
    }

    /// Keeps the branches `keep` says to, in their order.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&BranchKey) -> bool) {
        for lane in self.lanes.values_mut() {
            lane.retain(&mut keep);
        }
        self.lanes.retain(|_, lane| !lane.is_empty());
        self.len = self.lanes.values().map(VecDeque::len).sum();
    }

    pub(super) fn clear(&mut self) {
        self.lanes.clear();
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use sendium_storage::MessageId;

    use super::*;

    fn key(n: u16) -> BranchKey {
        BranchKey {
            unit: MessageId::generate(),
            branch: n,
        }
    }

    #[test]
    fn highest_priority_first_then_arrival_order() {
        let mut q = BranchQueue::default();
        for (n, priority) in [(1, 0), (2, 0), (3, 9), (4, 5), (5, 9), (6, 0)] {
            q.push(key(n), priority);
        }
        assert_eq!(q.len(), 6);
        let first: Vec<u16> = (0..3).filter_map(|_| q.pop()).map(|k| k.branch).collect();
        assert_eq!(first, vec![3, 5, 4]);
        q.push(key(7), 9);
        assert_eq!(
            q.pop().map(|k| k.branch),
            Some(7),
            "a later urgent one still goes first"
        );
        q.push(key(8), 5);
        q.retain(|k| k.branch != 2);
        assert_eq!(q.len(), 3);
        assert_eq!(q.take_all().iter().map(|k| k.branch).collect::<Vec<_>>(), vec![8, 1, 6]);
        assert_eq!((q.len(), q.pop()), (0, None));
    }
}
