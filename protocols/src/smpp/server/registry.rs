//! The bound sessions, by account, and the deliver_sm path from the pipeline to them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::RwLock;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::metrics::DELIVERS;
use super::{DeliverOutcome, OutboundDeliver, SessionInfo};
use crate::smpp::IdMap;
use crate::smpp::build::BindKind;

/// Deliver requests a session's channel holds before [`SessionRegistry::deliver`] waits.
pub(super) const DELIVER_QUEUE: usize = 64;

/// Some deliver_sm for one session, and where their outcomes go.
pub(super) struct DeliverChunk {
    pub(super) items: Vec<OutboundDeliver>,
    pub(super) reply: ChunkReply,
}

/// Collects one outcome per item of a chunk and sends them once all are known.
///
/// Dropping it (the session closed, or the chunk never reached it) settles every item
/// still open as [`DeliverOutcome::Disconnected`], so a caller never waits for a session
/// that is gone.
pub(super) struct ChunkReply {
    outcomes: Vec<Option<DeliverOutcome>>,
    open: usize,
    tx: Option<oneshot::Sender<Vec<DeliverOutcome>>>,
}

impl ChunkReply {
    fn new(len: usize) -> (ChunkReply, oneshot::Receiver<Vec<DeliverOutcome>>) {
        let (tx, rx) = oneshot::channel();
        let reply = ChunkReply {
            outcomes: vec![None; len],
            open: len,
            tx: Some(tx),
        };
        (reply, rx)
    }

    /// Settles item `index` (the first outcome wins). True when the chunk is complete.
    pub(super) fn settle(&mut self, index: usize, outcome: DeliverOutcome) -> bool {
        if let Some(slot @ None) = self.outcomes.get_mut(index) {
            *slot = Some(outcome);
            self.open -= 1;
        }
        if self.open == 0 {
            self.send();
            return true;
        }
        false
    }

    fn send(&mut self) {
        if let Some(tx) = self.tx.take() {
            let outcomes = self
                .outcomes
                .iter()
                .map(|outcome| outcome.unwrap_or(DeliverOutcome::Disconnected))
                .collect();
            let _ = tx.send(outcomes);
        }
    }
}

impl Drop for ChunkReply {
    fn drop(&mut self) {
        self.send();
    }
}

pub(super) struct Entry {
    pub(super) id: u64,
    pub(super) kind: BindKind,
    pub(super) peer: SocketAddr,
    /// Receiver/transceiver sessions only.
    pub(super) tx: Option<mpsc::Sender<DeliverChunk>>,
    /// How long `deliver` waits for room in the session's queue.
    pub(super) send_timeout: Duration,
    /// Unbinds and closes the session.
    pub(super) close: CancellationToken,
}

#[derive(Default)]
struct AccountSessions {
    sessions: Vec<Entry>,
    cursor: AtomicUsize,
}

#[derive(Default)]
struct Inner {
    accounts: RwLock<IdMap<Arc<str>, AccountSessions>>,
}

/// The bound sessions, by account: how receipts reach ESMEs.
///
/// Cheap to clone (one `Arc`); every clone sees the same sessions. Sessions register when
/// their bind succeeds and leave when they start closing.
#[derive(Clone, Default)]
pub struct SessionRegistry {
    inner: Arc<Inner>,
}

/// A session's place in the registry; leaving it when dropped.
pub(super) struct Registration {
    registry: SessionRegistry,
    account: Arc<str>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut accounts = self.registry.inner.accounts.write();
        if let Some(sessions) = accounts.get_mut(&self.account) {
            sessions.sessions.retain(|entry| entry.id != self.id);
            if sessions.sessions.is_empty() {
                accounts.remove(&self.account);
            }
        }
    }
}

pub(super) fn bind_name(kind: BindKind) -> &'static str {
    match kind {
        BindKind::Transmitter => "transmitter",
        BindKind::Receiver => "receiver",
        BindKind::Transceiver => "transceiver",
    }
}

impl SessionRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a bound session (`entry.tx`: its deliver queue, receiver/transceiver only).
    pub(super) fn register(&self, account: &Arc<str>, entry: Entry) -> Registration {
        let id = entry.id;
        self.inner
            .accounts
            .write()
            .entry(account.clone())
            .or_default()
            .sessions
            .push(entry);
        Registration {
            registry: self.clone(),
            account: account.clone(),
            id,
        }
    }

    /// Unbind and close every session of `account` (a reload removed it); how many.
    pub fn close_account(&self, account: &str) -> usize {
        let accounts = self.inner.accounts.read();
        let Some(sessions) = accounts.get(account) else {
            return 0;
        };
        for entry in &sessions.sessions {
            entry.close.cancel();
        }
        sessions.sessions.len()
    }

    /// Send these deliver_sm over bound receiver/transceiver sessions of `account`
    /// (spread over them) and wait for each deliver_sm_resp; one outcome per item, in
    /// order.
    ///
    /// Items are dealt round robin over the sessions (a cursor per account, so that
    /// successive one-item calls alternate too); each session gets its share as one
    /// request and writes it with one write. No session → every item is
    /// [`DeliverOutcome::NoSession`]; a session whose queue stays full for the deliver
    /// timeout → [`DeliverOutcome::Timeout`] for its share; a session that closes before
    /// answering → [`DeliverOutcome::Disconnected`].
    pub async fn deliver(&self, account: &str, batch: Vec<OutboundDeliver>) -> Vec<DeliverOutcome> {
        let len = batch.len();
        if len == 0 {
            return Vec::new();
        }
        let (targets, start) = {
            let accounts = self.inner.accounts.read();
            match accounts.get(account) {
                None => (Vec::new(), 0),
                Some(sessions) => {
                    let targets: Vec<_> = sessions
                        .sessions
                        .iter()
                        .filter_map(|entry| entry.tx.clone().map(|tx| (tx, entry.send_timeout)))
                        .collect();
                    (targets, sessions.cursor.fetch_add(len, Ordering::Relaxed))
                }
            }
        };
        if targets.is_empty() {
            metrics::counter!(DELIVERS, "outcome" => "no_session").increment(len as u64);
            return vec![DeliverOutcome::NoSession; len];
        }

        // Deal the items: item i joins share i % used, share k goes to target (start + k) % n.
        let n = targets.len();
        let mut shares: Vec<(Vec<usize>, Vec<OutboundDeliver>)> =
            (0..n.min(len)).map(|_| (Vec::new(), Vec::new())).collect();
        let used = shares.len();
        for (i, item) in batch.into_iter().enumerate() {
            let share = i % used;
            if let Some((positions, items)) = shares.get_mut(share) {
                positions.push(i);
                items.push(item);
            }
        }

        let offset = start % n;
        let sends = shares.into_iter().enumerate().map(|(k, (positions, items))| {
            let target = targets.get((offset + k) % n).cloned();
            async move {
                let count = items.len();
                let outcomes = match target {
                    None => vec![DeliverOutcome::Disconnected; count],
                    Some((tx, send_timeout)) => send_share(tx, send_timeout, items).await,
                };
                (positions, outcomes)
            }
        });
        let results = futures::future::join_all(sends).await;

        let mut outcomes = vec![DeliverOutcome::Disconnected; len];
        for (positions, share) in results {
            for (position, outcome) in positions.into_iter().zip(share) {
                if let Some(slot) = outcomes.get_mut(position) {
                    *slot = outcome;
                }
            }
        }
        count_outcomes(&outcomes);
        outcomes
    }

    /// Bound receiver/transceiver sessions of `account`.
    pub fn receivers(&self, account: &str) -> usize {
        self.inner.accounts.read().get(account).map_or(0, |sessions| {
            sessions
                .sessions
                .iter()
                .filter(|entry| entry.kind.can_receive())
                .count()
        })
    }

    /// Accounts with at least one bound receiver/transceiver session, sorted.
    pub fn receiving_accounts(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .inner
            .accounts
            .read()
            .iter()
            .filter(|(_, sessions)| sessions.sessions.iter().any(|entry| entry.kind.can_receive()))
            .map(|(account, _)| account.to_string())
            .collect();
        out.sort_unstable();
        out
    }

    /// Every bound session (all bind kinds), for the admin view.
    pub fn sessions(&self) -> Vec<SessionInfo> {
        let accounts = self.inner.accounts.read();
        let mut out: Vec<SessionInfo> = accounts
            .iter()
            .flat_map(|(account, sessions)| {
                sessions.sessions.iter().map(move |entry| SessionInfo {
                    account: account.to_string(),
                    bind: bind_name(entry.kind),
                    peer: entry.peer,
                })
            })
            .collect();
        out.sort_by(|a, b| a.account.cmp(&b.account).then(a.peer.cmp(&b.peer)));
        out
    }
}

async fn send_share(
    tx: mpsc::Sender<DeliverChunk>,
    send_timeout: Duration,
    items: Vec<OutboundDeliver>,
) -> Vec<DeliverOutcome> {
    let count = items.len();
    match tokio::time::timeout(send_timeout, tx.reserve()).await {
        Err(_) => vec![DeliverOutcome::Timeout; count],
        Ok(Err(_closed)) => vec![DeliverOutcome::Disconnected; count],
        Ok(Ok(permit)) => {
            let (reply, rx) = ChunkReply::new(count);
            permit.send(DeliverChunk { items, reply });
            rx.await.unwrap_or_else(|_| vec![DeliverOutcome::Disconnected; count])
        }
    }
}

fn count_outcomes(outcomes: &[DeliverOutcome]) {
    let mut counts = [0u64; 5];
    for outcome in outcomes {
        let index = match outcome {
            DeliverOutcome::Acked => 0,
            DeliverOutcome::Refused(_) => 1,
            DeliverOutcome::NoSession => 2,
            DeliverOutcome::Timeout => 3,
            DeliverOutcome::Disconnected => 4,
        };
        if let Some(count) = counts.get_mut(index) {
            *count += 1;
        }
    }
    for (count, label) in counts
        .into_iter()
        .zip(["acked", "refused", "no_session", "timeout", "disconnected"])
    {
        if count > 0 {
            metrics::counter!(DELIVERS, "outcome" => label).increment(count);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_reply_settles_once_and_fills_on_drop() {
        let (mut reply, mut rx) = ChunkReply::new(3);
        assert!(!reply.settle(1, DeliverOutcome::Acked));
        assert!(!reply.settle(1, DeliverOutcome::Timeout), "first outcome wins");
        assert!(rx.try_recv().is_err());
        drop(reply);
        assert_eq!(
            rx.try_recv().unwrap(),
            vec![
                DeliverOutcome::Disconnected,
                DeliverOutcome::Acked,
                DeliverOutcome::Disconnected
            ]
        );

        let (mut reply, mut rx) = ChunkReply::new(2);
        assert!(!reply.settle(0, DeliverOutcome::Refused(0x45)));
        assert!(reply.settle(1, DeliverOutcome::Acked));
        drop(reply);
        assert_eq!(
            rx.try_recv().unwrap(),
            vec![DeliverOutcome::Refused(0x45), DeliverOutcome::Acked]
        );
    }

    #[test]
    fn registrations_come_and_go() {
        let registry = SessionRegistry::new();
        let account: Arc<str> = Arc::from("esme1");
        let peer: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let (tx, _rx) = mpsc::channel(1);
        let (close_a, close_b) = (CancellationToken::new(), CancellationToken::new());
        let entry = |id, kind, tx, close: &CancellationToken| Entry {
            id,
            kind,
            peer,
            tx,
            send_timeout: Duration::from_secs(1),
            close: close.clone(),
        };
        let a = registry.register(&account, entry(1, BindKind::Transceiver, Some(tx), &close_a));
        let b = registry.register(&account, entry(2, BindKind::Transmitter, None, &close_b));
        assert_eq!(registry.receivers("esme1"), 1);
        assert_eq!(registry.receivers("other"), 0);
        let binds: Vec<_> = registry.sessions().into_iter().map(|s| s.bind).collect();
        assert_eq!(binds.len(), 2);
        assert!(binds.contains(&"transceiver") && binds.contains(&"transmitter"));
        assert_eq!(registry.close_account("other"), 0);
        assert_eq!(registry.close_account("esme1"), 2);
        assert!(
            close_a.is_cancelled() && close_b.is_cancelled(),
            "both sessions told to close"
        );
        drop(a);
        assert_eq!(registry.receivers("esme1"), 0);
        assert_eq!(registry.sessions().len(), 1);
        drop(b);
        assert!(registry.sessions().is_empty());
    }

    #[tokio::test]
    async fn deliver_without_sessions_is_no_session() {
        let registry = SessionRegistry::new();
        let item = OutboundDeliver {
            source: crate::smpp::SmppAddress::new(1, 1, "1"),
            destination: crate::smpp::SmppAddress::new(1, 1, "2"),
            esm_class: 4,
            data_coding: 0,
            short_message: Vec::new(),
            receipted_message_id: None,
            message_state: None,
        };
        assert_eq!(
            registry.deliver("esme1", vec![item.clone(), item]).await,
            vec![DeliverOutcome::NoSession; 2]
        );
        assert!(registry.deliver("esme1", Vec::new()).await.is_empty());
    }
}
