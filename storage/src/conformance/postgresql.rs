//! The DLR conformance suite against the postgresql backend (filled in with the backend).
