//! The HTTP ingress's view of the pipeline: a validated `POST /v1/messages` becomes a
//! pending record (text encoded in GSM 7-bit when it fits that alphabet, UCS2
//! otherwise) admitted through the Ingress actor like any SMPP submission.

use std::sync::Arc;

use async_trait::async_trait;
use sendium_protocols::http::{HttpOutcome, HttpSubmission, HttpSubmitHandler};
use sendium_protocols::text::{self, Alphabet};
use sendium_storage::{Address, Channel, MessageId, PendingRecord, Timestamp};

use crate::context::Shared;
use crate::ingress::{self, Admission, Refusal};

pub struct HttpIngress {
    shared: Arc<Shared>,
    receipts: Arc<crate::provider_receipts::ProviderReceipts>,
}

impl HttpIngress {
    pub fn new(shared: Arc<Shared>, receipts: Arc<crate::provider_receipts::ProviderReceipts>) -> Self {
        Self { shared, receipts }
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
        accepted_at: Timestamp::now(),
        valid_until: None,
    })
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
        let mut answers = ingress::admit(&self.shared, vec![rec]).await;
        match answers.pop() {
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
        }
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
