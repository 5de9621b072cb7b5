//! The Sendium outbox: how an application gets an SMS sent exactly when its own
//! transaction commits.
//!
//! An application that must "mark the order paid" and "send the SMS" loses one or the
//! other when it makes two writes to two systems. Instead it inserts an outbox row in
//! the same transaction as the business change; Sendium relays committed rows into its
//! pending stage, with the row's `event_id` as the admission's idempotency key. A rolled
//! back transaction leaves no row, so nothing is sent; a committed one is sent even if
//! the application dies right after the commit.
//!
//! This crate is the table's public contract:
//! * [`schema`]: the SQL that creates the table, for PostgreSQL and SQLite (the same
//!   files ship under `outbox/sql/`; `sendium outbox schema` prints them);
//! * [`publish`]: the insert, for Rust applications on PostgreSQL (every other language
//!   inserts the message columns in plain SQL; see the README);
//! * [`relay`]: the relay's reads and settlements of a PostgreSQL or SQLite outbox table.

#![forbid(unsafe_code)]

mod publish;
pub mod relay;
mod schema;

pub use publish::{OutboxMessage, PublishError, Published, publish, publish_to};
pub use schema::{DEFAULT_TABLE, Dialect, TableName, TableNameError, UnknownDialect, schema};
