//! Which backend implements a stage, and what the actors need to know of it.
//!
//! The storage crate's own vocabulary: the configuration crate has its own enums (with
//! words such as `disabled`) and the actor layer maps between them. The actors never ask
//! which backend a store is in order to drive it: they read its capabilities, one struct
//! per stage, and a new backend states its own.

use std::fmt;

/// A storage backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    Memory,
    File,
    Postgresql,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::File => "file",
            Backend::Postgresql => "postgresql",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an outbound stage's store is, as its owning actor needs to know it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StageCapabilities {
    pub backend: Backend,
    /// Work recorded here survives a process restart. The Selector then releases a
    /// staged unit once routed-work has recorded it (not when its source completes), and
    /// the Selector and Router pace their writes, which wait for the disk.
    pub durable: bool,
}

impl StageCapabilities {
    /// A store that keeps its work in the process only.
    pub const MEMORY: StageCapabilities = StageCapabilities {
        backend: Backend::Memory,
        durable: false,
    };

    /// A store whose every commit is durable before it returns.
    pub const fn durable(backend: Backend) -> Self {
        StageCapabilities { backend, durable: true }
    }
}
