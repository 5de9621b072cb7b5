//! The file DLR store (being written).

/// Placeholder until the store lands.
#[derive(Debug)]
pub struct FileDlrStore;
