//! Sendium's wire protocols.
//!
//! This crate holds everything Sendium needs to speak to ESMEs and upstream SMSCs, split so
//! that the *pure* parts (no sockets, no clocks, no tasks) can be tested byte for byte
//! against the specifications and reused by the test SMSC / test ESME in
//! `integration-tests`:
//!
//! - [`smpp::frame`]: SMPP 3.4 framing on top of `tokio_util`'s `LengthDelimitedCodec`, one
//!   owned decode per frame with rusmpp (so one bad PDU gets a `generic_nack` and the next
//!   PDU in the same read still decodes), encoding many PDUs into one buffer, and the small
//!   set of PDU builders the sessions answer with.
//! - [`text`]: the SMS alphabets selected by `data_coding` (GSM 03.38 default + extension
//!   table, Latin-1, UCS2/UTF-16BE, IA5) and splitting *encoded* user data into segments.
//! - [`multipart`]: reading concatenation information from a UDH or the SAR TLVs.
//! - [`receipt`]: SMPP 3.4 Appendix B delivery-receipt text, message states, and the
//!   provider-id normalisation that lets a receipt find its `submit_sm_resp`.
//! - [`kannel`]: Kannel's `/cgi-bin/sendsms` parameters and answers, and the escape codes
//!   of its `dlr-url`.
//!
//! Every input here is untrusted network data: nothing panics on it, every failure is a typed
//! [`thiserror`] value, and the umbrella [`Error`] collects them for callers that do not care
//! which family failed.
#![forbid(unsafe_code)]

pub mod auth_guard;
pub mod callback;
pub mod error;
pub mod http;
pub mod http_client;
pub mod http_listener;
pub mod http_provider;
pub mod kannel;
pub mod multipart;
pub mod receipt;
pub mod text;
pub mod tls;

pub mod smpp;

pub use error::Error;
