//! The SMPP server's view of the pipeline: converts submit_sm into pending records and
//! answers with the Ingress actor's admission result.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sendium_protocols::smpp::server::{InboundSubmit, SubmitHandler, SubmitReply};
use sendium_storage::{Channel, MessageId, PartInfo, PendingRecord, Timestamp};

use crate::address::from_wire;
use crate::context::Shared;
use crate::dlr_correlator::DlrMsg;
use crate::ingress::{self, Admission, Refusal};

/// SMPP command_status answers for refusals.
pub const ESME_RINVREGDLVFLG: u32 = 0x07;
pub const ESME_RSYSERR: u32 = 0x08;
pub const ESME_RMSGQFUL: u32 = 0x14;
/// A `schedule_delivery_time` further ahead than the message's receipt can be kept for.
pub const ESME_RINVSCHED: u32 = 0x61;

pub fn refusal_status(r: Refusal) -> u32 {
    match r {
        Refusal::QueueFull | Refusal::ReceiptCapacity | Refusal::ReceiptStoreUnavailable => ESME_RMSGQFUL,
        Refusal::ReceiptsDisabled => ESME_RINVREGDLVFLG,
        // SMPP submissions carry no idempotency key: never met here.
        Refusal::Unavailable | Refusal::IdempotencyKeyReused => ESME_RSYSERR,
    }
}

pub struct SmppIngress {
    shared: Arc<Shared>,
    multipart_expiry: Duration,
}

impl SmppIngress {
    pub fn new(shared: Arc<Shared>, multipart_expiry: Duration) -> Self {
        Self {
            shared,
            multipart_expiry,
        }
    }
}

/// A submit_sm as a pending record. The multipart deadline is absolute and saved with
/// the part: a restart does not extend it.
pub fn record(account: &str, s: InboundSubmit, now: Timestamp, multipart_expiry: Duration) -> PendingRecord {
    PendingRecord {
        id: MessageId::generate(),
        account: account.to_string(),
        channel: Channel::Smpp,
        source: from_wire(s.source),
        destination: from_wire(s.destination),
        service_type: s.service_type,
        esm_class: s.esm_class,
        protocol_id: s.protocol_id,
        priority: s.priority_flag,
        data_coding: s.data_coding,
        payload: s.user_data,
        part: s.concat.map(|c| PartInfo {
            reference: c.reference,
            total: c.total,
            seq: c.seq,
            expires_at: now.saturating_add(multipart_expiry),
        }),
        registered_delivery: s.registered_delivery,
        callback_url: None,
        idempotency_key: None,
        accepted_at: now,
        valid_until: s.validity.map(Timestamp),
        deliver_at: s.schedule.map(Timestamp).filter(|&at| at > now),
        dlr_mask: None,
        route_priority: 0,
        destination_hint: None,
    }
}

#[async_trait]
impl SubmitHandler for SmppIngress {
    async fn submit(&self, account: &str, batch: Vec<InboundSubmit>) -> Vec<SubmitReply> {
        let now = Timestamp::now();
        let (records, too_far): (Vec<PendingRecord>, Vec<bool>) = batch
            .into_iter()
            .map(|s| record(account, s, now, self.multipart_expiry))
            .map(|r| {
                let too_far = self.shared.schedule_refusal(&r, now).is_some();
                (r, too_far)
            })
            .unzip();
        // Refused ones never reach the Ingress; the others keep their order.
        let admitted: Vec<PendingRecord> = records
            .into_iter()
            .zip(&too_far)
            .filter(|(_, far)| !**far)
            .map(|(r, _)| r)
            .collect();
        let mut answers = ingress::admit(&self.shared, admitted).await.into_iter();
        too_far
            .into_iter()
            .map(|far| match far {
                true => SubmitReply::Refused(ESME_RINVSCHED),
                false => match answers.next() {
                    Some(Admission::Accepted(id) | Admission::Duplicate(id)) => SubmitReply::Accepted(id.to_string()),
                    Some(Admission::Refused(r)) => SubmitReply::Refused(refusal_status(r)),
                    None => SubmitReply::Refused(ESME_RSYSERR),
                },
            })
            .collect()
    }

    fn bound(&self, account: &str, can_receive: bool) {
        if can_receive && self.shared.dlr_enabled {
            self.shared.dir.dlr.send(DlrMsg::AccountBound(account.to_string()));
        }
    }

    fn accepts_binds(&self) -> bool {
        !self.shared.stopping.refusing_admissions()
    }
}
