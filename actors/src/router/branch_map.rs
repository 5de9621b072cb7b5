//! [`BranchMap`]: per-branch state of one unit.

/// A map from branch number to `V` for the branches of one unit, in a vector.
///
/// A unit has a primary branch and one branch per copy its routes ask for, so mostly
/// just one: a linear scan over a handful of entries costs less than hashing the key,
/// and an empty map allocates nothing. Iteration follows insertion order.
#[derive(Debug)]
pub(super) struct BranchMap<V>(Vec<(u16, V)>);

impl<V> Default for BranchMap<V> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<V> BranchMap<V> {
    pub(super) fn get(&self, branch: u16) -> Option<&V> {
        self.0.iter().find(|(b, _)| *b == branch).map(|(_, v)| v)
    }

    pub(super) fn get_mut(&mut self, branch: u16) -> Option<&mut V> {
        self.0.iter_mut().find(|(b, _)| *b == branch).map(|(_, v)| v)
    }

    pub(super) fn contains(&self, branch: u16) -> bool {
        self.0.iter().any(|(b, _)| *b == branch)
    }

    /// Sets `branch` to `value`, replacing what it held.
    pub(super) fn insert(&mut self, branch: u16, value: V) {
        match self.0.iter_mut().find(|(b, _)| *b == branch) {
            Some((_, v)) => *v = value,
            None => self.0.push((branch, value)),
        }
    }

    pub(super) fn remove(&mut self, branch: u16) -> Option<V> {
        let at = self.0.iter().position(|(b, _)| *b == branch)?;
        Some(self.0.remove(at).1)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (u16, &V)> {
        self.0.iter().map(|(b, v)| (*b, v))
    }

    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = (u16, &mut V)> {
        self.0.iter_mut().map(|(b, v)| (*b, v))
    }

    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::BranchMap;

    #[test]
    fn behaves_as_a_map_of_branches() {
        let mut m = BranchMap::default();
        assert!(m.is_empty());
        m.insert(0, "a");
        m.insert(2, "c");
        m.insert(1, "b");
        m.insert(2, "C");
        assert_eq!(m.len(), 3, "a second insert of a branch replaces its value");
        assert_eq!(m.get(2), Some(&"C"));
        assert!(m.contains(1) && !m.contains(3));
        assert_eq!(m.get(3), None);
        assert_eq!(m.remove(0), Some("a"));
        assert_eq!(m.remove(0), None);
        assert!(!m.contains(0));
        if let Some(v) = m.get_mut(1) {
            *v = "B";
        }
        assert_eq!(m.get(1), Some(&"B"));
        let seen: Vec<(u16, &str)> = m.iter().map(|(b, v)| (b, *v)).collect();
        assert_eq!(seen, vec![(2, "C"), (1, "B")], "insertion order, also after a removal");
        for (_, v) in m.iter_mut() {
            *v = "x";
        }
        assert_eq!(m.remove(1), Some("x"));
        assert_eq!(m.remove(2), Some("x"));
        assert!(m.is_empty());
    }
}
