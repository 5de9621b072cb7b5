//! The soak test behind the `sendium-soak` binary: the real gateway for a long run under
//! mixed SMPP and HTTP traffic, provider faults and SIGKILLs, then a reckoning.
//!
//! - [`config`]: the gateway configuration (file/file/file, file DLR store);
//! - [`traffic`]: the SMPP sessions and HTTP clients;
//! - [`faults`]: the fault phases switched on the test SMSC and the callback sink;
//! - [`ledger`]: what was sent, acknowledged and received back, and the reckoning;
//! - [`procstat`]: the gateway's RSS and descriptors per incarnation;
//! - [`options`]: the command line.
//!
//! See `docs/soak.md`.

pub mod config;
pub mod faults;
pub mod ledger;
pub mod options;
pub mod procstat;
pub mod traffic;

mod run;

pub use options::{SoakOptions, USAGE};
pub use run::run;
