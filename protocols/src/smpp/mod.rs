//! SMPP 3.4 (with the rusmpp PDU model): framing and builders, the server sessions ESMEs
//! bind to, and the client sessions Sendium opens to upstream SMSCs.

pub mod build;
pub mod client;
pub mod frame;
pub mod server;
pub mod time;

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
