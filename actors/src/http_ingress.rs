//! The HTTP ingress's view of the pipeline: a validated `POST /v1/messages` becomes a
//! pending record (text encoded in GSM 7-bit when it fits that alphabet, UCS2
//! otherwise) admitted through the Ingress actor like any SMPP submission; so does each
//! receiver's message of a Kannel `/cgi-bin/sendsms` request.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sendium_protocols::http::{HttpOutcome, HttpSubmission, HttpSubmitHandler};
use sendium_protocols::kannel::Sendsms;
use sendium_protocols::kannel::dlr_url::kind;
use sendium_protocols::text::{self, Alphabet};
use sendium_storage::{Address, Channel, MessageId, PartInfo, PendingRecord, Timestamp};

use crate::context::{ScheduleRefusal, Shared};
use crate::ingress::{self, Admission, Refusal};
use crate::spec::LiveRoutes;

pub struct HttpIngress {
    shared: Arc<Shared>,
    receipts: Arc<crate::provider_receipts::ProviderReceipts>,
    /// How long the parts of a long message sent part by part (a `/cgi-bin/sendsms`
    /// concatenation UDH) wait for each other: `[sms] multipart-expiry`.
    multipart_expiry: Duration,
    /// The route table the Router plans with, to tell a `/cgi-bin/sendsms` client its
    /// message waits for a destination (`3: Queued for later delivery`); without it the
    /// answer is always `0: Accepted for delivery`.
    routes: Option<LiveRoutes>,
}

/// `[sms] multipart-expiry` when the caller does not say.
const DEFAULT_MULTIPART_EXPIRY: Duration = Duration::from_secs(3600);

impl HttpIngress {
    pub fn new(shared: Arc<Shared>, receipts: Arc<crate::provider_receipts::ProviderReceipts>) -> Self {
        Self {
            shared,
            receipts,
            multipart_expiry: DEFAULT_MULTIPART_EXPIRY,
            routes: None,
        }
    }

    /// The live route table: `/cgi-bin/sendsms` answers tell a message that waits for a
    /// destination.
    pub fn routes(mut self, routes: LiveRoutes) -> Self {
        self.routes = Some(routes);
        self
    }

    /// Whether a message would wait for a destination now: its route matches and no
    /// destination the route sends to (failover ones included) has its link up. Kannel's
    /// bearerbox says the same (`3: Queued for later delivery`) when every SMSC of the
    /// route is down. Reads the route table and the link flags; asks no actor.
    fn waits_for_a_destination(&self, r: &PendingRecord) -> bool {
        let Some(routes) = &self.routes else {
            return false;
        };
        let table = routes.current();
        let route = crate::router::route_of(&table, r, || crate::router::record_text(r));
        route.is_some_and(|route| !route.to.is_empty() && !self.shared.links.any_up(&route.to))
    }

    /// The configured `[sms] multipart-expiry`.
    pub fn multipart_expiry(mut self, expiry: Duration) -> Self {
        self.multipart_expiry = expiry;
        self
    }
}

/// SMPP addressing for an HTTP sender: alphanumeric senders are TON 5 (alphanumeric),
/// NPI 0; numbers are international (TON 1, NPI 1 — E.164).
fn sender(from: &str) -> Address {
    let digits = from.strip_prefix('+').unwrap_or(from);
    if digits.chars().all(|c| c.is_ascii_digit()) {
        Address::new(1, 1, digits)
    } else {
        Address::new(5, 0, from)
    }
}

/// The pending record of an HTTP submission, or the field that cannot be carried.
pub fn record(s: HttpSubmission) -> Result<PendingRecord, (&'static str, String)> {
    let alphabet = text::best_alphabet(&s.text);
    let payload = text::encode(alphabet, &s.text).map_err(|e| ("text", e.to_string()))?;
    let registered_delivery = if s.callback_url.is_some() { 0x01 } else { 0x00 };
    let accepted_at = Timestamp::now();
    Ok(PendingRecord {
        id: MessageId::generate(),
        account: s.account,
        channel: Channel::Http,
        source: sender(&s.from),
        destination: Address::new(1, 1, s.to),
        service_type: String::new(),
        esm_class: 0,
        protocol_id: 0,
        priority: 0,
        data_coding: match alphabet {
            Alphabet::Gsm7 => 0x00,
            other => other.data_coding(),
        },
        payload,
        part: None,
        registered_delivery,
        callback_url: s.callback_url,
        idempotency_key: s.idempotency_key,
        accepted_at,
        valid_until: None,
        dlr_mask: None,
        route_priority: 0,
        destination_hint: None,
        deliver_at: s.deliver_at.map(Timestamp).filter(|&at| at > accepted_at),
    })
}

/// registered_delivery for a Kannel dlr-mask with a dlr-url: a receipt on every final
/// outcome when the mask asks for delivered ones; on failures only when it asks for
/// failures (undelivered, or refused by the provider), or for the provider's acceptance
/// or intermediate reports without final ones (those reports hang on the receipt's
/// correlation; an unasked failure is then not reported); none otherwise. Only part 1
/// of a long message asks, as Kannel does.
fn kannel_registered_delivery(mask: u8) -> u8 {
    if mask & kind::DELIVERED != 0 {
        0x01
    } else if mask & (kind::UNDELIVERED | kind::SMSC_REJECT | kind::SMSC_SUCCESS | kind::BUFFERED) != 0 {
        0x02
    } else {
        0x00
    }
}

/// The longest `smsc` parameter kept as a destination hint.
const MAX_DESTINATION_HINT: usize = 255;

/// The pending records of a `/cgi-bin/sendsms` request: one per receiver. The UDH's
/// concatenation element, if any, makes each a part of a long message.
pub fn sendsms_records(account: &str, s: &Sendsms, now: Timestamp, multipart_expiry: Duration) -> Vec<PendingRecord> {
    let (callback_url, dlr_mask) = match &s.dlr_url {
        Some(url) if kannel_registered_delivery(s.dlr_mask) != 0 => (Some(url.clone()), Some(s.dlr_mask)),
        _ => (None, None),
    };
    let registered_delivery = match (dlr_mask, s.concat) {
        (Some(_), Some(c)) if c.seq != 1 => 0x00,
        (Some(mask), _) => kannel_registered_delivery(mask),
        (None, _) => 0x00,
    };
    s.to.iter()
        .map(|to| PendingRecord {
            id: MessageId::generate(),
            account: account.to_string(),
            channel: Channel::Http,
            source: sender(&s.from),
            destination: Address::new(1, 1, to.strip_prefix('+').unwrap_or(to)),
            service_type: String::new(),
            esm_class: 0,
            protocol_id: 0,
            priority: 0,
            data_coding: s.data_coding,
            payload: s.payload.clone(),
            part: s.concat.map(|c| PartInfo {
                reference: c.reference,
                total: c.total,
                seq: c.seq,
                expires_at: now.saturating_add(multipart_expiry),
            }),
            registered_delivery,
            callback_url: callback_url.clone(),
            idempotency_key: None,
            accepted_at: now,
            valid_until: s
                .validity_minutes
                .map(|m| now.saturating_add(Duration::from_secs(u64::from(m) * 60))),
            dlr_mask,
            route_priority: 0,
            // A destination name; anything longer names none and is not stored.
            destination_hint: s.smsc.clone().filter(|h| h.len() <= MAX_DESTINATION_HINT),
            // Kannel's `deferred`: minutes from now; 0 is now.
            deliver_at: s
                .deferred_minutes
                .filter(|&m| m > 0)
                .map(|m| now.saturating_add(Duration::from_secs(u64::from(m) * 60))),
        })
        .collect()
}

/// The answer to one admission.
fn outcome(a: Option<Admission>) -> HttpOutcome {
    match a {
        Some(Admission::Accepted(id)) => HttpOutcome::Accepted(id.to_string()),
        Some(Admission::Duplicate(id)) => HttpOutcome::Duplicate(id.to_string()),
        Some(Admission::Refused(Refusal::IdempotencyKeyReused)) => HttpOutcome::Conflict {
            field: "idempotency_key",
            reason: "was already used for a different message (send the same message to retry, or use a new key)"
                .into(),
        },
        Some(Admission::Refused(Refusal::ReceiptsDisabled)) => HttpOutcome::Invalid {
            field: "callback_url",
            reason: "receipts are disabled on this gateway (dlr.backend = \"disabled\")".into(),
        },
        Some(Admission::Refused(_)) | None => HttpOutcome::Unavailable,
    }
}

/// The answer to a message whose scheduled time cannot be honoured.
fn schedule_refused(why: ScheduleRefusal) -> HttpOutcome {
    let reason = match why {
        ScheduleRefusal::BeyondSmppTime => "must not be later than 2099-12-31T23:59:59Z".to_owned(),
        ScheduleRefusal::BeyondRetention(horizon) => format!(
            "is more than {} ahead: a message asking for a receipt may be scheduled at most [dlr] retention less an hour ahead",
            humantime::format_duration(horizon)
        ),
    };
    HttpOutcome::Invalid {
        field: "deliver_at",
        reason,
    }
}

#[async_trait]
impl HttpSubmitHandler for HttpIngress {
    async fn provider_receipts(
        &self,
        destination: &str,
        headers: &axum::http::HeaderMap,
        body: bytes::Bytes,
    ) -> axum::http::StatusCode {
        self.receipts.handle(&self.shared, destination, headers, &body).await
    }

    async fn submit(&self, submission: HttpSubmission) -> HttpOutcome {
        let rec = match record(submission) {
            Ok(r) => r,
            Err((field, reason)) => return HttpOutcome::Invalid { field, reason },
        };
        if let Some(why) = self.shared.schedule_refusal(&rec, rec.accepted_at) {
            return schedule_refused(why);
        }
        let mut answers = ingress::admit(&self.shared, vec![rec]).await;
        outcome(answers.pop())
    }

    async fn sendsms(&self, account: &str, request: Sendsms) -> Vec<HttpOutcome> {
        let now = Timestamp::now();
        let records = sendsms_records(account, &request, now, self.multipart_expiry);
        if let Some(why) = records.iter().find_map(|r| self.shared.schedule_refusal(r, now)) {
            return records.iter().map(|_| schedule_refused(why)).collect();
        }
        let waits: Vec<bool> = records.iter().map(|r| self.waits_for_a_destination(r)).collect();
        let mut answers = ingress::admit(&self.shared, records).await.into_iter();
        waits
            .into_iter()
            .map(|waits| match outcome(answers.next()) {
                HttpOutcome::Accepted(id) if waits => HttpOutcome::Queued(id),
                other => other,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(text: &str, cb: Option<&str>) -> HttpSubmission {
        HttpSubmission {
            account: "esme1".into(),
            from: "Shop".into(),
            to: "447700900123".into(),
            text: text.into(),
            callback_url: cb.map(str::to_string),
            idempotency_key: None,
            deliver_at: None,
        }
    }

    #[test]
    fn a_dlr_mask_asks_for_the_receipts_its_reports_need() {
        for (mask, rd) in [(0, 0), (4, 2), (1, 1), (31, 1), (2, 2), (16, 2), (18, 2), (8, 2)] {
            assert_eq!(kannel_registered_delivery(mask), rd, "mask {mask}");
        }
        let params = sendium_protocols::kannel::Params::parse(
            b"from=Shop&to=4471+%2B4472&text=hi&dlr-mask=3&dlr-url=http://127.0.0.1:9/d&udh=%05%00%03%07%02%02&validity=5",
        );
        let s = sendium_protocols::kannel::sendsms::parse(&params).unwrap();
        let now = Timestamp(1_000_000);
        let recs = sendsms_records("esme1", &s, now, Duration::from_secs(60));
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[1].destination, Address::new(1, 1, "4472"));
        let r = &recs[0];
        assert_eq!(
            (r.dlr_mask, r.callback_url.as_deref()),
            (Some(3), Some("http://127.0.0.1:9/d"))
        );
        assert_eq!(r.registered_delivery, 0, "part 2 asks for no receipt");
        assert_eq!(r.part.map(|p| (p.reference, p.total, p.seq)), Some((7, 2, 2)));
        assert_eq!(r.valid_until, Some(Timestamp(1_300_000)));
        let no_url = sendium_protocols::kannel::sendsms::parse(&sendium_protocols::kannel::Params::parse(
            b"from=Shop&to=4471&text=hi&dlr-mask=31",
        ))
        .unwrap();
        let r = &sendsms_records("esme1", &no_url, now, Duration::from_secs(60))[0];
        assert_eq!(
            (r.dlr_mask, r.registered_delivery, r.callback_url.clone()),
            (None, 0, None)
        );
    }

    #[test]
    fn the_smsc_parameter_is_stored_as_a_destination_hint_unless_too_long() {
        let hint = |smsc: &str| {
            let query = format!("from=Shop&to=4471&text=hi&smsc={smsc}");
            let params = sendium_protocols::kannel::Params::parse(query.as_bytes());
            let s = sendium_protocols::kannel::sendsms::parse(&params).unwrap();
            sendsms_records("esme1", &s, Timestamp(0), Duration::from_secs(60))[0]
                .destination_hint
                .clone()
        };
        assert_eq!(hint("upstream-b").as_deref(), Some("upstream-b"));
        assert_eq!(hint(&"x".repeat(MAX_DESTINATION_HINT)).map(|h| h.len()), Some(255));
        assert_eq!(hint(&"x".repeat(MAX_DESTINATION_HINT + 1)), None);
        assert_eq!(hint(""), None);
    }

    #[test]
    fn gsm_text_stays_gsm_and_other_text_goes_ucs2() {
        let r = record(sub("hello €", None)).unwrap();
        assert_eq!(r.data_coding, 0);
        assert_eq!(text::decode(0, &r.payload).unwrap(), "hello €");
        assert_eq!(r.registered_delivery, 0);
        assert_eq!(r.source, Address::new(5, 0, "Shop"));
        let r = record(sub("привет", Some("http://127.0.0.1:1/cb"))).unwrap();
        assert_eq!(r.data_coding, 8);
        assert_eq!(r.registered_delivery, 1);
        assert_eq!(r.channel, Channel::Http);
    }
}
