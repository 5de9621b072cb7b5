//! Reports that reach whichever correlator incarnation is running.
//!
//! A step's commit and a round of deliveries run in tasks of their own and report back
//! by message. When the correlator that started them panics, a report can find no
//! correlator (between the old one's death and the next one's start) or die unread in
//! the old mailbox. Lost, a step would leave the deliveries it claimed unsent until
//! their lease lapsed (a minute by default), and its handoffs and provider receipts
//! would have to be sent again; lost delivery results would send receipts twice.
//!
//! So each report travels as a [`Report`]: dropped unread, it parks what it carries in
//! the [`Handover`] the supervisor keeps across restarts, and the next incarnation takes
//! it over when it starts and on every tick.

use std::sync::Arc;

use parking_lot::Mutex;
use sendium_storage::DeliveryFinish;

use super::steps::AppliedStep;

/// What a task reports back.
pub(super) enum Completion {
    /// A write step was committed (or failed).
    Applied(Box<AppliedStep>),
    /// Results of delivery attempts, from deliveries the incarnation `incarnation`
    /// dispatched.
    Delivered {
        incarnation: u64,
        results: Vec<DeliveryFinish>,
    },
}

/// Reports no correlator read, kept for the next one. One per gateway, shared by every
/// incarnation of the correlator.
#[derive(Default)]
pub struct Handover(Mutex<Vec<Completion>>);

impl Handover {
    /// Everything parked so far, oldest first.
    pub(super) fn take(&self) -> Vec<Completion> {
        std::mem::take(&mut *self.0.lock())
    }
}

/// A report on its way to the correlator; see the module documentation.
pub struct Report {
    completion: Option<Completion>,
    handover: Arc<Handover>,
}

impl Report {
    pub(super) fn new(completion: Completion, handover: &Arc<Handover>) -> Self {
        Self {
            completion: Some(completion),
            handover: handover.clone(),
        }
    }

    /// Read by a running correlator: it is not parked.
    pub(super) fn open(mut self) -> Option<Completion> {
        self.completion.take()
    }
}

impl Drop for Report {
    fn drop(&mut self) {
        if let Some(c) = self.completion.take() {
            self.handover.0.lock().push(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivered(incarnation: u64) -> Completion {
        Completion::Delivered {
            incarnation,
            results: Vec::new(),
        }
    }

    #[test]
    fn an_unread_report_is_parked_and_a_read_one_is_not() {
        let handover = Arc::new(Handover::default());
        drop(Report::new(delivered(1), &handover));
        let read = Report::new(delivered(2), &handover).open();
        assert!(matches!(read, Some(Completion::Delivered { incarnation: 2, .. })));
        drop(Report::new(delivered(3), &handover));
        let parked: Vec<u64> = handover
            .take()
            .into_iter()
            .map(|c| match c {
                Completion::Delivered { incarnation, .. } => incarnation,
                Completion::Applied(_) => 0,
            })
            .collect();
        assert_eq!(parked, [1, 3]);
        assert!(handover.take().is_empty());
    }
}
