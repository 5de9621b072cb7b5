//! Which backend implements a stage. The storage crate's own vocabulary: the
//! configuration crate has its own enums and the actor layer maps between them.

use std::fmt;

/// Backend of an outbound stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StageBackend {
    Memory,
    File,
    Postgresql,
}

impl StageBackend {
    pub fn as_str(self) -> &'static str {
        match self {
            StageBackend::Memory => "memory",
            StageBackend::File => "file",
            StageBackend::Postgresql => "postgresql",
        }
    }

    /// Does work recorded in this backend survive a process restart?
    pub fn is_durable(self) -> bool {
        !matches!(self, StageBackend::Memory)
    }
}

impl fmt::Display for StageBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Backend of the DLR store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DlrBackend {
    Memory,
    File,
    Postgresql,
}

impl DlrBackend {
    pub fn as_str(self) -> &'static str {
        match self {
            DlrBackend::Memory => "memory",
            DlrBackend::File => "file",
            DlrBackend::Postgresql => "postgresql",
        }
    }

    pub fn is_durable(self) -> bool {
        !matches!(self, DlrBackend::Memory)
    }
}

impl fmt::Display for DlrBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
