//! Where each actor currently lives.
//!
//! Actors never hold each other's `ActorRef` directly: after a restart the supervisor
//! installs the new one here, so every later send reaches the new incarnation. Each
//! [`Mailbox`] also counts messages sent but not yet handled — ractor does not expose
//! mailbox depth, and `/admin/actors` must show it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use parking_lot::RwLock;
use ractor::rpc::CallResult;
use ractor::{ActorRef, RpcReplyPort};

use crate::destination_worker::WorkerMsg;
use crate::dlr_correlator::DlrMsg;
use crate::ingress::IngressMsg;
use crate::router::RouterMsg;
use crate::selector::SelectorMsg;

/// Why a request to an actor got no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    #[error("the actor is not running")]
    NotRunning,
    #[error("the actor did not answer in time")]
    Timeout,
    #[error("the actor stopped before answering")]
    Dropped,
}

/// The address of one actor, valid across its restarts.
pub struct Mailbox<M: Send + 'static> {
    actor: RwLock<Option<ActorRef<M>>>,
    depth: AtomicI64,
}

impl<M: Send + 'static> Default for Mailbox<M> {
    fn default() -> Self {
        Self {
            actor: RwLock::new(None),
            depth: AtomicI64::new(0),
        }
    }
}

impl<M: Send + 'static> Mailbox<M> {
    /// Install a (re)started actor. Messages counted for the previous one died with it.
    pub fn install(&self, actor: ActorRef<M>) {
        *self.actor.write() = Some(actor);
        self.depth.store(0, Ordering::Relaxed);
    }

    pub fn clear(&self) {
        *self.actor.write() = None;
    }

    pub fn actor(&self) -> Option<ActorRef<M>> {
        self.actor.read().clone()
    }

    /// Send without waiting. `false` when the actor is not running (the message is lost,
    /// which every sender tolerates: reconciliation repeats what mattered).
    pub fn send(&self, msg: M) -> bool {
        let guard = self.actor.read();
        let Some(actor) = guard.as_ref() else {
            return false;
        };
        self.depth.fetch_add(1, Ordering::Relaxed);
        if actor.cast(msg).is_ok() {
            true
        } else {
            self.depth.fetch_sub(1, Ordering::Relaxed);
            false
        }
    }

    /// Ask and wait for an answer.
    pub async fn call<R: Send + 'static>(
        &self,
        build: impl FnOnce(RpcReplyPort<R>) -> M,
        timeout: Duration,
    ) -> Result<R, CallError> {
        let actor = self.actor().ok_or(CallError::NotRunning)?;
        self.depth.fetch_add(1, Ordering::Relaxed);
        match actor.call(build, Some(timeout)).await {
            Ok(CallResult::Success(r)) => Ok(r),
            Ok(CallResult::Timeout) => Err(CallError::Timeout),
            Ok(CallResult::SenderError) => Err(CallError::Dropped),
            Err(_) => {
                self.depth.fetch_sub(1, Ordering::Relaxed);
                Err(CallError::NotRunning)
            }
        }
    }

    /// The receiving actor took one message out of its mailbox.
    pub fn took_one(&self) {
        self.depth.fetch_sub(1, Ordering::Relaxed);
    }

    /// Messages sent and not yet handled.
    pub fn depth(&self) -> u64 {
        u64::try_from(self.depth.load(Ordering::Relaxed)).unwrap_or(0)
    }
}

/// Every actor of the gateway.
pub struct Directory {
    pub ingress: Mailbox<IngressMsg>,
    pub selector: Mailbox<SelectorMsg>,
    pub router: Mailbox<RouterMsg>,
    pub dlr: Mailbox<DlrMsg>,
    /// One per configured destination. A reload adds and removes destinations; a
    /// changed destination keeps its mailbox while its worker is replaced.
    workers: RwLock<HashMap<String, Arc<Mailbox<WorkerMsg>>>>,
}

impl Directory {
    pub fn new(destinations: impl IntoIterator<Item = String>) -> Self {
        Self {
            ingress: Mailbox::default(),
            selector: Mailbox::default(),
            router: Mailbox::default(),
            dlr: Mailbox::default(),
            workers: RwLock::new(
                destinations
                    .into_iter()
                    .map(|d| (d, Arc::new(Mailbox::default())))
                    .collect(),
            ),
        }
    }

    pub fn worker(&self, name: &str) -> Option<Arc<Mailbox<WorkerMsg>>> {
        self.workers.read().get(name).cloned()
    }

    /// Every destination worker's mailbox, by name, sorted.
    pub fn workers(&self) -> Vec<(String, Arc<Mailbox<WorkerMsg>>)> {
        let mut all: Vec<_> = self
            .workers
            .read()
            .iter()
            .map(|(n, m)| (n.clone(), m.clone()))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// Send to every destination worker.
    pub fn send_workers(&self, msg: impl Fn() -> WorkerMsg) {
        for mb in self.workers.read().values() {
            mb.send(msg());
        }
    }

    /// A destination added by a reload (its mailbox, before its worker starts).
    pub fn add_worker(&self, name: &str) -> Arc<Mailbox<WorkerMsg>> {
        self.workers.write().entry(name.to_string()).or_default().clone()
    }

    /// A destination removed by a reload, once its worker stopped.
    pub fn remove_worker(&self, name: &str) {
        self.workers.write().remove(name);
    }
}
