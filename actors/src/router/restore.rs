//! Rebuilding the projection after a restart, reconciling with a peer that restarted,
//! and the periodic re-sends that repair messages lost meanwhile.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use ractor::ActorProcessingErr;
use sendium_storage::{Handoff, Unit, UnitId};

use super::placement::Occasion;
use super::{BranchKey, CALL_TIMEOUT, COMPLETION_RESEND, HANDOFF_RESEND, Peer, RouterState};
use crate::ingress::IngressMsg;
use crate::selector::SelectorMsg;

impl RouterState {
    pub(super) fn reconcile(&mut self, peer: Peer) {
        tracing::info!(?peer, "reconciling after a restart");
        match peer {
            Peer::Worker(name) => {
                self.worker_started(&name);
                if let Some(dest) = self.dests.get_mut(&name) {
                    dest.assigned = 0;
                    dest.queue.clear();
                }
                let keys: Vec<BranchKey> = self
                    .units
                    .iter()
                    .flat_map(|(id, t)| {
                        t.dispatched
                            .iter()
                            .filter(|(_, d)| d.as_ref() == name)
                            .map(|(b, _)| BranchKey { unit: *id, branch: b })
                            .collect::<Vec<_>>()
                    })
                    .collect();
                for key in keys {
                    if let Some(t) = self.units.get_mut(&key.unit) {
                        t.clear_dispatched(key.branch);
                    }
                    self.place(key, Occasion::Fresh);
                }
            }
            Peer::DlrCorrelator => {
                let all: Vec<Handoff> = self
                    .units
                    .values()
                    .flat_map(|t| {
                        t.awaiting_handoff
                            .iter()
                            .map(|(b, (o, k, _))| Self::handoff(t, b, o, k))
                            .collect::<Vec<_>>()
                    })
                    .collect();
                self.handoffs.extend(all);
            }
            Peer::Ingress => {
                let ids: Vec<UnitId> = self
                    .units
                    .iter()
                    .filter(|(_, t)| t.completion_sent)
                    .map(|(id, _)| *id)
                    .collect();
                if !ids.is_empty() {
                    self.shared.dir.ingress.send(IngressMsg::Complete(ids));
                }
            }
            Peer::Selector => {
                self.shared.dir.selector.send(SelectorMsg::Reconcile {
                    free: self.free(),
                    exclude: Vec::new(),
                });
            }
        }
    }

    pub(super) async fn tick(&mut self) {
        self.sync_partitions().await;
        let record = std::mem::take(&mut self.retry_record);
        self.to_record.extend(record);
        self.start_write();
        let done = std::mem::take(&mut self.retry_done);
        self.done.extend(done);
        let remove = std::mem::take(&mut self.retry_remove);
        self.to_remove.extend(remove);
        let moves = std::mem::take(&mut self.retry_move);
        self.to_move.extend(moves);
        self.start_write();
        self.place_waiting(None);
        let retry: Vec<BranchKey> = std::mem::take(&mut self.retry_handoff);
        let now = Instant::now();
        let mut resend = Vec::new();
        for t in self.units.values_mut() {
            let mut due = Vec::new();
            for (branch, (_, _, sent)) in t.awaiting_handoff.iter_mut() {
                let key = BranchKey {
                    unit: t.unit.id,
                    branch,
                };
                if retry.contains(&key) || now.duration_since(*sent) > HANDOFF_RESEND {
                    *sent = now;
                    due.push(branch);
                }
            }
            for b in due {
                if let Some((o, k, _)) = t.awaiting_handoff.get(b) {
                    resend.push(Self::handoff(t, b, o, k));
                }
            }
        }
        self.handoffs.extend(resend);
        // Source completions whose answer never came (lost while Ingress or this actor
        // restarted): ask again; completion is idempotent.
        let again: Vec<UnitId> = self
            .units
            .values_mut()
            .filter(|t| {
                t.completion_asked
                    .is_some_and(|at| now.duration_since(at) > COMPLETION_RESEND)
            })
            .map(|t| {
                t.completion_asked = Some(now);
                t.unit.id
            })
            .collect();
        if !again.is_empty() {
            self.shared.dir.ingress.send(IngressMsg::Complete(again));
        }
        let names: Vec<String> = self.dests.keys().cloned().collect();
        for n in names {
            self.pump(&n);
        }
    }

    /// Rebuild the projection from routed-work and the pending stage (startup, restart,
    /// and partitions taken over); units already in it are kept as they are. Units
    /// whose sources are gone were completed: forget them.
    pub(super) async fn restore(&mut self) -> Result<(), ActorProcessingErr> {
        let mut after = None;
        let mut restored = 0u64;
        loop {
            let page = self.store.load_after(after, 1_000).await?;
            let Some(last) = page.last().map(|u| u.id) else {
                break;
            };
            after = Some(last);
            let ids: Vec<UnitId> = page.iter().map(|u| u.id).collect();
            let units = self
                .shared
                .dir
                .ingress
                .call(|reply| IngressMsg::Units { ids, reply }, CALL_TIMEOUT)
                .await
                .map_err(|e| format!("restoring routed work: {e}"))??;
            let mut by_id: HashMap<UnitId, Unit> = units.into_iter().map(|u| (u.unit.id, u.unit)).collect();
            let mut gone = Vec::new();
            for routed in page {
                if self.units.contains_key(&routed.id) {
                    continue;
                }
                match by_id.remove(&routed.id) {
                    Some(unit) if !self.takes(self.partition(&unit)) => {}
                    Some(unit) => {
                        restored += 1;
                        self.track(Arc::new(unit), routed);
                    }
                    None => gone.push(routed.id),
                }
            }
            if !gone.is_empty() {
                let forget = sendium_storage::RoutedWrite {
                    remove: gone,
                    ..Default::default()
                };
                self.store.apply(forget).await?;
            }
        }
        if restored > 0 {
            tracing::info!(units = restored, "restored routed work");
            metrics::counter!("sendium_routed_restored_total").increment(restored);
        }
        Ok(())
    }
}
