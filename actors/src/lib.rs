//! Sendium's actor system.
//!
//! Five pipeline actors, each owning one storage stage behind its mailbox, and a
//! supervisor that restarts them and reconciles by stable id:
//!
//! ```text
//! ESME/app ─▶ Ingress ─▶ Selector ─▶ Router ─▶ DestinationWorker(s) ─▶ provider
//!            pending    router-queue  routed-work        │ receipts
//!                                         ▲               ▼
//!                                         └── DlrCorrelator (dlr) ─▶ ESME/app
//! ```
//!
//! Actors exchange batches keyed by stable ids; every in-memory queue between them is
//! bounded by credit (the Selector selects only what the Router has room for, the Router
//! gives a worker only its capacity), and Ingress acknowledges nothing it did not store.
#![forbid(unsafe_code)]

pub mod address;
pub mod context;
pub mod destination_worker;
pub mod directory;
pub mod dlr_correlator;
pub mod gateway;
pub mod health;
pub mod http_ingress;
pub mod inbound;
pub mod ingress;
pub mod outbox_relay;
mod pacing;
pub mod provider_receipts;
pub mod reload;
pub mod router;
pub mod selector;
pub mod smpp_ingress;
pub mod spec;
pub mod stores;
pub mod supervisor;
pub mod tls;

pub use gateway::{ClusterView, Gateway, GatewayError, Mode, PartitionHolder, Snapshot, StopReport};
