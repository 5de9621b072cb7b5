//! Delivery rounds: due receipts (and inbound messages) are claimed from the store and
//! sent on their way, to SMPP sessions of their account or as HTTP callbacks.

use std::time::Duration;

use sendium_storage::ids::IdMap;
use sendium_storage::{ClaimScope, Delivery, DeliveryContent, DeliveryFinish, DeliveryResult, ReplyPath, Timestamp};

use super::handover::{Completion, Report};
use super::{CLAIM_BATCH, CLAIM_PACE, DlrMsg, DlrState, HTTP_CONCURRENCY, MAX_IN_FLIGHT, deliver, kannel};

impl DlrState {
    /// Coalesce delivery rounds: at most one `DeliverDue` waits in the mailbox. (A send
    /// can fail while this actor is still being installed; then nothing is pending.)
    ///
    /// Rounds are paced: one that follows a partial round by less than [`CLAIM_PACE`]
    /// waits for the rest of it, so under load a claim takes the receipts resolved by
    /// many steps at once instead of one statement (or transaction) per step. After a
    /// full round the next one starts at once.
    pub(super) fn schedule_delivery(&mut self) {
        if self.deliver_scheduled {
            return;
        }
        let wait = match self.last_claim {
            Some((at, false)) => CLAIM_PACE.saturating_sub(at.elapsed()),
            _ => Duration::ZERO,
        };
        if wait.is_zero() {
            self.deliver_scheduled = self.shared.dir.dlr.send(DlrMsg::DeliverDue);
        } else {
            self.deliver_scheduled = true;
            let shared = self.shared.clone();
            crate::pacing::send_after(wait, move || {
                // Without a correlator right now, its successor runs a round at start.
                let _ = shared.dir.dlr.send(DlrMsg::DeliverDue);
            });
        }
    }

    /// When to try a receipt again whose account has no receiver bound here: alone,
    /// hold it until the account binds (the bind wakes it), within retention; with
    /// several processes on the store, it is due again at once for the process the
    /// account is bound to (only that one claims it).
    pub(super) fn no_session_until(&self, d: &Delivery) -> Timestamp {
        if self.shared.partitions.is_some() {
            Timestamp::now()
        } else {
            d.expires_at
        }
    }

    pub(super) async fn deliver_due(&mut self) {
        self.deliver_scheduled = false;
        // Steps being written may still claim what they create: their share counts.
        let busy = self.in_flight + self.claimed_by_writes;
        if busy >= MAX_IN_FLIGHT {
            return;
        }
        let limit = CLAIM_BATCH.min(MAX_IN_FLIGHT - busy);
        let claimed_at = std::time::Instant::now();
        // With several processes on the store, each claims the SMPP receipts of the
        // accounts bound to it (and any HTTP receipt).
        let bound = self
            .shared
            .partitions
            .as_ref()
            .map(|_| self.shared.sessions.receiving_accounts());
        let scope = bound.as_deref().map_or(ClaimScope::All, ClaimScope::SmppAccounts);
        let claimed = match self.store.claim_due(Timestamp::now(), self.lease, limit, scope).await {
            Ok(c) => {
                self.shared.health.dlr.ok();
                self.last_claim = Some((std::time::Instant::now(), c.len() == limit));
                c
            }
            Err(e) => {
                self.shared.health.dlr.failed("dlr", &e);
                return;
            }
        };
        let full = claimed.len() == limit;
        self.dispatch(claimed, claimed_at);
        if full {
            self.schedule_delivery();
        }
    }

    /// Send claimed deliveries on their way (SMPP sessions of the account, or HTTP);
    /// each result comes back as [`DlrMsg::Delivered`]. `claimed_at`: no later than
    /// the start of their claims' lease.
    pub(super) fn dispatch(&mut self, claimed: Vec<Delivery>, claimed_at: std::time::Instant) {
        if claimed.is_empty() {
            return;
        }
        let claims = claimed.len();
        self.in_flight += claims;
        // By account: names from the configuration.
        let mut smpp: IdMap<String, Vec<Delivery>> = IdMap::default();
        let mut http = Vec::new();
        let mut parked = Vec::new();
        for d in claimed {
            if let DeliveryContent::Inbound(m) = &d.content {
                self.inbound_in_flight.insert(d.id, m.route.clone());
            }
            if matches!(d.content, DeliveryContent::Progress(_)) && !matches!(d.target.reply, ReplyPath::Kannel { .. })
            {
                // Only a Kannel dlr-url is owed progress reports; no store creates others.
                parked.push(DeliveryFinish {
                    id: d.id,
                    attempt: d.attempt,
                    result: DeliveryResult::Delivered,
                });
                continue;
            }
            match &d.target.reply {
                ReplyPath::Smpp => {
                    if self.shared.sessions.receivers(&d.target.account) == 0 {
                        parked.push(DeliveryFinish {
                            id: d.id,
                            attempt: d.attempt,
                            result: DeliveryResult::Retry {
                                at: self.no_session_until(&d),
                            },
                        });
                    } else if let Some(batch) = smpp.get_mut(&d.target.account) {
                        batch.push(d);
                    } else {
                        // Sized for the whole claim when it is the first account (most
                        // claims are one account's), so its batch does not grow step by step.
                        let mut batch = Vec::with_capacity(if smpp.is_empty() { claims } else { 1 });
                        let account = d.target.account.clone();
                        batch.push(d);
                        smpp.insert(account, batch);
                    }
                }
                ReplyPath::Http { .. } | ReplyPath::Kannel { .. } => {
                    if http.is_empty() {
                        http.reserve(claims);
                    }
                    http.push(d)
                }
            }
        }
        if !parked.is_empty() {
            self.in_flight -= parked.len();
            self.queue_finishes(parked);
        }
        let incarnation = self.incarnation;
        for (account, deliveries) in smpp {
            let shared = self.shared.clone();
            let handover = self.handover.clone();
            tokio::spawn(async move {
                let shared_store = shared.partitions.is_some();
                let results = deliver::smpp(&shared.sessions, &account, &deliveries, shared_store).await;
                let done = Completion::Delivered { incarnation, results };
                shared.dir.dlr.send(DlrMsg::Completed(Report::new(done, &handover)));
            });
        }
        if !http.is_empty() {
            let shared = self.shared.clone();
            let client = self.http.clone();
            let inbound_client = self.http_inbound.clone();
            let slots = self.http_slots.clone();
            let handover = self.handover.clone();
            // A callback may start only while its claim has time left for a whole attempt:
            // a round of many slow endpoints can outlast the lease, and a lapsed claim may
            // already be another round's (a second, concurrent delivery). Those go back
            // unattempted, due at once, and the next round claims them afresh.
            let last_start = claimed_at + self.lease.saturating_sub(self.callback_timeout);
            tokio::spawn(async move {
                use futures::StreamExt;
                let mut results = futures::stream::iter(http)
                    .map(|d| {
                        let client = match d.content {
                            DeliveryContent::Inbound(_) => inbound_client.clone(),
                            DeliveryContent::Receipt(_) | DeliveryContent::Progress(_) => client.clone(),
                        };
                        let slots = slots.clone();
                        async move {
                            // At most HTTP_CONCURRENCY callbacks at once, across rounds.
                            let _slot = slots.acquire_owned().await;
                            if std::time::Instant::now() > last_start {
                                return DeliveryFinish {
                                    id: d.id,
                                    attempt: d.attempt,
                                    result: DeliveryResult::Retry { at: Timestamp::now() },
                                };
                            }
                            match &d.target.reply {
                                ReplyPath::Kannel { url, mask } => kannel::receipt(&client, url, *mask, &d).await,
                                other => deliver::http(&client, other.url().unwrap_or_default(), &d).await,
                            }
                        }
                    })
                    .buffer_unordered(HTTP_CONCURRENCY)
                    // Results are recorded as they come, not when the slowest is done.
                    .ready_chunks(HTTP_CONCURRENCY);
                while let Some(results) = results.next().await {
                    let done = Completion::Delivered { incarnation, results };
                    shared.dir.dlr.send(DlrMsg::Completed(Report::new(done, &handover)));
                }
            });
        }
    }

    pub(super) async fn wake_bound_accounts(&mut self) {
        let mut accounts: Vec<String> = self.shared.sessions.sessions().into_iter().map(|s| s.account).collect();
        accounts.sort();
        accounts.dedup();
        for account in accounts {
            if self.shared.sessions.receivers(&account) == 0 {
                continue;
            }
            match self.store.wake_account(&account, Timestamp::now()).await {
                Ok(n) if n > 0 => self.schedule_delivery(),
                Ok(_) => {}
                Err(e) => self.shared.health.dlr.failed("dlr", &e),
            }
        }
    }
}
