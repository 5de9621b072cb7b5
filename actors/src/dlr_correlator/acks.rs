//! Answers owed to providers for the receipts and inbound messages they sent.

use sendium_protocols::smpp::client::{Acker, DeliverAck};

/// Provider deliver_sm acknowledgements, sent once the receipts are stored.
///
/// Holds an [`Acker`], not a client handle: acknowledgements pending for a crashed
/// worker's sessions must not keep those sessions alive.
///
/// Dropped unanswered (sent while no correlator was running, or left in the mailbox of
/// one that panicked), they answer with a temporary error, so the provider keeps the
/// receipts and sends them again. Unanswered, a deliver_sm would hold a slot of the
/// provider's window until its response timer ran out.
/// For an HTTP provider's posted receipts the answer is the HTTP response, waiting on a
/// oneshot: `true` once stored, `false` for a 503 the provider retries.
pub struct ReceiptAcks(Option<AckTo>);

enum AckTo {
    Smpp { client: Acker, acks: Vec<DeliverAck> },
    Http(tokio::sync::oneshot::Sender<bool>),
}

/// ESME_RX_T_APPN: temporary application error — the SMSC keeps the receipt and
/// sends it again later.
const TEMPORARY_ERROR: u32 = 0x64;

impl ReceiptAcks {
    pub fn new(client: Acker, acks: Vec<DeliverAck>) -> Self {
        Self(Some(AckTo::Smpp { client, acks }))
    }

    /// The answer to an HTTP request that posted receipts.
    pub fn http(answer: tokio::sync::oneshot::Sender<bool>) -> Self {
        Self(Some(AckTo::Http(answer)))
    }

    /// The receipts are stored.
    pub fn ok(mut self) {
        self.answer(true);
    }

    /// The receipts were not stored: the provider sends them again.
    pub fn fail(mut self) {
        self.answer(false);
    }

    fn answer(&mut self, stored: bool) {
        match self.0.take() {
            Some(AckTo::Smpp { client, acks }) => {
                let status = if stored { 0 } else { TEMPORARY_ERROR };
                client.ack(acks.into_iter().map(|a| (a, status)).collect());
            }
            Some(AckTo::Http(answer)) => {
                let _ = answer.send(stored);
            }
            None => {}
        }
    }
}

impl Drop for ReceiptAcks {
    fn drop(&mut self) {
        self.answer(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn receipt_acks_dropped_unanswered_ask_the_provider_to_resend() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        drop(ReceiptAcks::http(tx));
        assert_eq!(rx.await, Ok(false));
        let (tx, rx) = tokio::sync::oneshot::channel();
        ReceiptAcks::http(tx).ok();
        assert_eq!(rx.await, Ok(true));
    }
}
