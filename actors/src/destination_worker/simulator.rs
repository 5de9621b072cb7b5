//! The built-in simulated destination (`kind = "simulator"`).
//!
//! It behaves like a well-mannered SMSC without a socket: every part is accepted at
//! once with a fresh provider id, and when a receipt was requested a DELIVRD receipt for
//! each part follows after `dlr-delay-ms` — through the same correlation path real
//! receipts take. It exists so a newcomer sees a message go through and its receipt come
//! back with no provider at all.

use std::sync::Arc;
use std::time::Duration;

use sendium_protocols::receipt::{IdFormat, resp_key};
use sendium_protocols::smpp::client::OutboundSubmit;
use sendium_storage::{DlrState, ProviderReceipt, ReceiptOutcome, Timestamp};

use super::BranchJob;
use crate::context::Shared;
use crate::dlr_correlator::ReceiptBatch;
use crate::router::WorkerResult;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimulatorConfig {
    pub dlr_delay: Duration,
}

#[derive(Default)]
pub struct SimState {
    counter: u64,
    due: Vec<ProviderReceipt>,
    delay: Duration,
}

impl SimState {
    pub fn accept(
        &mut self,
        cfg: &SimulatorConfig,
        job: &BranchJob,
        parts: &[OutboundSubmit],
        fmt: IdFormat,
    ) -> WorkerResult {
        self.delay = cfg.dlr_delay;
        let mut provider_ids = Vec::with_capacity(parts.len());
        let mut keys = Vec::with_capacity(parts.len());
        for _ in parts {
            self.counter += 1;
            let id = format!("{:010X}", self.counter);
            let key = resp_key(fmt, &id);
            if job.request_receipt {
                self.due.push(ProviderReceipt {
                    destination: String::new(),
                    keys: vec![key.clone()],
                    outcome: ReceiptOutcome {
                        state: DlrState::Delivered,
                        error: "000".into(),
                        done_at: Timestamp::now().saturating_add(cfg.dlr_delay),
                    },
                });
            }
            provider_ids.push(id);
            keys.push(key);
        }
        WorkerResult::Submitted { provider_ids, keys }
    }

    /// Send this turn's receipts after the configured delay, as one batch.
    pub fn flush(&mut self, shared: &Arc<Shared>, name: &str) {
        if self.due.is_empty() {
            return;
        }
        let mut receipts = std::mem::take(&mut self.due);
        for r in &mut receipts {
            r.destination = name.to_string();
        }
        let shared = shared.clone();
        let delay = self.delay;
        let destination = name.to_string();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = shared.send_receipts(ReceiptBatch {
                destination,
                receipts,
                acks: None,
            });
        });
    }
}
