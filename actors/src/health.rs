//! Readiness: the gateway is ready when every selected store is open and healthy and
//! startup reconciliation has finished. A failing store write flips its stage to
//! unhealthy (admission then refuses, `/readyz` says 503) until a later write succeeds.

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

/// One stage's health.
#[derive(Default)]
pub struct StageHealth {
    failing: AtomicBool,
    last_error: Mutex<Option<String>>,
}

impl StageHealth {
    pub fn ok(&self) {
        if self.failing.swap(false, Ordering::AcqRel) {
            tracing::info!("storage stage recovered");
        }
    }

    pub fn failed(&self, stage: &str, error: &dyn std::fmt::Display) {
        let text = error.to_string();
        if !self.failing.swap(true, Ordering::AcqRel) {
            tracing::error!(stage, error = %text, "storage stage failing: refusing work until it recovers");
        }
        *self.last_error.lock() = Some(text);
    }

    pub fn is_failing(&self) -> bool {
        self.failing.load(Ordering::Acquire)
    }

    pub fn last_error(&self) -> Option<String> {
        self.is_failing().then(|| self.last_error.lock().clone()).flatten()
    }
}

/// Health of the whole gateway.
#[derive(Default)]
pub struct Health {
    pub pending: StageHealth,
    pub router_queue: StageHealth,
    pub routed_work: StageHealth,
    pub dlr: StageHealth,
    reconciled_router: AtomicBool,
    reconciled_selector: AtomicBool,
}

impl Health {
    pub fn set_router_reconciled(&self) {
        self.reconciled_router.store(true, Ordering::Release);
    }

    pub fn set_selector_reconciled(&self) {
        self.reconciled_selector.store(true, Ordering::Release);
    }

    pub fn reconciled(&self) -> bool {
        self.reconciled_router.load(Ordering::Acquire) && self.reconciled_selector.load(Ordering::Acquire)
    }

    /// Why the gateway is not ready, if it is not.
    pub fn not_ready_reasons(&self) -> Vec<String> {
        let mut reasons = Vec::new();
        if !self.reconciled() {
            reasons.push("startup reconciliation has not finished".to_string());
        }
        for (stage, h) in [
            ("pending", &self.pending),
            ("router-queue", &self.router_queue),
            ("routed-work", &self.routed_work),
            ("dlr", &self.dlr),
        ] {
            if let Some(e) = h.last_error() {
                reasons.push(format!("{stage}: {e}"));
            }
        }
        reasons
    }
}
