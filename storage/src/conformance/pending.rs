//! Conformance cases (test-only: the suite is compiled under `#[cfg(test)]`).

use std::time::Duration;

use super::{Factory, part, record};
use crate::conformance::ops::PendingOps as _;
use crate::ids::{ReadySeq, Timestamp};
use crate::memory::PendingLimits;
use crate::pending::{AdmitOutcome, Disposition};
use crate::record::PendingRecord;

fn limits() -> PendingLimits {
    PendingLimits::default()
}

const LONG: Duration = Duration::from_secs(3600);

pub(crate) async fn admits_and_lists_ready_units(f: &dyn Factory) {
    let s = f.pending(limits()).await;
    let a = record("esme1", "447700900001", "hello");
    let b = record("esme1", "447700900002", "world");
    let out = s.admit(vec![a.clone(), b.clone()]).await.unwrap();
    assert_eq!(out, vec![AdmitOutcome::Admitted, AdmitOutcome::Admitted]);
    let ready = s.ready_after(crate::ReadyCursor::START, 10).await.unwrap();
    assert_eq!(ready.len(), 2);
    assert_eq!(ready[0].unit.id, a.id);
    assert_eq!(ready[0].unit.parts, vec![a.clone()]);
    assert_eq!(ready[0].unit.disposition, Disposition::Deliver);
    assert_eq!(ready[1].unit.parts, vec![b]);
    assert!(ready[0].seq < ready[1].seq);
}

pub(crate) async fn deduplicates_idempotency_keys_per_account(f: &dyn Factory) {
    let s = f.pending(limits()).await;
    let mut a = record("esme1", "1", "x");
    a.idempotency_key = Some("k1".into());
    let mut again = record("esme1", "1", "x");
    again.idempotency_key = Some("k1".into());
    let mut other_account = record("esme2", "1", "x");
    other_account.idempotency_key = Some("k1".into());
    let out = s.admit(vec![a.clone()]).await.unwrap();
    assert_eq!(out, vec![AdmitOutcome::Admitted]);
    let out = s.admit(vec![again.clone(), other_account]).await.unwrap();
    assert_eq!(
        out,
        vec![AdmitOutcome::Duplicate { existing: a.id }, AdmitOutcome::Admitted]
    );
    // Within one batch too.
    let mut c1 = record("esme3", "1", "x");
    c1.idempotency_key = Some("same".into());
    let mut c2 = record("esme3", "1", "x");
    c2.idempotency_key = Some("same".into());
    // ... where the same key from another account is another message.
    let mut c3 = record("esme4", "1", "x");
    c3.idempotency_key = Some("same".into());
    let out = s.admit(vec![c1.clone(), c2, c3]).await.unwrap();
    assert_eq!(
        out,
        vec![
            AdmitOutcome::Admitted,
            AdmitOutcome::Duplicate { existing: c1.id },
            AdmitOutcome::Admitted
        ]
    );
    // The key outlives completion of the message (retention, not lifetime).
    s.complete(&[a.id]).await.unwrap();
    let out = s.admit(vec![again]).await.unwrap();
    assert_eq!(out, vec![AdmitOutcome::Duplicate { existing: a.id }]);
    assert_eq!(s.stats().await.unwrap().records, 3);
}

pub(crate) async fn refuses_an_idempotency_key_reused_for_another_message(f: &dyn Factory) {
    let s = f.pending(limits()).await;
    let mut first = record("esme1", "447700900001", "the first text");
    first.idempotency_key = Some("order-1".into());
    assert_eq!(
        s.admit(vec![first.clone()]).await.unwrap(),
        vec![AdmitOutcome::Admitted]
    );
    // Another text, another number, another callback: each is another message.
    let mut other_text = record("esme1", "447700900001", "another text");
    other_text.idempotency_key = Some("order-1".into());
    let mut other_number = record("esme1", "447700900002", "the first text");
    other_number.idempotency_key = Some("order-1".into());
    let mut other_callback = record("esme1", "447700900001", "the first text");
    other_callback.idempotency_key = Some("order-1".into());
    other_callback.callback_url = Some("https://example.com/elsewhere".into());
    let out = s.admit(vec![other_text, other_number, other_callback]).await.unwrap();
    assert_eq!(out, vec![AdmitOutcome::KeyReused { existing: first.id }; 3]);
    // The same message again (a new id and acceptance time: a client's retry) is a retry.
    let mut retry = record("esme1", "447700900001", "the first text");
    retry.idempotency_key = Some("order-1".into());
    assert_eq!(
        s.admit(vec![retry]).await.unwrap(),
        vec![AdmitOutcome::Duplicate { existing: first.id }]
    );
    // Within one batch too, and after completion.
    let mut b1 = record("esme2", "447700900003", "one");
    b1.idempotency_key = Some("k".into());
    let mut b2 = record("esme2", "447700900003", "two");
    b2.idempotency_key = Some("k".into());
    assert_eq!(
        s.admit(vec![b1.clone(), b2.clone()]).await.unwrap(),
        vec![AdmitOutcome::Admitted, AdmitOutcome::KeyReused { existing: b1.id }]
    );
    s.complete(&[b1.id]).await.unwrap();
    assert_eq!(
        s.admit(vec![b2]).await.unwrap(),
        vec![AdmitOutcome::KeyReused { existing: b1.id }]
    );
    assert_eq!(s.stats().await.unwrap().records, 1);
}

pub(crate) async fn refuses_when_full(f: &dyn Factory) {
    let s = f
        .pending(PendingLimits {
            max_records: 2,
            ..limits()
        })
        .await;
    let batch = vec![record("a", "1", "1"), record("a", "2", "2"), record("a", "3", "3")];
    let out = s.admit(batch).await.unwrap();
    assert_eq!(
        out,
        vec![AdmitOutcome::Admitted, AdmitOutcome::Admitted, AdmitOutcome::Full]
    );
    let ready = s.ready_after(crate::ReadyCursor::START, 10).await.unwrap();
    assert_eq!(ready.len(), 2, "a refused record is not stored");
}

pub(crate) async fn reassembles_multipart_groups(f: &dyn Factory) {
    let s = f.pending(limits()).await;
    let p2 = part("esme1", "447700900123", 7, 3, 2, LONG);
    let p1 = part("esme1", "447700900123", 7, 3, 1, LONG);
    let p3 = part("esme1", "447700900123", 7, 3, 3, LONG);
    // Same reference, other destination: another group.
    let other = part("esme1", "447700900999", 7, 3, 1, LONG);
    for p in [&p2, &p1, &other] {
        assert_eq!(s.admit(vec![p.clone()]).await.unwrap(), vec![AdmitOutcome::Admitted]);
    }
    assert!(
        s.ready_after(crate::ReadyCursor::START, 10).await.unwrap().is_empty(),
        "incomplete groups are not ready"
    );
    assert_eq!(s.stats().await.unwrap().incomplete_groups, 2);
    s.admit(vec![p3.clone()]).await.unwrap();
    let ready = s.ready_after(crate::ReadyCursor::START, 10).await.unwrap();
    assert_eq!(ready.len(), 1);
    let unit = &ready[0].unit;
    assert_eq!(unit.id, p1.id, "a group's unit id is its part 1");
    assert_eq!(unit.parts, vec![p1.clone(), p2.clone(), p3.clone()]);
    assert_eq!(unit.member_ids(), vec![p1.id, p2.id, p3.id]);
    let mut expected = p1.payload.clone();
    expected.extend(&p2.payload);
    expected.extend(&p3.payload);
    assert_eq!(unit.payload(), expected);
    assert_eq!(s.stats().await.unwrap().incomplete_groups, 1);
}

/// A part `text` of a `total`-part message with reference 9 to 4477.
fn text_part(total: u8, seq: u8, text: &str) -> crate::record::PendingRecord {
    let mut p = part("esme1", "4477", 9, total, seq, LONG);
    p.payload = text.as_bytes().to_vec();
    p
}

pub(crate) async fn answers_a_retransmitted_part_with_its_first_id(f: &dyn Factory) {
    let s = f.pending(limits()).await;
    let p1 = text_part(2, 1, "first half ");
    let p1_again = text_part(2, 1, "first half ");
    let p1_third = text_part(2, 1, "first half ");
    let p2 = text_part(2, 2, "second half");
    // In the batch that admits the part, and in a later one.
    let out = s.admit(vec![p1.clone(), p1_again]).await.unwrap();
    assert_eq!(
        out,
        vec![AdmitOutcome::Admitted, AdmitOutcome::Duplicate { existing: p1.id }]
    );
    let out = s.admit(vec![p1_third]).await.unwrap();
    assert_eq!(out, vec![AdmitOutcome::Duplicate { existing: p1.id }]);
    assert_eq!(s.stats().await.unwrap().records, 1, "a retransmission stores nothing");
    assert_eq!(s.admit(vec![p2.clone()]).await.unwrap(), vec![AdmitOutcome::Admitted]);
    let ready = s.ready_after(crate::ReadyCursor::START, 10).await.unwrap();
    assert_eq!(ready.len(), 1);
    assert_eq!(ready[0].unit.member_ids(), vec![p1.id, p2.id]);
    assert_eq!(ready[0].unit.payload(), b"first half second half");
}

/// The expired unit of a superseded group and the new message's unit, checked.
async fn check_superseded(s: &dyn crate::pending::PendingStore, old: &[&PendingRecord], new: &[&PendingRecord]) {
    let ready = s.ready_after(crate::ReadyCursor::START, 10).await.unwrap();
    assert_eq!(ready.len(), 2, "{ready:?}");
    assert_eq!(ready[0].unit.disposition, Disposition::Expired);
    assert_eq!(ready[0].unit.member_ids(), old.iter().map(|p| p.id).collect::<Vec<_>>());
    assert_eq!(ready[1].unit.disposition, Disposition::Deliver);
    assert_eq!(ready[1].unit.id, new[0].id);
    assert_eq!(ready[1].unit.member_ids(), new.iter().map(|p| p.id).collect::<Vec<_>>());
    let text: Vec<u8> = new.iter().flat_map(|p| p.payload.clone()).collect();
    assert_eq!(ready[1].unit.payload(), text);
    let stats = s.stats().await.unwrap();
    assert_eq!(stats.incomplete_groups, 0);
    assert_eq!(stats.records, (old.len() + new.len()) as u64);
}

pub(crate) async fn a_new_message_supersedes_the_open_group_with_its_reference(f: &dyn Factory) {
    // One call per part, and every part in one batch.
    for batched in [false, true] {
        let s = f.pending(limits()).await;
        let old1 = text_part(3, 1, "old message, part one ");
        let old2 = text_part(3, 2, "old message, part two ");
        s.admit(vec![old1.clone(), old2.clone()]).await.unwrap();
        let new = [
            text_part(3, 1, "new message, part one "),
            text_part(3, 2, "new message, part two "),
            text_part(3, 3, "new message, part three"),
        ];
        let out = if batched {
            s.admit(new.to_vec()).await.unwrap()
        } else {
            let mut out = Vec::new();
            for p in &new {
                out.extend(s.admit(vec![p.clone()]).await.unwrap());
            }
            out
        };
        assert_eq!(
            out,
            vec![
                AdmitOutcome::Superseding,
                AdmitOutcome::Admitted,
                AdmitOutcome::Admitted
            ]
        );
        check_superseded(s.as_ref(), &[&old1, &old2], &[&new[0], &new[1], &new[2]]).await;
    }
}

/// A later part that collides with one of the new message's: the part that collided
/// first, even with the same text, is not a retransmission of the abandoned one.
pub(crate) async fn a_collision_at_a_later_position_supersedes_too(f: &dyn Factory) {
    let s = f.pending(limits()).await;
    let old1 = text_part(3, 1, "old one ");
    let old3 = text_part(3, 3, "old three");
    s.admit(vec![old1.clone(), old3.clone()]).await.unwrap();
    // The new message's part 3 comes first; then its parts 1 and 2.
    let new3 = text_part(3, 3, "new three");
    let new1 = text_part(3, 1, "new one ");
    let new2 = text_part(3, 2, "new two ");
    let out = s.admit(vec![new3.clone(), new1.clone(), new2.clone()]).await.unwrap();
    assert_eq!(
        out,
        vec![
            AdmitOutcome::Superseding,
            AdmitOutcome::Admitted,
            AdmitOutcome::Admitted
        ]
    );
    check_superseded(s.as_ref(), &[&old1, &old3], &[&new1, &new2, &new3]).await;
}

pub(crate) async fn a_part_with_another_total_starts_a_new_message(f: &dyn Factory) {
    let s = f.pending(limits()).await;
    let old1 = text_part(3, 1, "old one ");
    s.admit(vec![old1.clone()]).await.unwrap();
    // Part 2 of a 2-part message: its position is free in the open group, but the
    // group is another message's.
    let new2 = text_part(2, 2, "new two");
    let new1 = text_part(2, 1, "new one ");
    let out = s.admit(vec![new2.clone()]).await.unwrap();
    assert_eq!(out, vec![AdmitOutcome::Superseding]);
    assert_eq!(s.admit(vec![new1.clone()]).await.unwrap(), vec![AdmitOutcome::Admitted]);
    check_superseded(s.as_ref(), &[&old1], &[&new1, &new2]).await;
}

pub(crate) async fn a_part_after_its_group_completed_is_a_retransmission_or_a_new_message(f: &dyn Factory) {
    let s = f.pending(limits()).await;
    let p1 = text_part(2, 1, "one ");
    let p2 = text_part(2, 2, "two");
    s.admit(vec![p1.clone(), p2.clone()]).await.unwrap();
    // Part 2 sent again (its answer was lost) is answered with its id; it does not
    // linger as the start of a group the next message with this reference would join.
    let late2 = text_part(2, 2, "two");
    let out = s.admit(vec![late2]).await.unwrap();
    assert_eq!(out, vec![AdmitOutcome::Duplicate { existing: p2.id }]);
    // Another message with the reference is a new message, whole.
    let other1 = text_part(2, 1, "another one ");
    let other2 = text_part(2, 2, "another two");
    let out = s.admit(vec![other1.clone(), other2.clone()]).await.unwrap();
    assert_eq!(out, vec![AdmitOutcome::Admitted, AdmitOutcome::Admitted]);
    let ready = s.ready_after(crate::ReadyCursor::START, 10).await.unwrap();
    assert_eq!(ready.len(), 2, "the completed message and the new one");
    assert_eq!(ready[0].unit.member_ids(), vec![p1.id, p2.id]);
    assert_eq!(ready[1].unit.member_ids(), vec![other1.id, other2.id]);
    assert_eq!(ready[1].unit.payload(), b"another one another two");
    assert_eq!(s.stats().await.unwrap().incomplete_groups, 0);

    // A completed group is known until its deadline only.
    let mut q1 = part("esme1", "4478", 5, 2, 1, Duration::from_millis(50));
    let mut q2 = part("esme1", "4478", 5, 2, 2, Duration::from_millis(50));
    q1.payload = b"q1".to_vec();
    q2.payload = b"q2".to_vec();
    s.admit(vec![q1, q2.clone()]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut q2_late = part("esme1", "4478", 5, 2, 2, LONG);
    q2_late.payload = b"q2".to_vec();
    let out = s.admit(vec![q2_late]).await.unwrap();
    assert_eq!(
        out,
        vec![AdmitOutcome::Admitted],
        "past the deadline it is a new message"
    );
    assert_eq!(s.stats().await.unwrap().incomplete_groups, 1);
}

pub(crate) async fn expires_incomplete_groups_at_saved_deadline(f: &dyn Factory) {
    let s = f.pending(limits()).await;
    let soon = part("esme1", "1", 1, 2, 1, Duration::from_millis(1));
    let late = part("esme1", "2", 1, 2, 1, LONG);
    s.admit(vec![soon.clone(), late.clone()]).await.unwrap();
    let now = Timestamp::now().saturating_add(Duration::from_secs(1));
    assert_eq!(s.expire_groups(now, 10).await.unwrap(), 1);
    assert_eq!(s.expire_groups(now, 10).await.unwrap(), 0, "expiry happens once");
    let ready = s.ready_after(crate::ReadyCursor::START, 10).await.unwrap();
    assert_eq!(ready.len(), 1);
    assert_eq!(ready[0].unit.disposition, Disposition::Expired);
    assert_eq!(ready[0].unit.member_ids(), vec![soon.id]);
    // A part arriving after its group expired starts a new group (that also waits).
    let stats = s.stats().await.unwrap();
    assert_eq!(stats.incomplete_groups, 1);
    assert_eq!(stats.records, 2);
}

pub(crate) async fn completes_units_idempotently(f: &dyn Factory) {
    let s = f.pending(limits()).await;
    let a = record("a", "1", "1");
    let p1 = part("a", "2", 3, 2, 1, LONG);
    let p2 = part("a", "2", 3, 2, 2, LONG);
    s.admit(vec![a.clone(), p1.clone(), p2.clone()]).await.unwrap();
    assert_eq!(s.units(&[a.id, p1.id]).await.unwrap().len(), 2);
    s.complete(&[p1.id]).await.unwrap();
    s.complete(&[p1.id]).await.unwrap();
    let left = s.units(&[a.id, p1.id]).await.unwrap();
    assert_eq!(left.len(), 1, "completed units are skipped");
    assert_eq!(left[0].unit.id, a.id);
    let stats = s.stats().await.unwrap();
    assert_eq!(stats.records, 1, "completion removes every part");
    assert_eq!(stats.ready_units, 1);
    s.complete(&[a.id]).await.unwrap();
    assert!(s.ready_after(crate::ReadyCursor::START, 10).await.unwrap().is_empty());
}

pub(crate) async fn pages_ready_units_with_a_cursor(f: &dyn Factory) {
    let s = f.pending(limits()).await;
    let recs: Vec<_> = (0..10).map(|i| record("a", &i.to_string(), "x")).collect();
    s.admit(recs.clone()).await.unwrap();
    let mut cursor = ReadySeq(0);
    let mut seen = Vec::new();
    loop {
        let page = s.ready_after(cursor.into(), 3).await.unwrap();
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 3);
        cursor = page.last().unwrap().seq;
        seen.extend(page.into_iter().map(|u| u.unit.id));
    }
    assert_eq!(seen, recs.iter().map(|r| r.id).collect::<Vec<_>>());
}

pub(crate) async fn reports_stats(f: &dyn Factory) {
    let s = f.pending(limits()).await;
    assert_eq!(s.stats().await.unwrap().oldest_accepted_at, None);
    let a = record("a", "1", "1");
    let mut b = record("a", "2", "2");
    b.registered_delivery = 0;
    s.admit(vec![a.clone(), b]).await.unwrap();
    let st = s.stats().await.unwrap();
    assert_eq!(st.records, 2);
    assert_eq!(st.receipt_requests, 1);
    assert_eq!(st.oldest_accepted_at, Some(a.accepted_at));
    s.complete(&[a.id]).await.unwrap();
    assert_eq!(s.stats().await.unwrap().receipt_requests, 0);
}

pub(crate) async fn commits_admissions_and_completions_together(f: &dyn Factory) {
    let s = f.pending(limits()).await;
    let a = record("a", "1", "1");
    s.admit(vec![a.clone()]).await.unwrap();
    let b = record("a", "2", "2");
    let out = s.commit(vec![b.clone()], &[a.id]).await.unwrap();
    assert_eq!(out, vec![AdmitOutcome::Admitted]);
    let ready = s.ready_after(crate::ReadyCursor::START, 10).await.unwrap();
    assert_eq!(ready.iter().map(|u| u.unit.id).collect::<Vec<_>>(), vec![b.id]);
    assert_eq!(s.stats().await.unwrap().records, 1);
    // Completion only, and nothing at all, are fine too.
    assert!(s.commit(Vec::new(), &[b.id]).await.unwrap().is_empty());
    assert!(s.commit(Vec::new(), &[]).await.unwrap().is_empty());
    assert_eq!(s.stats().await.unwrap().records, 0);
}

/// Capacity is decided after the commit's own completions: a full stage admits as many
/// records as the same commit removes, and no more.
pub(crate) async fn a_commit_admits_into_the_room_its_completions_make(f: &dyn Factory) {
    let s = f
        .pending(PendingLimits {
            max_records: 2,
            ..limits()
        })
        .await;
    let (a, b) = (record("a", "1", "1"), record("a", "2", "2"));
    s.admit(vec![a.clone(), b.clone()]).await.unwrap();
    let (c, d) = (record("a", "3", "3"), record("a", "4", "4"));
    assert_eq!(s.admit(vec![c.clone()]).await.unwrap(), vec![AdmitOutcome::Full]);
    let out = s.commit(vec![c.clone(), d], &[a.id]).await.unwrap();
    assert_eq!(out, vec![AdmitOutcome::Admitted, AdmitOutcome::Full]);
    let ready = s.ready_after(crate::ReadyCursor::START, 10).await.unwrap();
    assert_eq!(ready.iter().map(|u| u.unit.id).collect::<Vec<_>>(), vec![b.id, c.id]);
    assert_eq!(s.stats().await.unwrap().records, 2);
}

/// A record of route priority `priority`.
fn urgent(to: &str, priority: u8) -> PendingRecord {
    let mut r = record("esme1", to, "code 1234");
    r.route_priority = priority;
    r
}

fn ids(ready: &[crate::pending::ReadyUnit]) -> Vec<crate::ids::MessageId> {
    ready.iter().map(|u| u.unit.id).collect()
}

/// Ready units come highest route priority first, in arrival order within one priority;
/// a multipart group takes the lane of the part completing it.
pub(crate) async fn orders_ready_units_by_route_priority_then_arrival(f: &dyn Factory) {
    let s = f.pending(limits()).await;
    let (b1, b2) = (urgent("1", 0), urgent("2", 0));
    let (u1, m1, u2) = (urgent("3", 9), urgent("4", 5), urgent("5", 9));
    s.admit(vec![b1.clone(), b2.clone(), u1.clone()]).await.unwrap();
    s.admit(vec![m1.clone(), u2.clone()]).await.unwrap();
    let ready = s.ready_after(crate::ReadyCursor::START, 10).await.unwrap();
    assert_eq!(ids(&ready), vec![u1.id, u2.id, m1.id, b1.id, b2.id]);
    assert_eq!(
        ready.iter().map(|u| u.seq.lane()).collect::<Vec<_>>(),
        vec![9, 9, 5, 0, 0]
    );
    // A limit takes from the top.
    let top = s.ready_after(crate::ReadyCursor::START, 3).await.unwrap();
    assert_eq!(ids(&top), vec![u1.id, u2.id, m1.id]);

    let mut p1 = part("esme1", "447700900123", 9, 2, 1, LONG);
    let mut p2 = part("esme1", "447700900123", 9, 2, 2, LONG);
    p1.route_priority = 0;
    p2.route_priority = 7;
    s.admit(vec![p1.clone()]).await.unwrap();
    s.admit(vec![p2]).await.unwrap();
    let ready = s.ready_after(crate::ReadyCursor::START, 10).await.unwrap();
    assert_eq!(ids(&ready), vec![u1.id, u2.id, p1.id, m1.id, b1.id, b2.id]);
    assert_eq!(ready[2].seq.lane(), 7, "the completing part's lane");
}

/// Each lane has its own cursor: a unit of a higher priority admitted after selection
/// went far ahead in a lower lane is still found, before the rest of the lower lane.
pub(crate) async fn a_cursor_per_lane_finds_urgent_units_admitted_later(f: &dyn Factory) {
    let s = f.pending(limits()).await;
    let bulk: Vec<PendingRecord> = (0..6).map(|i| urgent(&format!("1{i}"), 0)).collect();
    s.admit(bulk.clone()).await.unwrap();
    let mut cursor = crate::ReadyCursor::START;
    let first = s.ready_after(cursor, 4).await.unwrap();
    assert_eq!(ids(&first), bulk[..4].iter().map(|r| r.id).collect::<Vec<_>>());
    for u in &first {
        cursor.advance(u.seq);
    }
    let otp = urgent("999", 9);
    let more_bulk = urgent("17", 0);
    s.admit(vec![more_bulk.clone(), otp.clone()]).await.unwrap();
    let next = s.ready_after(cursor, 2).await.unwrap();
    assert_eq!(
        ids(&next),
        vec![otp.id, bulk[4].id],
        "the urgent one first, then lane 0 resumes"
    );
    for u in &next {
        cursor.advance(u.seq);
    }
    let rest = s.ready_after(cursor, 10).await.unwrap();
    assert_eq!(ids(&rest), vec![bulk[5].id, more_bulk.id]);
    for u in &rest {
        cursor.advance(u.seq);
    }
    assert!(s.ready_after(cursor, 10).await.unwrap().is_empty());
    // Completing a unit removes it from its lane.
    s.complete(&[otp.id]).await.unwrap();
    let all = s.ready_after(crate::ReadyCursor::START, 10).await.unwrap();
    assert!(!ids(&all).contains(&otp.id));
    assert_eq!(all.len(), 7);
}
