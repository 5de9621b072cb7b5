//! What every actor shares: the directory of actors, health, the SMPP session registry
//! (for receipts to ESMEs), and restart counters.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use sendium_protocols::smpp::server::SessionRegistry;
use sendium_storage::postgresql::Ownership;
use sendium_storage::{PendingRecord, Timestamp};

use crate::directory::Directory;
use crate::dlr_correlator::{DlrMsg, ReceiptBatch};
use crate::health::Health;

/// Restart counts per actor name, for `/admin/actors` and `/metrics`.
#[derive(Default)]
pub struct Restarts {
    counts: parking_lot::Mutex<HashMap<String, u64>>,
    total: AtomicU64,
}

impl Restarts {
    pub fn record(&self, name: &str) {
        *self.counts.lock().entry(name.to_string()).or_default() += 1;
        self.total.fetch_add(1, Ordering::Relaxed);
    }

    pub fn of(&self, name: &str) -> u64 {
        self.counts.lock().get(name).copied().unwrap_or(0)
    }

    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
}

/// What an orderly stop has switched off so far.
#[derive(Default)]
pub struct Stopping {
    /// Admissions are refused (the gateway is stopping).
    refuse_admissions: AtomicBool,
    /// Destination workers start no new provider submission; those in flight finish.
    hold_submissions: AtomicBool,
}

impl Stopping {
    pub fn refuse_admissions(&self) {
        self.refuse_admissions.store(true, Ordering::Release);
    }

    pub fn refusing_admissions(&self) -> bool {
        self.refuse_admissions.load(Ordering::Acquire)
    }

    pub fn hold_submissions(&self) {
        self.hold_submissions.store(true, Ordering::Release);
    }

    pub fn holding_submissions(&self) -> bool {
        self.hold_submissions.load(Ordering::Acquire)
    }
}

/// Which destinations have their provider link up, as their workers last reported it
/// (the state the Router also gets). Read on the `/cgi-bin/sendsms` path to answer
/// Kannel's `3: Queued for later delivery` without a round trip to any actor; written
/// only when a link goes up or down. A destination no worker reported yet is down.
#[derive(Default)]
pub struct DestinationLinks {
    up: parking_lot::RwLock<std::collections::HashSet<String>>,
}

impl DestinationLinks {
    pub fn set(&self, name: &str, up: bool) {
        if up == self.up.read().contains(name) {
            return;
        }
        let mut set = self.up.write();
        if up {
            set.insert(name.to_string());
        } else {
            set.remove(name);
        }
    }

    /// Whether any of `names` is up.
    pub fn any_up(&self, names: &[String]) -> bool {
        let set = self.up.read();
        names.iter().any(|n| set.contains(n))
    }
}

pub struct Shared {
    pub dir: Directory,
    /// Each destination's link state (see [`DestinationLinks`]).
    pub links: DestinationLinks,
    pub health: Health,
    pub sessions: SessionRegistry,
    pub restarts: Restarts,
    /// A DLR store is active (`dlr.backend` is not `disabled`).
    pub dlr_enabled: bool,
    /// This process's partitions, when several processes share the database
    /// (`storage.postgresql.shared`).
    pub partitions: Option<Arc<Ownership>>,
    /// An orderly stop in progress.
    pub stopping: Stopping,
    /// `[mo]` and `[[mo-routes]]`: where inbound messages go.
    pub mo: crate::inbound::LiveMo,
    /// How far ahead a message that asks for a receipt may be scheduled: its receipt
    /// comes after the provider delivered it, and must find its correlation, which the
    /// DLR store keeps `[dlr] retention`; an hour of that is left for the delivery
    /// ([`schedule_horizon`]). None without a DLR store: no receipt is kept for.
    pub schedule_horizon: Option<Duration>,
}

/// Why a scheduled delivery time is refused (see [`Shared::schedule_refusal`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScheduleRefusal {
    /// After 2099: an SMPP time cannot name it.
    BeyondSmppTime,
    /// Further ahead than this horizon (`[dlr] retention` less an hour).
    BeyondRetention(Duration),
}

/// `[dlr] retention` less an hour, for [`Shared::schedule_horizon`].
pub fn schedule_horizon(cfg: &sendium_profiles::Config) -> Option<Duration> {
    (cfg.dlr.backend != sendium_profiles::DlrBackend::Disabled)
        .then(|| cfg.dlr.retention.saturating_sub(Duration::from_secs(3600)))
}

impl Shared {
    /// Why `r`'s scheduled delivery time cannot be honoured, if it cannot: later than a
    /// provider can be told, or further ahead of `now` than its receipt can be kept for.
    pub fn schedule_refusal(&self, r: &PendingRecord, now: Timestamp) -> Option<ScheduleRefusal> {
        let at = r.deliver_at?;
        if at.as_millis() > sendium_protocols::smpp::time::LATEST_MS {
            return Some(ScheduleRefusal::BeyondSmppTime);
        }
        let wants_receipt = r.wants_receipt() || r.callback_url.is_some();
        match self.schedule_horizon {
            Some(horizon) if wants_receipt && at > now.saturating_add(horizon) => {
                Some(ScheduleRefusal::BeyondRetention(horizon))
            }
            _ => None,
        }
    }

    /// Hand provider receipts to the DlrCorrelator. With DLR handling disabled they are
    /// acknowledged and dropped. If the correlator is not running the batch is answered
    /// with a temporary error (see [`crate::dlr_correlator::ReceiptAcks`]), so the
    /// provider sends the receipts again.
    pub fn send_receipts(&self, batch: ReceiptBatch) -> bool {
        if !self.dlr_enabled {
            if let Some(acks) = batch.acks {
                acks.ok();
            }
            return true;
        }
        self.dir.dlr.send(DlrMsg::ProviderReceipts(batch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_destination_is_down_until_its_worker_says_it_is_up() {
        let links = DestinationLinks::default();
        let route = ["a".to_string(), "b".to_string()];
        assert!(!links.any_up(&route));
        links.set("b", true);
        assert!(links.any_up(&route), "one destination of the route up is enough");
        links.set("b", false);
        links.set("c", true);
        assert!(!links.any_up(&route));
    }
}
