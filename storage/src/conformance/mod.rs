//! Test-only module: compiled under `#[cfg(test)]` (see its `mod` declaration).
//!
//! The storage conformance suite: one set of contract tests, run against every backend.
//!
//! A backend joins by implementing [`Factory`] and invoking [`conformance_suite!`], which
//! expands into one `#[tokio::test]` per contract case.

pub(crate) mod dlr;
pub(crate) mod fixtures;
pub(crate) mod ops;
pub(crate) mod pending;
mod postgresql;
pub(crate) mod routed_work;
pub(crate) mod router_queue;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use self::fixtures::retention;
use crate::dlr::{DlrRetention, DlrStore};
use crate::ids::{MessageId, Timestamp};
use crate::memory::PendingLimits;
use crate::pending::PendingStore;
use crate::record::{Address, Channel, PartInfo, PendingRecord};
use crate::routed_work::RoutedWorkStore;
use crate::router_queue::RouterQueueStore;

/// Creates fresh, empty stores of the three SMS stages of one backend.
#[async_trait]
pub(crate) trait Factory: Send + Sync {
    async fn pending(&self, limits: PendingLimits) -> Arc<dyn PendingStore>;
    async fn router_queue(&self) -> Arc<dyn RouterQueueStore>;
    async fn routed_work(&self) -> Arc<dyn RoutedWorkStore>;
}

/// Creates fresh, empty DLR stores of one backend (a separate trait: a backend may
/// implement the SMS stages before its DLR store exists).
#[async_trait]
pub(crate) trait DlrFactory: Send + Sync {
    async fn dlr(&self, capacity: u64, retention: DlrRetention) -> Arc<dyn DlrStore>;
}

pub(crate) fn record(account: &str, to: &str, text: &str) -> PendingRecord {
    PendingRecord {
        id: MessageId::generate(),
        account: account.to_string(),
        channel: Channel::Smpp,
        source: Address::new(5, 0, "Sendium"),
        destination: Address::new(1, 1, to),
        service_type: String::new(),
        esm_class: 0,
        protocol_id: 0,
        priority: 0,
        data_coding: 0,
        payload: text.as_bytes().to_vec(),
        part: None,
        registered_delivery: 1,
        callback_url: None,
        idempotency_key: None,
        accepted_at: Timestamp::now(),
        valid_until: None,
        dlr_mask: None,
        route_priority: 0,
        destination_hint: None,
        deliver_at: None,
    }
}

pub(crate) fn part(account: &str, to: &str, reference: u16, total: u8, seq: u8, expires_in: Duration) -> PendingRecord {
    let mut r = record(account, to, &format!("part {seq} of {total}"));
    r.part = Some(PartInfo {
        reference,
        total,
        seq,
        expires_at: Timestamp::now().saturating_add(expires_in),
    });
    r
}

/// Expand the whole suite for one backend: `conformance_suite!(memory, MemoryFactory)`
/// runs every SMS-stage and DLR-store case against the factory's stores. A backend with
/// only some stores invokes [`sms_cases!`] or [`dlr_cases!`] in a module of its own.
macro_rules! conformance_suite {
    ($name:ident, $factory:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $crate::conformance::sms_cases!($factory);
            $crate::conformance::dlr_cases!($factory);
        }
    };
}

/// The SMS-stage cases (pending, router-queue, routed-work).
macro_rules! sms_cases {
    ($factory:expr) => {
        $crate::conformance::conformance_cases!($factory;
            pending::admits_and_lists_ready_units,
            pending::deduplicates_idempotency_keys_per_account,
            pending::refuses_an_idempotency_key_reused_for_another_message,
            pending::refuses_when_full,
            pending::reassembles_multipart_groups,
            pending::answers_a_retransmitted_part_with_its_first_id,
            pending::a_new_message_supersedes_the_open_group_with_its_reference,
            pending::a_collision_at_a_later_position_supersedes_too,
            pending::a_part_with_another_total_starts_a_new_message,
            pending::a_part_after_its_group_completed_is_a_retransmission_or_a_new_message,
            pending::expires_incomplete_groups_at_saved_deadline,
            pending::completes_units_idempotently,
            pending::pages_ready_units_with_a_cursor,
            pending::orders_ready_units_by_route_priority_then_arrival,
            pending::a_cursor_per_lane_finds_urgent_units_admitted_later,
            pending::reports_stats,
            pending::commits_admissions_and_completions_together,
            pending::a_commit_admits_into_the_room_its_completions_make,
            router_queue::stages_batches_with_cursor,
            router_queue::releases_idempotently,
            router_queue::keeps_a_cursor_per_priority_lane,
            routed_work::records_once_and_completes_first_outcome,
            routed_work::pages_and_removes,
            routed_work::applies_record_complete_and_remove_together,
            routed_work::records_failovers_with_the_branch,
        );
    };
}

/// The DLR-store cases.
macro_rules! dlr_cases {
    ($factory:expr) => {
        $crate::conformance::conformance_cases!($factory;
            dlr::resolves_delivered_when_every_part_delivered,
            dlr::first_failure_resolves_at_once,
            dlr::orphan_receipts_match_a_later_handoff,
            dlr::repeated_handoff_is_idempotent,
            dlr::resubmission_replaces_provider_ids,
            dlr::failure_only_targets,
            dlr::failed_handoff_delivers_failure_receipt,
            dlr::kannel_progress_reports,
            dlr::claims_are_leased_and_fenced,
            dlr::wake_account_makes_parked_smpp_receipts_due,
            dlr::a_scoped_claim_takes_http_and_the_smpp_receipts_of_its_accounts,
            dlr::expires_after_retention,
            dlr::a_batched_step_equals_its_parts_in_turn,
            dlr::a_step_may_claim_the_deliveries_it_creates,
            dlr::an_inbound_message_is_delivered_like_a_receipt,
            dlr::smpp_inbound_is_scoped_by_account_and_woken_by_a_bind,
            dlr::a_multipart_message_is_complete_at_its_last_part_and_written_once,
            dlr::a_retransmitted_part_is_not_stored_twice,
            dlr::a_conflicting_part_closes_the_open_group_and_opens_another,
            dlr::due_inbound_groups_are_complete_closed_and_overdue_ones,
            dlr::a_part_joining_a_group_being_written_is_delivered_with_it,
            dlr::inbound_deliveries_expire_and_groups_do_not,
            dlr::a_step_stores_receipts_and_inbound_messages_together,
        );
    };
}

macro_rules! conformance_cases {
    ($factory:expr; $($module:ident :: $case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                let factory = $factory;
                $crate::conformance::$module::$case(&factory).await;
            }
        )*
    };
}

pub(crate) use {conformance_cases, dlr_cases, sms_cases};

/// The memory backends.
struct MemoryFactory;

#[async_trait]
impl Factory for MemoryFactory {
    async fn pending(&self, limits: PendingLimits) -> Arc<dyn PendingStore> {
        Arc::new(crate::memory::MemoryPendingStore::new(limits))
    }
    async fn router_queue(&self) -> Arc<dyn RouterQueueStore> {
        Arc::new(crate::memory::MemoryRouterQueueStore::new())
    }
    async fn routed_work(&self) -> Arc<dyn RoutedWorkStore> {
        Arc::new(crate::memory::MemoryRoutedWorkStore::new())
    }
}

#[async_trait]
impl DlrFactory for MemoryFactory {
    async fn dlr(&self, capacity: u64, retention: DlrRetention) -> Arc<dyn DlrStore> {
        Arc::new(crate::memory::MemoryDlrStore::new(capacity, retention))
    }
}

conformance_suite!(memory, MemoryFactory);

/// The file backends: every store in a fresh temporary data directory, removed when
/// the factory (which outlives the case's stores) is dropped.
#[derive(Default)]
struct FileFactory {
    dirs: parking_lot::Mutex<Vec<tempfile::TempDir>>,
}

impl FileFactory {
    fn dir(&self) -> Arc<crate::file::DataDir> {
        let tmp = tempfile::tempdir().expect("temp dir");
        let dir = Arc::new(crate::file::DataDir::open(tmp.path().join("spool")).expect("data dir"));
        self.dirs.lock().push(tmp);
        dir
    }
}

#[async_trait]
impl Factory for FileFactory {
    async fn pending(&self, limits: PendingLimits) -> Arc<dyn PendingStore> {
        Arc::new(crate::file::FilePendingStore::open(&self.dir(), limits).expect("open pending"))
    }
    async fn router_queue(&self) -> Arc<dyn RouterQueueStore> {
        Arc::new(crate::file::FileRouterQueueStore::open(&self.dir()).expect("open router-queue"))
    }
    async fn routed_work(&self) -> Arc<dyn RoutedWorkStore> {
        Arc::new(crate::file::FileRoutedWorkStore::open(&self.dir()).expect("open routed-work"))
    }
}

#[async_trait]
impl DlrFactory for FileFactory {
    /// `capacity` is the memory store's bound; the file store has none.
    async fn dlr(&self, _capacity: u64, retention: DlrRetention) -> Arc<dyn DlrStore> {
        Arc::new(crate::file::FileDlrStore::open(&self.dir(), retention).expect("open dlr"))
    }
}

conformance_suite!(file, FileFactory::default());

#[tokio::test]
async fn memory_dlr_refuses_reservations_beyond_capacity() {
    let store = MemoryFactory.dlr(2, retention()).await;
    let gate = store.capabilities().reservations.expect("memory DLR is bounded");
    assert!(gate.try_reserve(2));
    assert!(!gate.try_reserve(1), "a third receipt does not fit");
}

/// The memory store bounds inbound messages with the receipts: a step whose parts and
/// messages do not fit is refused as a whole with `Full` (nothing of it stored, so the
/// provider's resend loses nothing), and it fits again once deliveries finish. Writing a
/// group never needs room: its parts hand their reservations to its delivery.
#[tokio::test]
async fn memory_dlr_refuses_inbound_when_full_and_recovers() {
    use crate::conformance::dlr::{mo_http, mo_key, mo_message, mo_part, routed, routed_group, store_parts};
    use crate::dlr::DlrWrite;
    use crate::error::{DlrError, FailureKind};

    let kind = |r: Result<(), DlrError>| match r {
        Err(DlrError::Backend(f)) => f.kind,
        Ok(()) => panic!("stored beyond capacity"),
    };
    let in_an_hour = Timestamp::now().saturating_add(Duration::from_secs(3600));
    let store = MemoryFactory.dlr(3, retention()).await;
    let gate = store.capabilities().reservations.expect("memory DLR is bounded");
    assert!(gate.try_reserve(1), "a receipt reserved at admission");
    let key = mo_key(1, 2);
    store_parts(&*store, vec![mo_part(&key, 1, "a", in_an_hour)]).await;
    let message = |text: &str| routed("web", mo_http(), mo_message(text), None);
    let write = |parts, inbound| DlrWrite {
        inbound_parts: parts,
        inbound,
        ..DlrWrite::default()
    };
    store.apply(write(vec![], vec![message("one")])).await.inbound.unwrap();
    assert_eq!(gate.held(), 3);

    // Full: neither a part nor a message is taken, and none of the step is stored.
    let out = store
        .apply(write(vec![mo_part(&key, 2, "b", in_an_hour)], vec![message("two")]))
        .await;
    assert_eq!(kind(out.inbound), FailureKind::Full);
    assert!(out.complete_groups.is_empty());
    let out = store.apply(write(vec![], vec![message("two")])).await;
    assert_eq!(kind(out.inbound), FailureKind::Full);
    let st = store.stats().await.unwrap();
    assert_eq!((st.inbound_parts, st.pending_deliveries, gate.held()), (1, 1, 3));
    // A retransmission needs no room.
    store
        .apply(write(vec![mo_part(&key, 1, "a", in_an_hour)], vec![]))
        .await
        .inbound
        .unwrap();

    // A delivery finished makes room again.
    deliver_due(&*store).await;
    assert_eq!(gate.held(), 2);
    let complete = store_parts(&*store, vec![mo_part(&key, 2, "b", in_an_hour)]).await;
    assert_eq!((complete.len(), gate.held()), (1, 3));

    // Full again, but writing the group needs no room: its two parts become one delivery,
    // which leaves room for one more message in the same step.
    let out = store
        .apply(write(vec![], vec![routed_group(&complete[0]), message("three")]))
        .await;
    out.inbound.unwrap();
    let st = store.stats().await.unwrap();
    assert_eq!((st.inbound_parts, st.pending_deliveries, gate.held()), (0, 2, 3));

    // Refused, a step still writes its groups (they make room); its messages wait.
    let other = mo_key(2, 2);
    deliver_due(&*store).await;
    assert_eq!(gate.held(), 1, "the admission's receipt only");
    store_parts(&*store, vec![mo_part(&other, 1, "x", in_an_hour)]).await;
    let complete = store_parts(&*store, vec![mo_part(&other, 2, "y", in_an_hour)]).await;
    assert_eq!(gate.held(), 3);
    let out = store
        .apply(write(
            vec![],
            vec![routed_group(&complete[0]), message("four"), message("five")],
        ))
        .await;
    assert_eq!(kind(out.inbound), FailureKind::Full);
    let st = store.stats().await.unwrap();
    assert_eq!((st.inbound_parts, st.pending_deliveries, gate.held()), (0, 1, 2));
    gate.release(1);
    assert_eq!(gate.held(), 1, "the group's delivery holds one");
}

/// Claim every delivery due within a second and report each delivered.
async fn deliver_due(store: &dyn DlrStore) {
    let due = store
        .claim_due(
            crate::ids::Timestamp::now().saturating_add(std::time::Duration::from_secs(1)),
            std::time::Duration::from_secs(30),
            10,
            crate::dlr::ClaimScope::All,
        )
        .await
        .unwrap();
    store
        .apply(crate::dlr::DlrWrite {
            finishes: fixtures::delivered(&due),
            ..crate::dlr::DlrWrite::default()
        })
        .await
        .finishes
        .unwrap();
}
