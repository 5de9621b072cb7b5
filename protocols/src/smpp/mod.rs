//! SMPP 3.4 (with the rusmpp PDU model): framing and builders, the server sessions ESMEs
//! bind to, and the client sessions Sendium opens to upstream SMSCs.

pub mod build;
pub mod client;
pub mod frame;
pub mod server;
pub mod time;

/// A hash map keyed by what the session itself assigns or the configuration names:
/// sequence numbers, batch tokens, account names. Looked up for every PDU; foldhash takes
/// a fraction of SipHash's time (the standard library's default, whose protection against
/// keys chosen to collide these keys do not need), and is still seeded per process.
pub(crate) type IdMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// An SMPP address as sessions exchange it with the rest of Sendium.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct SmppAddress {
    pub ton: u8,
    pub npi: u8,
    pub addr: String,
}

impl SmppAddress {
    pub fn new(ton: u8, npi: u8, addr: impl Into<String>) -> Self {
        Self {
            ton,
            npi,
            addr: addr.into(),
        }
    }
}
