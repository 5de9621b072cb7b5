//! Kannel compatibility: the `/cgi-bin/sendsms` interface of Kannel's smsbox on the HTTP
//! ingress listener, and the `%` escape codes of Kannel's `dlr-url`.
//!
//! An application written for Kannel changes only the host it calls: the same
//! parameters, the same answers (`202 0: Accepted for delivery`, `403 Authorization
//! failed for sendsms`, Kannel's 400 texts), and reports as GETs of its `dlr-url`.

pub mod dlr_url;
pub(crate) mod endpoint;
pub mod sendsms;

pub use sendsms::{Answer, Params, Sendsms};
