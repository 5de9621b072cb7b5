//! One step's multipart parts placed in their groups by the rule in [`crate::inbound`],
//! on copies of the groups the step reaches: every backend loads its keys' open groups,
//! places the parts here, then writes back what changed. Doing it on copies also lets
//! a bounded backend count the parts a step would store before it changes anything.

use std::collections::HashMap;

use super::{InboundGroup, InboundGroupKey, InboundPart};
use crate::ids::Timestamp;

/// A group one step reached: loaded (its key's open group before the step) or opened by
/// the step.
#[derive(Clone, Debug)]
pub(crate) struct Touched {
    /// The group as it is after the step's parts. `group.no` is the stored number of a
    /// loaded group and 0 for an opened one until the backend numbers it
    /// ([`StepGroups::number`]).
    pub group: InboundGroup,
    /// Opened by this step (not stored yet).
    pub opened: bool,
    /// Its due time before the step (`None` for an opened group): where the backend's
    /// due index has it.
    pub due_before: Option<Timestamp>,
    /// Positions the step stored in it, in arrival order.
    pub added: Vec<u8>,
    /// Closed by this step.
    pub closed_now: bool,
}

impl Touched {
    /// Anything to write back.
    pub fn changed(&self) -> bool {
        self.opened || self.closed_now || !self.added.is_empty()
    }

    /// The step made it complete or closed it (a complete group reached only by
    /// retransmissions is not reported again).
    pub fn ready(&self) -> bool {
        self.changed() && (self.group.is_complete() || self.group.closed)
    }

    /// The parts the step stored in it.
    pub fn added_parts(&self) -> impl Iterator<Item = &InboundPart> {
        self.group.parts.iter().filter(|p| self.added.contains(&p.seq))
    }
}

/// What became of one part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Placed {
    /// Stored in its key's open group (joined, or opened a group).
    Stored,
    /// The open group holds this position with the same payload: not stored again.
    Retransmission,
}

/// The groups of one step's keys while its parts are placed.
#[derive(Debug, Default)]
pub(crate) struct StepGroups {
    touched: Vec<Touched>,
    /// Each key's open group now, as an index into `touched`.
    open: HashMap<InboundGroupKey, usize>,
}

impl StepGroups {
    /// Start from the open groups of the step's keys (at most one per key; a key with
    /// none has no open group).
    pub fn new(open: impl IntoIterator<Item = InboundGroup>) -> Self {
        let mut s = Self::default();
        for mut group in open {
            group.parts.sort_by_key(|p| p.seq);
            let i = s.touched.len();
            s.open.insert(group.key.clone(), i);
            s.touched.push(Touched {
                due_before: Some(group.due_at()),
                group,
                opened: false,
                added: Vec::new(),
                closed_now: false,
            });
        }
        s
    }

    /// Place one part by the rule of [`crate::inbound`].
    pub fn place(&mut self, part: InboundPart) -> Placed {
        if let Some(&i) = self.open.get(&part.key) {
            let t = &mut self.touched[i];
            match t.group.parts.binary_search_by_key(&part.seq, |p| p.seq) {
                Ok(at) if t.group.parts[at].message.payload == part.message.payload => return Placed::Retransmission,
                Ok(_) => {
                    t.group.closed = true;
                    t.closed_now = true;
                    self.open.remove(&part.key);
                }
                Err(at) => {
                    t.added.push(part.seq);
                    t.group.parts.insert(at, part);
                    return Placed::Stored;
                }
            }
        }
        let i = self.touched.len();
        self.open.insert(part.key.clone(), i);
        self.touched.push(Touched {
            group: InboundGroup {
                no: 0,
                key: part.key.clone(),
                deadline: part.deadline,
                closed: false,
                parts: Vec::new(),
            },
            opened: true,
            due_before: None,
            added: vec![part.seq],
            closed_now: false,
        });
        self.touched[i].group.parts.push(part);
        Placed::Stored
    }

    /// Parts stored by the step so far.
    pub fn stored_parts(&self) -> usize {
        self.touched.iter().map(|t| t.added.len()).sum()
    }

    /// How many groups the step opened (to be numbered).
    pub fn opened(&self) -> usize {
        self.touched.iter().filter(|t| t.opened).count()
    }

    /// Number the opened groups, in the order they were opened.
    pub fn number(&mut self, mut next: impl FnMut() -> u64) {
        for t in self.touched.iter_mut().filter(|t| t.opened) {
            t.group.no = next();
        }
    }

    /// The groups reached, loaded ones first, then opened ones in order.
    pub fn into_touched(self) -> Vec<Touched> {
        self.touched
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::MessageId;
    use crate::inbound::InboundMessage;
    use crate::record::Address;

    fn key() -> InboundGroupKey {
        InboundGroupKey {
            from_destination: "up".into(),
            source: "447700900123".into(),
            destination: "1234".into(),
            reference: 7,
            total: 3,
        }
    }

    fn part(seq: u8, text: &str, deadline: u64) -> InboundPart {
        InboundPart {
            key: key(),
            seq,
            deadline: Timestamp(deadline),
            message: InboundMessage {
                id: MessageId::generate(),
                from_destination: "up".into(),
                source: Address::new(1, 1, "447700900123"),
                destination: Address::new(0, 1, "1234"),
                data_coding: 0,
                payload: text.as_bytes().to_vec(),
                received_at: Timestamp(1),
                route: String::new(),
                incomplete: false,
            },
        }
    }

    #[test]
    fn parts_join_retransmissions_are_not_stored_and_conflicts_open_a_new_group() {
        let mut s = StepGroups::new([]);
        assert_eq!(s.place(part(2, "b", 100)), Placed::Stored);
        assert_eq!(s.place(part(1, "a", 200)), Placed::Stored);
        assert_eq!(s.place(part(1, "a", 300)), Placed::Retransmission);
        assert_eq!(s.place(part(2, "x", 400)), Placed::Stored);
        assert_eq!(s.stored_parts(), 3);
        assert_eq!(s.opened(), 2);
        let mut n = 10;
        s.number(|| {
            n += 1;
            n
        });
        let t = s.into_touched();
        assert_eq!((t[0].group.no, t[1].group.no), (11, 12));
        assert!(t[0].group.closed && t[0].ready(), "closed by the conflict");
        assert_eq!(t[0].group.deadline, Timestamp(100), "the first part's deadline");
        assert_eq!(t[0].group.parts.iter().map(|p| p.seq).collect::<Vec<_>>(), vec![1, 2]);
        assert!(!t[1].group.closed && !t[1].ready());
        assert_eq!(t[1].group.parts.len(), 1);
    }

    #[test]
    fn a_loaded_group_made_complete_is_ready_and_a_retransmission_to_it_is_not() {
        let loaded = InboundGroup {
            no: 5,
            key: key(),
            deadline: Timestamp(50),
            closed: false,
            parts: vec![part(3, "c", 50), part(1, "a", 50)],
        };
        let mut s = StepGroups::new([loaded.clone()]);
        assert_eq!(s.place(part(2, "b", 99)), Placed::Stored);
        let t = s.into_touched();
        assert_eq!(t.len(), 1);
        assert!(t[0].group.is_complete() && t[0].ready());
        assert_eq!(t[0].due_before, Some(Timestamp(50)));
        assert_eq!(t[0].group.due_at(), Timestamp(0));
        assert_eq!(t[0].added_parts().map(|p| p.seq).collect::<Vec<_>>(), vec![2]);

        let mut complete = loaded;
        complete.parts.push(part(2, "b", 50));
        let mut s = StepGroups::new([complete]);
        assert_eq!(s.place(part(2, "b", 99)), Placed::Retransmission);
        assert!(!s.into_touched()[0].ready(), "already reported");
    }
}
