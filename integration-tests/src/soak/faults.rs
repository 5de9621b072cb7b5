//! Provider (and callback endpoint) faults switched on and off over time.

use std::collections::BTreeMap;
use std::time::Duration;

use rusmpp::CommandStatus;

use crate::callback::CallbackServer;
use crate::smsc::TestSmsc;

use super::ledger::REJECT_PREFIX;

/// A small deterministic generator (xorshift64*), so a seed repeats a run's choices.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// One fault phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// No fault.
    Calm,
    /// Every 4th submit_sm answered ESME_RTHROTTLED.
    ThrottleSome,
    /// Every submit_sm answered ESME_RTHROTTLED for 3 s.
    ThrottleAll,
    /// The provider closes its connection without answering, after a few more submits.
    DropConnection,
    /// submit_sm_resp 300 ms late.
    SlowResponses,
    /// submit_sm_resp 2.5 s late: past the gateway's 2 s response-timeout, so the gateway
    /// gives up on them and submits again (the provider did accept the first: duplicates).
    TimeoutResponses,
    /// The provider stops answering submits for 3 s.
    StopAnswering,
    /// Destinations of the reject class refused with ESME_RINVDSTADR (a permanent error:
    /// the message fails with a REJECTD receipt).
    RejectClass,
    /// Reject class refused and every 5th submit throttled.
    RejectAndThrottle,
    /// The callback endpoint answers 500 for 8 s.
    CallbackDown,
}

impl Phase {
    pub const ALL: [Phase; 10] = [
        Phase::Calm,
        Phase::ThrottleSome,
        Phase::ThrottleAll,
        Phase::DropConnection,
        Phase::SlowResponses,
        Phase::TimeoutResponses,
        Phase::StopAnswering,
        Phase::RejectClass,
        Phase::RejectAndThrottle,
        Phase::CallbackDown,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Calm => "calm",
            Phase::ThrottleSome => "throttle every 4th submit",
            Phase::ThrottleAll => "throttle everything for 3s",
            Phase::DropConnection => "drop the provider connection",
            Phase::SlowResponses => "submit_sm_resp 300ms late",
            Phase::TimeoutResponses => "submit_sm_resp 2.5s late (past response-timeout)",
            Phase::StopAnswering => "stop answering submits for 3s",
            Phase::RejectClass => "reject the reject class",
            Phase::RejectAndThrottle => "reject the reject class + throttle every 5th",
            Phase::CallbackDown => "callback endpoint answers 500 for 8s",
        }
    }
}

/// Switches faults on the SMSC and the callback sink.
pub struct FaultSchedule {
    rng: Rng,
    order: Vec<Phase>,
    next: usize,
    pub current: Phase,
    /// How often each phase was switched on.
    pub applied: BTreeMap<Phase, u64>,
}

impl FaultSchedule {
    pub fn new(seed: u64) -> FaultSchedule {
        FaultSchedule {
            rng: Rng::new(seed ^ 0xFA17),
            order: Vec::new(),
            next: 0,
            current: Phase::Calm,
            applied: BTreeMap::new(),
        }
    }

    /// Every phase once per round, in a shuffled order.
    fn next_phase(&mut self) -> Phase {
        if self.next >= self.order.len() {
            let mut order = Phase::ALL.to_vec();
            for i in (1..order.len()).rev() {
                let j = self.rng.below(i as u64 + 1) as usize;
                order.swap(i, j);
            }
            self.order = order;
            self.next = 0;
        }
        let phase = self.order[self.next];
        self.next += 1;
        phase
    }

    /// Ends the current phase and starts the next one.
    pub fn advance(&mut self, smsc: &TestSmsc, callbacks: &CallbackServer) -> Phase {
        let phase = self.next_phase();
        self.apply(phase, smsc, callbacks);
        phase
    }

    pub fn apply(&mut self, phase: Phase, smsc: &TestSmsc, callbacks: &CallbackServer) {
        let faults = smsc.faults();
        faults.clear();
        callbacks.heal();
        match phase {
            Phase::Calm => {}
            Phase::ThrottleSome => faults.throttle_every(4),
            Phase::ThrottleAll => faults.throttle_all_for(Duration::from_secs(3)),
            Phase::DropConnection => faults.drop_connection_after(20 + self.rng.below(200)),
            Phase::SlowResponses => faults.delay_responses(Duration::from_millis(300)),
            Phase::TimeoutResponses => faults.delay_responses(Duration::from_millis(2500)),
            Phase::StopAnswering => faults.stop_answering(true),
            Phase::RejectClass => faults.reject_prefix(REJECT_PREFIX, CommandStatus::EsmeRinvdstadr),
            Phase::RejectAndThrottle => {
                faults.reject_prefix(REJECT_PREFIX, CommandStatus::EsmeRinvdstadr);
                faults.throttle_every(5);
            }
            Phase::CallbackDown => callbacks.fail_for(Duration::from_secs(8)),
        }
        self.current = phase;
        *self.applied.entry(phase).or_default() += 1;
    }

    /// The phase's own end, for the ones that last only a few seconds (the rest of the
    /// phase period is calm).
    pub fn short_phase_length(phase: Phase) -> Option<Duration> {
        match phase {
            Phase::StopAnswering => Some(Duration::from_secs(3)),
            Phase::TimeoutResponses => Some(Duration::from_secs(8)),
            _ => None,
        }
    }

    /// Every fault off.
    pub fn clear(&mut self, smsc: &TestSmsc, callbacks: &CallbackServer) {
        smsc.faults().clear();
        callbacks.heal();
        self.current = Phase::Calm;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_deterministic() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        for _ in 0..10 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        assert!(Rng::new(1).below(10) < 10);
    }

    #[test]
    fn every_phase_once_per_round() {
        let mut s = FaultSchedule::new(3);
        let mut seen: Vec<Phase> = (0..Phase::ALL.len()).map(|_| s.next_phase()).collect();
        seen.sort();
        let mut all = Phase::ALL.to_vec();
        all.sort();
        assert_eq!(seen, all);
    }
}
