//! Sendium's black-box test kit.
//!
//! Everything here talks to the real `sendium` binary from the outside, over 127.0.0.1:
//!
//! - [`smsc`]: a test SMSC — the upstream provider Sendium's destinations connect to. It
//!   records every `submit_sm`, reassembles multipart messages, answers with configurable
//!   ids, sends delivery receipts to bound receivers (holding and resending them like real
//!   SMSCs do) and injects faults at run time.
//! - [`esme`]: a test ESME — a client of Sendium's SMPP server: bind, submit (single,
//!   multipart, pipelined), collect receipts, raw PDU access for protocol tests.
//! - [`gateway`]: runs the `sendium` binary from a config template with free ports, waits
//!   for `/readyz`, kills and restarts it, talks to its admin and HTTP APIs.
//! - [`callback`]: a tiny HTTP server recording the DLR callbacks Sendium POSTs.
//! - [`loadgen`]: the benchmark's load generator (also the `sendium-loadgen` binary).
//! - [`pgstats`]: what a PostgreSQL server spent on a benchmark phase, per message.
//! - [`histogram`]: a small log-linear latency histogram.
//! - [`http`]: a minimal HTTP/1.1 client.
//!
//! **Independence.** The kit uses only Sendium's pure protocol pieces —
//! `sendium_protocols::smpp::frame` (framing, `decode_frame`, `encode`),
//! `sendium_protocols::smpp::build` (PDU builders), `sendium_protocols::text` and
//! `sendium_protocols::receipt` — plus rusmpp's types. It never uses Sendium's SMPP
//! server or client sessions, so a session bug cannot hide behind the same bug in the
//! test peer. Concatenation headers are parsed here, not with `sendium_protocols::multipart`.
//!
//! **Performance.** The SMSC and the load generator are benchmark tools: every wake-up
//! drains all readable bytes, handles every PDU in them, and answers with one write;
//! receipts are scheduled in batches (one timer entry per batch).
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod callback;
pub mod esme;
pub mod gateway;
pub mod histogram;
pub mod http;
pub mod http_load;
pub mod http_provider;
pub mod loadgen;
pub mod outbox_load;
pub mod pgstats;
pub mod smsc;
pub mod soak;
pub mod tls;
pub mod wire;

pub mod util;

pub use callback::{CallbackReceipt, CallbackRequest, CallbackServer};
pub use esme::{
    BindError, Concat, DlrParts, DlrReply, EsmeError, EsmeOptions, MoMessage, Receipt, ReceivedPdu, SubmitOutcome,
    SubmitResp, SubmitSpec, TestEsme,
};
pub use gateway::{ClosedPort, GatewayBuilder, GatewayProcess, Ports, free_port, render_template, sendium_command};
pub use histogram::Histogram;
pub use loadgen::{LoadConfig, LoadError, LoadReport, Mix};
pub use smsc::{
    BoundSession, DestMatch, Duplicate, Faults, IdStyle, MoSpec, ReceiptOutcome, ReceiptRule, SmscAccount, SmscConfig,
    SmscMessage, SmscStats, SubmitRecord, TestSmsc,
};
pub use tls::{TlsClient, TlsFront};

/// Re-exported so tests need no direct dependency for the common types.
pub use rusmpp::{Command, CommandId, CommandStatus};
pub use sendium_protocols::receipt::ReceiptState;
pub use sendium_protocols::smpp::build::BindKind;
pub use sendium_protocols::text::Alphabet;
