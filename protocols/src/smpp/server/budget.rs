//! The budget of connections that have not bound yet.
//!
//! A connection that never binds costs a socket and a task, and before this budget
//! existed such connections took the same slots bound sessions need: 1,100 idle
//! connections locked every ESME out. Unbound connections now have a budget of their
//! own, in total (`max-unbound`) and per source address (`max-unbound-per-address`):
//! a connection beyond its address's share is closed at once; one that finds the total
//! budget full closes the *oldest* unbound connection to make room — a legitimate ESME
//! binds within milliseconds of connecting, so an attacker cannot keep it out without
//! opening connections faster than it binds. Bound sessions are counted separately
//! (`max-connections`), taken at bind time.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

/// Gauge of unbound connections.
pub(super) const UNBOUND: &str = "sendium_smpp_unbound_connections";

pub(super) struct UnboundBudget {
    max_total: usize,
    max_per_address: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    per_address: HashMap<IpAddr, usize>,
    /// By connection number, so the first is the oldest.
    open: BTreeMap<u64, (IpAddr, CancellationToken)>,
    next: u64,
}

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct TooManyFromAddress;

impl UnboundBudget {
    pub(super) fn new(max_total: usize, max_per_address: usize) -> Arc<Self> {
        Arc::new(UnboundBudget {
            max_total: max_total.max(1),
            max_per_address: max_per_address.max(1),
            inner: Mutex::new(Inner::default()),
        })
    }

    /// Admit a new connection from `ip`, closed through `close` if it is evicted.
    pub(super) fn admit(
        self: &Arc<Self>,
        ip: IpAddr,
        close: CancellationToken,
    ) -> Result<UnboundTicket, TooManyFromAddress> {
        let mut inner = self.inner.lock();
        if inner.per_address.get(&ip).copied().unwrap_or(0) >= self.max_per_address {
            return Err(TooManyFromAddress);
        }
        if inner.open.len() >= self.max_total
            && let Some((_, (old_ip, token))) = inner.open.pop_first()
        {
            token.cancel();
            decrement(&mut inner.per_address, old_ip);
            ::metrics::counter!("sendium_smpp_unbound_evicted_total").increment(1);
            ::metrics::gauge!(UNBOUND).decrement(1.0);
        }
        let id = inner.next;
        inner.next += 1;
        inner.open.insert(id, (ip, close));
        *inner.per_address.entry(ip).or_default() += 1;
        ::metrics::gauge!(UNBOUND).increment(1.0);
        Ok(UnboundTicket {
            budget: self.clone(),
            id,
        })
    }

    fn release(&self, id: u64) {
        let mut inner = self.inner.lock();
        if let Some((ip, _)) = inner.open.remove(&id) {
            decrement(&mut inner.per_address, ip);
            ::metrics::gauge!(UNBOUND).decrement(1.0);
        }
    }
}

fn decrement(per_address: &mut HashMap<IpAddr, usize>, ip: IpAddr) {
    if let Some(n) = per_address.get_mut(&ip) {
        *n -= 1;
        if *n == 0 {
            per_address.remove(&ip);
        }
    }
}

/// An unbound connection's place in the budget, given back when it binds or closes.
pub(super) struct UnboundTicket {
    budget: Arc<UnboundBudget>,
    id: u64,
}

impl Drop for UnboundTicket {
    fn drop(&mut self) {
        self.budget.release(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_address_share_then_the_oldest_makes_room() {
        let budget = UnboundBudget::new(3, 2);
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let c: IpAddr = "192.0.2.3".parse().unwrap();
        let tokens: Vec<CancellationToken> = (0..4).map(|_| CancellationToken::new()).collect();
        let t0 = budget.admit(a, tokens[0].clone()).unwrap();
        let _t1 = budget.admit(a, tokens[1].clone()).unwrap();
        assert_eq!(
            budget.admit(a, CancellationToken::new()).err(),
            Some(TooManyFromAddress)
        );
        let _t2 = budget.admit(b, tokens[2].clone()).unwrap();
        // Full: the oldest (t0) is closed to admit c.
        let _t3 = budget.admit(c, tokens[3].clone()).unwrap();
        assert!(tokens[0].is_cancelled());
        assert!(!tokens[1].is_cancelled());
        // a has room again; t0's ticket dropping later changes nothing.
        drop(t0);
        assert!(budget.admit(a, CancellationToken::new()).is_ok());
    }
}
