//! The `sendium` binary's pieces: command line, admin HTTP (health, readiness, metrics,
//! actor and profile views), Prometheus exposition, tracing setup, and the demo.
#![forbid(unsafe_code)]

pub mod admin;
pub mod cli;
pub mod demo;
pub mod healthcheck;
pub mod metrics;
pub mod outbox_cli;
pub mod serve;
pub mod stores_cli;
pub mod telemetry;
