//! SMPP server sessions: the ESME-facing side of Sendium.
//!
//! [`serve`] accepts ESME connections and runs one task per connection. Everything a
//! session does happens in that one task, in one `tokio::select!` loop over the socket's
//! read half, the in-flight [`SubmitHandler`] calls, the deliver_sm requests arriving from
//! the [`SessionRegistry`] and one timer. The hot path is built around the cost of a
//! wake-up (a sleep and wake of a thread costs more CPU than decoding and answering a
//! PDU): each wake-up reads whatever the socket holds, decodes every PDU in it, hands
//! *all* valid submit_sm of that read to the handler as **one** batch, and writes every
//! ready response with **one** `write_all`. The session keeps reading while earlier
//! batches are in flight (pipelining); their responses are written in request order.
//!
//! # Behaviour and the statuses it answers with
//!
//! | situation | answer |
//! |---|---|
//! | frame that does not decode | `generic_nack` with its sequence number and [`FrameError::nack_status`](crate::smpp::frame::FrameError::nack_status); the session continues |
//! | `command_length` < 16 or > `max_command_length` | `generic_nack ESME_RINVCMDLEN` (sequence number from the header when 16 octets are there), then close; an oversized PDU is never read into memory |
//! | unknown `system_id` | `bind_*_resp ESME_RINVSYSID`, then close |
//! | wrong password | `bind_*_resp ESME_RINVPASWD`, then close |
//! | account already has `max_binds` sessions | `bind_*_resp ESME_RBINDFAIL`, then close |
//! | bind on a bound session | `bind_*_resp ESME_RALYBND`, session stays bound |
//! | submit_sm before bind, on a receiver, or while unbinding | `submit_sm_resp ESME_RINVBNDSTS` |
//! | any other request before bind (except enquire_link, unbind) | `generic_nack ESME_RINVBNDSTS` |
//! | valid but unsupported request (query_sm, data_sm, submit_multi, cancel_sm, replace_sm, broadcast_*, and MC-only requests such as deliver_sm) | `generic_nack ESME_RINVCMDID` (one uniform answer, no response bodies to fake) |
//! | unknown command_id | `generic_nack ESME_RINVCMDID` |
//! | empty destination_addr | `submit_sm_resp ESME_RINVDSTADR` |
//! | message_payload together with a non-empty short_message | `ESME_RINVMSGLEN` |
//! | UDHI set on an empty message | `ESME_RINVESMCLASS` (the esm_class promises a UDH that is not there) |
//! | UDHI set and the UDH is malformed (UDHL past the end, an element past the header, a concatenation element of the wrong length or with part 0 / part > total) | `ESME_RINVMSGLEN` (the octets of short_message do not add up) |
//! | SAR TLVs not all three present, or invalid values | `ESME_RINVTLVVAL` (0xC4) |
//! | validity_period that is not an SMPP time ([`parse`](crate::smpp::time::parse): wrong length, not digits, an impossible date, relative with tenths or offset) | `ESME_RINVEXPIRY` (0x62) |
//! | schedule_delivery_time that is not an SMPP time (as above) | `ESME_RINVSCHED` (0x61) |
//! | more handler-bound submits outstanding than `window` | `ESME_RTHROTTLED` |
//! | account over `max_tps` (token bucket, 1-second burst, shared by the account's sessions) | `ESME_RTHROTTLED` |
//! | handler [`SubmitReply::Accepted`] / [`SubmitReply::Refused`] | `ESME_ROK` with the id / that status with an empty id |
//! | handler panicked, returned too few replies, or an id that is not a valid message_id | `ESME_RSYSERR` (logged) |
//!
//! Refused submits never reach the handler and consume neither window nor tokens (validation
//! runs first, then the window, then the token bucket). A refusal that shares a read with
//! handler-bound submits is written together with them, in request order; a read whose
//! submits are all refused is answered at once.
//!
//! `enquire_link` is answered in every state; `unbind` is answered with `unbind_resp` (after
//! the answers of submits still in flight) and the connection closes. A `generic_nack` from
//! the ESME is logged and otherwise ignored, except that a nack whose sequence number is an
//! outstanding deliver_sm settles that deliver as [`DeliverOutcome::Refused`] with the nack's
//! status (instead of waiting for the timeout). Responses the server did not ask for are
//! ignored (never answered: answering responses lets two confused peers loop).
//!
//! Idle: when nothing arrived for `idle_timeout` the server sends `enquire_link`; when still
//! nothing (any PDU counts) arrives within another `idle_timeout` it closes. A connection
//! that has not bound within `bind_timeout` of being accepted is closed. A write that cannot
//! complete within `idle_timeout` (the ESME stopped reading) closes the session too.
//!
//! Closing (unbind, shutdown, a corrupt stream): the session leaves the registry and frees
//! its bind slot at once, stops taking submits (`ESME_RINVBNDSTS`), resolves queued but
//! unsent deliver_sm as [`DeliverOutcome::Disconnected`], then waits — at most
//! [`CLOSE_GRACE`] — for in-flight handler calls (their answers are written) and for
//! outstanding deliver_sm_resp. On shutdown it then sends `unbind` and waits for
//! `unbind_resp` within the same grace period. After its last write the session half-closes
//! and reads (discarding) until the ESME closes too, for at most 500 ms: closing a socket
//! with unread input sends RST, which could destroy the last answer before the ESME reads
//! it. A failed bind closes the connection (it does not invite password guessing on one
//! connection); a bind that was refused for malformed fields gets a generic_nack and the
//! connection stays open until `bind_timeout`. Failed binds back off (see
//! [`crate::auth_guard`]): past a few failures from an address or for a system_id the
//! refusal is answered late, and past more an address (or, to the addresses that failed
//! for it, a system_id) is refused with `ESME_RBINDFAIL` without its password being
//! checked.
//!
//! # TLS
//!
//! [`serve_with_tls`] also accepts on a TLS listener. Its sessions are the same sessions;
//! the handshake runs first in the connection's own task and must finish by the
//! connection's bind deadline (`bind_timeout` from accept), while the connection holds its
//! place in the unbound budget. A failed or unfinished handshake closes the connection and
//! counts in `sendium_tls_handshake_failures_total{listener="smpp",reason}`.
//! With a client CA (mutual TLS) the session keeps the subject of the client certificate,
//! and an account with `tls_subject` binds only when that subject satisfies it (checked
//! with `allowed_ips`, before the password: see `account.rs`).
//!
//! # Outbound deliver_sm
//!
//! [`SessionRegistry::deliver`] spreads a batch over the account's receiver/transceiver
//! sessions (round robin, one message per session and call). Each session numbers, encodes
//! and writes its items in one write, and matches each deliver_sm_resp by sequence number.
//! At most `window` deliver_sm are outstanding per session (the ESME's receive window is
//! unknown; the submit window is a fair guess); the rest wait in the session, and
//! `deliver_timeout` starts when an item is written.
//!
//! # Metrics
//!
//! `sendium_smpp_sessions` (gauge, label `bind`), `sendium_smpp_pdus_total` (PDUs received,
//! label `command`; frames that do not decode count as `invalid`),
//! `sendium_smpp_errors_total` (error statuses the server answered with, label `status`,
//! e.g. `ESME_RTHROTTLED`), `sendium_smpp_binds_refused_total` (label `status`),
//! `sendium_smpp_connections_refused_total` (beyond `max_connections`),
//! `sendium_smpp_deliver_total` (label `outcome`). Logs carry account, peer and bind kind;
//! never passwords, bodies or message ids.

mod account;
mod budget;
mod convert;
mod metrics;
mod registry;
mod session;

#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::SmppAddress;
use crate::auth_guard::AuthGuard;
use crate::multipart::Concat;
use crate::tls::ServerTls;

pub use account::AccountBook;
pub use registry::SessionRegistry;

/// How long a closing session waits for in-flight handler calls, outstanding
/// deliver_sm_resp and (on shutdown) the ESME's `unbind_resp`.
pub const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// How long [`serve`] waits, after shutdown fired, for its sessions to end before aborting
/// the stragglers.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(3);

/// One SMPP account (system_id) that may bind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub system_id: String,
    pub password: String,
    /// Concurrent bound sessions; one more gets ESME_RBINDFAIL.
    pub max_binds: u32,
    /// submit_sm per second across the account's sessions; above it ESME_RTHROTTLED. 0 = unlimited.
    pub max_tps: u32,
    /// Addresses a bind may come from; empty = any. A bind from elsewhere gets
    /// ESME_RBINDFAIL before its password is looked at.
    pub allowed_ips: Vec<ipnet::IpNet>,
    /// Mutual TLS: a bind must come over TLS with a client certificate whose subject has
    /// these attributes; any other bind gets ESME_RBINDFAIL before its password is looked
    /// at.
    pub tls_subject: Option<crate::tls::Subject>,
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Our system_id in bind responses.
    pub system_id: String,
    /// Bound sessions at once, all accounts together; a bind beyond it gets
    /// `ESME_RBINDFAIL`.
    pub max_connections: usize,
    /// Connections not bound yet, in total (see `budget.rs`): a new one beyond it
    /// closes the oldest unbound connection.
    pub max_unbound: usize,
    /// Connections not bound yet from one address; more are closed at once.
    pub max_unbound_per_address: usize,
    /// A PDU longer than this closes the session without being read into memory.
    pub max_command_length: u32,
    /// Outstanding submit_sm per session (answers not yet written); beyond it ESME_RTHROTTLED.
    /// Also the number of deliver_sm a session has outstanding at once. 0 is treated as 1.
    pub window: usize,
    /// A connection that has not bound within this closes.
    pub bind_timeout: Duration,
    /// No PDU from the ESME for this long: enquire_link, then close if unanswered.
    pub idle_timeout: Duration,
    /// How long to wait for a deliver_sm_resp.
    pub deliver_timeout: Duration,
    /// The accounts, replaceable while serving ([`AccountBook::replace`]).
    pub accounts: AccountBook,
    /// Failed binds back off per address and system_id (see [`crate::auth_guard`]).
    pub auth: Arc<AuthGuard>,
}

/// A submit_sm as the pipeline sees it: validated, UDH/SAR read, user data without UDH.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboundSubmit {
    pub service_type: String,
    pub source: SmppAddress,
    pub destination: SmppAddress,
    /// As received, with the UDHI bit cleared (user_data has no UDH).
    pub esm_class: u8,
    pub protocol_id: u8,
    pub priority_flag: u8,
    pub registered_delivery: u8,
    pub data_coding: u8,
    /// short_message or message_payload, UDH removed.
    pub user_data: Vec<u8>,
    /// From the UDH (8- or 16-bit reference) or the SAR TLVs.
    pub concat: Option<Concat>,
    /// The `validity_period` as an absolute deadline, ms since the Unix epoch (relative
    /// values resolved against the time of receipt); None when the ESME gave none.
    pub validity: Option<u64>,
    /// The `schedule_delivery_time`, absolute in ms since the Unix epoch like
    /// `validity`; None when the ESME gave none.
    pub schedule: Option<u64>,
}

/// The answer for one submit_sm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubmitReply {
    /// ESME_ROK with this message_id.
    Accepted(String),
    /// This command_status, no message id.
    Refused(u32),
}

/// The pipeline behind the server.
#[async_trait]
pub trait SubmitHandler: Send + Sync + 'static {
    /// Called once per read with every valid submit_sm decoded from it, in order; must
    /// return one reply per submit, in the same order.
    ///
    /// The session polls the returned future itself (no task per call), next to its
    /// socket. If the connection dies and the call does not finish within [`CLOSE_GRACE`],
    /// the future is dropped: the implementation must be cancel-safe (an admission that
    /// already happened simply goes unanswered, and the ESME resubmits).
    async fn submit(&self, account: &str, batch: Vec<InboundSubmit>) -> Vec<SubmitReply>;

    /// A session of `account` bound; `can_receive` for receiver/transceiver binds (held
    /// receipts can be delivered now). Called after the session is in the registry, so a
    /// [`SessionRegistry::deliver`] started from here reaches it (after its bind_resp).
    fn bound(&self, account: &str, can_receive: bool);

    /// False while the gateway is stopping: a bind is then refused with
    /// `ESME_RBINDFAIL` (the ESME reconnects to another instance, or after the restart).
    fn accepts_binds(&self) -> bool {
        true
    }
}

/// A deliver_sm to send to an ESME (a delivery receipt).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboundDeliver {
    pub source: SmppAddress,
    pub destination: SmppAddress,
    pub esm_class: u8,
    pub data_coding: u8,
    pub short_message: Vec<u8>,
    pub receipted_message_id: Option<String>,
    pub message_state: Option<u8>,
}

/// What happened to one deliver_sm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliverOutcome {
    /// deliver_sm_resp ESME_ROK.
    Acked,
    /// deliver_sm_resp with this error status (or a generic_nack with it; or, when the
    /// deliver_sm could not even be built from the given fields, the status naming the bad
    /// field, e.g. ESME_RINVDSTADR).
    Refused(u32),
    /// No receiver/transceiver session of the account is bound.
    NoSession,
    /// No deliver_sm_resp within the deliver timeout.
    Timeout,
    /// The session closed before answering.
    Disconnected,
}

/// A bound session, for `/admin` views.
#[derive(Debug, Clone)]
pub struct SessionInfo {
    pub account: String,
    pub bind: &'static str,
    pub peer: SocketAddr,
}

/// Accept ESME connections on `listener` until `shutdown` fires.
///
/// Connections beyond `config.max_connections` are closed as soon as they are accepted.
/// When `shutdown` fires the listener stops accepting, every session unbinds and closes
/// (see the module documentation), and `serve` returns once all sessions ended — or after
/// [`SHUTDOWN_TIMEOUT`], aborting the sessions still running.
///
/// Accept errors (out of file descriptors, a connection reset before accept) are logged
/// and retried with a short backoff; they never end the server.
pub async fn serve(
    listener: TcpListener,
    config: Arc<ServerConfig>,
    handler: Arc<dyn SubmitHandler>,
    registry: SessionRegistry,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    serve_with_tls(listener, None, config, handler, registry, shutdown).await
}

/// [`serve`], and TLS connections on a second listener: the same accounts, limits and
/// sessions; only the transport differs. Each TLS connection's handshake runs in its own
/// task within its bind deadline (see `session::run`), never in the accept loop.
pub async fn serve_with_tls(
    listener: TcpListener,
    tls: Option<(TcpListener, ServerTls)>,
    config: Arc<ServerConfig>,
    handler: Arc<dyn SubmitHandler>,
    registry: SessionRegistry,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let unbound = budget::UnboundBudget::new(config.max_unbound, config.max_unbound_per_address);
    let shared = Arc::new(session::Shared::new(config, handler, registry));
    let mut sessions = JoinSet::new();
    let mut backoff = Duration::from_millis(5);
    tracing::info!(
        addr = ?listener.local_addr().ok(),
        tls_addr = ?tls.as_ref().and_then(|(l, _)| l.local_addr().ok()),
        max_connections = shared.config.max_connections,
        accounts = shared.config.accounts.len(),
        "SMPP server listening"
    );

    loop {
        let accepted = tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            Some(done) = sessions.join_next(), if !sessions.is_empty() => {
                log_session_end(done);
                continue;
            }
            accepted = listener.accept() => accepted.map(|(stream, peer)| (stream, peer, None)),
            accepted = accept_tls(tls.as_ref()) => accepted,
        };
        match accepted {
            Ok((stream, peer, acceptor)) => {
                backoff = Duration::from_millis(5);
                let evict = CancellationToken::new();
                match unbound.admit(peer.ip(), evict.clone()) {
                    Ok(ticket) => {
                        let shared = shared.clone();
                        let token = shutdown.child_token();
                        sessions.spawn(session::run(
                            stream,
                            peer,
                            shared,
                            token,
                            session::Unbound { ticket, evict },
                            acceptor,
                        ));
                    }
                    Err(budget::TooManyFromAddress) => {
                        ::metrics::counter!("sendium_smpp_connections_refused_total", "reason" => "unbound-per-address").increment(1);
                        tracing::debug!(%peer, "SMPP connection refused: too many unbound connections from its address");
                        drop(stream);
                    }
                }
            }
            Err(err) => {
                tracing::warn!(error = %err, "SMPP accept failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }

    drop(listener);
    drop(tls);
    tracing::info!(sessions = sessions.len(), "SMPP server shutting down");
    let drained = tokio::time::timeout(SHUTDOWN_TIMEOUT, async {
        while let Some(done) = sessions.join_next().await {
            log_session_end(done);
        }
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            sessions = sessions.len(),
            "SMPP sessions did not end in time; aborting them"
        );
        sessions.abort_all();
        while sessions.join_next().await.is_some() {}
    }
    Ok(())
}

/// The next connection on the TLS listener, with the identity current at its accept; never
/// ready without one.
async fn accept_tls(
    tls: Option<&(TcpListener, ServerTls)>,
) -> std::io::Result<(TcpStream, SocketAddr, Option<tokio_rustls::TlsAcceptor>)> {
    match tls {
        Some((listener, identity)) => {
            let (stream, peer) = listener.accept().await?;
            Ok((stream, peer, Some(identity.acceptor())))
        }
        None => std::future::pending().await,
    }
}

fn log_session_end(done: Result<(), tokio::task::JoinError>) {
    if let Err(err) = done
        && err.is_panic()
    {
        tracing::error!("SMPP session task panicked");
    }
}
