//! Builders for the PDUs Sendium's sessions send.
//!
//! They exist so that every session fills the fields SMPP 3.4 requires the same way, and so
//! that nothing relies on a rusmpp `Default` that does not match what we mean: rusmpp's
//! `SubmitSm::default()` puts esm_class 0x08 on the wire (its ANSI-41 default), so the
//! message builders here always set esm_class (and every other header-ish field)
//! explicitly. Fields that carry text we did not produce (ids, addresses, credentials) are
//! validated and refused with a [`BuildError`] instead of being truncated.

use rusmpp::pdus::{
    BindReceiver, BindReceiverResp, BindTransceiver, BindTransceiverResp, BindTransmitter, BindTransmitterResp,
    DeliverSm, DeliverSmResp, SubmitSm, SubmitSmResp,
};
use rusmpp::tlvs::{MessageDeliveryRequestTlvValue, MessageSubmissionRequestTlvValue};
use rusmpp::types::{AnyOctetString, COctetString, EmptyOrFullCOctetString, OctetString};
use rusmpp::values::{
    DataCoding, EsmClass, InterfaceVersion, MessagePayload, MessageState, Npi, PriorityFlag, RegisteredDelivery,
    ReplaceIfPresentFlag, ServiceType, Ton,
};
use rusmpp::{Command, CommandId, CommandStatus, Pdu};

/// A value that cannot be put into the named SMPP field (too long, not ASCII, contains NUL).
///
/// `reason` names the constraint, never the value (it may be a password).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid value for SMPP field {field}: {reason}")]
pub struct BuildError {
    pub field: &'static str,
    pub reason: String,
}

fn c_string<const MIN: usize, const MAX: usize>(
    field: &'static str,
    value: &str,
) -> Result<COctetString<MIN, MAX>, BuildError> {
    // Sized for the terminator up front: `from_string` pushes it onto an exact-size copy
    // (a reallocation) and then wraps the vector in a second allocation.
    let mut bytes = Vec::with_capacity(value.len() + 1);
    bytes.extend_from_slice(value.as_bytes());
    bytes.push(0);
    COctetString::from_bytes(bytes::Bytes::from(bytes)).map_err(|err| BuildError {
        field,
        reason: err.to_string(),
    })
}

/// `generic_nack` (SMPP 3.4 §4.3): the answer to a PDU that could not be decoded.
pub fn generic_nack(seq: u32, status: CommandStatus) -> Command {
    Command::new(status, seq, Pdu::GenericNack)
}

/// `enquire_link` (§4.11.1).
pub fn enquire_link(seq: u32) -> Command {
    Command::new(CommandStatus::EsmeRok, seq, Pdu::EnquireLink)
}

/// `enquire_link_resp` (§4.11.2); always ESME_ROK.
pub fn enquire_link_resp(seq: u32) -> Command {
    Command::new(CommandStatus::EsmeRok, seq, Pdu::EnquireLinkResp)
}

/// `unbind` (§4.2.1).
pub fn unbind(seq: u32) -> Command {
    Command::new(CommandStatus::EsmeRok, seq, Pdu::Unbind)
}

/// `unbind_resp` (§4.2.2).
pub fn unbind_resp(seq: u32) -> Command {
    Command::new(CommandStatus::EsmeRok, seq, Pdu::UnbindResp)
}

/// `submit_sm_resp` (§4.4.2) carrying `message_id` (at most 64 ASCII characters).
///
/// With an error status the message_id is still sent (empty is fine): SMPP 3.4 says the
/// body is omitted on error, but an empty C-string is what most ESMEs expect and accept.
pub fn submit_sm_resp(seq: u32, status: CommandStatus, message_id: &str) -> Result<Command, BuildError> {
    let resp = SubmitSmResp::builder()
        .message_id(c_string("message_id", message_id)?)
        .build();
    Ok(Command::new(status, seq, resp))
}

/// `deliver_sm_resp` (§4.6.2); message_id is unused and sent as NULL.
pub fn deliver_sm_resp(seq: u32, status: CommandStatus) -> Command {
    Command::new(status, seq, DeliverSmResp::builder().build())
}

/// The three bind flavours, so sessions can handle them with one code path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BindKind {
    Transmitter,
    Receiver,
    Transceiver,
}

impl BindKind {
    /// The bind kind of a bind request or response command id.
    pub fn from_command_id(id: CommandId) -> Option<BindKind> {
        match id {
            CommandId::BindTransmitter | CommandId::BindTransmitterResp => Some(BindKind::Transmitter),
            CommandId::BindReceiver | CommandId::BindReceiverResp => Some(BindKind::Receiver),
            CommandId::BindTransceiver | CommandId::BindTransceiverResp => Some(BindKind::Transceiver),
            _ => None,
        }
    }

    /// May a session bound this way submit messages (submit_sm)?
    pub fn can_transmit(self) -> bool {
        matches!(self, BindKind::Transmitter | BindKind::Transceiver)
    }

    /// May a session bound this way receive messages (deliver_sm)?
    pub fn can_receive(self) -> bool {
        matches!(self, BindKind::Receiver | BindKind::Transceiver)
    }
}

/// What a client puts in a bind request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BindCredentials<'a> {
    /// At most 15 characters.
    pub system_id: &'a str,
    /// At most 8 characters.
    pub password: &'a str,
    /// At most 12 characters; usually empty.
    pub system_type: &'a str,
}

/// A bind request of `kind` (§4.1), interface_version 0x34, address range empty.
pub fn bind(kind: BindKind, seq: u32, creds: &BindCredentials<'_>) -> Result<Command, BuildError> {
    let system_id = c_string("system_id", creds.system_id)?;
    let password = c_string("password", creds.password)?;
    let system_type = c_string("system_type", creds.system_type)?;
    let version = InterfaceVersion::Smpp3_4;
    let (ton, npi, range) = (Ton::Unknown, Npi::Unknown, COctetString::empty());
    let pdu: Pdu = match kind {
        BindKind::Transmitter => {
            BindTransmitter::new(system_id, password, system_type, version, ton, npi, range).into()
        }
        BindKind::Receiver => BindReceiver::new(system_id, password, system_type, version, ton, npi, range).into(),
        BindKind::Transceiver => {
            BindTransceiver::new(system_id, password, system_type, version, ton, npi, range).into()
        }
    };
    Ok(Command::new(CommandStatus::EsmeRok, seq, pdu))
}

/// The bind response matching `kind` (§4.1), carrying our `system_id` (at most 15
/// characters). No sc_interface_version TLV: we answer as a 3.4 SMSC.
pub fn bind_resp(kind: BindKind, seq: u32, status: CommandStatus, system_id: &str) -> Result<Command, BuildError> {
    let system_id = c_string("system_id", system_id)?;
    let pdu: Pdu = match kind {
        BindKind::Transmitter => BindTransmitterResp::new(system_id, None).into(),
        BindKind::Receiver => BindReceiverResp::new(system_id, None).into(),
        BindKind::Transceiver => BindTransceiverResp::new(system_id, None).into(),
    };
    Ok(Command::new(status, seq, pdu))
}

/// An SMPP address: type of number, numbering plan, digits (at most 20 characters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Address<'a> {
    pub ton: u8,
    pub npi: u8,
    pub addr: &'a str,
}

/// The fields of a submit_sm / deliver_sm that Sendium sets. Everything not listed is
/// sent as its SMPP "default/NULL" value (service_type, protocol_id, priority,
/// schedule/validity, replace_if_present, sm_default_msg_id all 0 / empty).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShortMessage<'a> {
    pub source: Address<'a>,
    pub destination: Address<'a>,
    /// Set explicitly on purpose: 0x00 plain, 0x40 with a UDH, 0x04 a delivery receipt.
    pub esm_class: u8,
    pub registered_delivery: u8,
    pub data_coding: u8,
    /// At most 255 octets; use `message_payload` for more.
    pub short_message: &'a [u8],
    /// When set, sent as the message_payload TLV and `short_message` must be empty
    /// (SMPP 3.4 forbids both).
    pub message_payload: Option<&'a [u8]>,
    /// sar_msg_ref_num, sar_total_segments, sar_segment_seqnum.
    pub sar: Option<(u16, u8, u8)>,
}

struct CommonFields {
    source_addr: COctetString<1, 21>,
    destination_addr: COctetString<1, 21>,
    short_message: OctetString<0, 255>,
    message_payload: Option<MessagePayload>,
}

fn common_fields(sm: &ShortMessage<'_>) -> Result<CommonFields, BuildError> {
    if sm.message_payload.is_some() && !sm.short_message.is_empty() {
        return Err(BuildError {
            field: "short_message",
            reason: "must be empty when message_payload is used".to_owned(),
        });
    }
    Ok(CommonFields {
        source_addr: c_string("source_addr", sm.source.addr)?,
        destination_addr: c_string("destination_addr", sm.destination.addr)?,
        short_message: OctetString::from_slice(sm.short_message).map_err(|err| BuildError {
            field: "short_message",
            reason: err.to_string(),
        })?,
        message_payload: match sm.message_payload {
            None => None,
            Some(payload) if payload.len() > usize::from(u16::MAX) => {
                return Err(BuildError {
                    field: "message_payload",
                    reason: format!("{} octets is more than 65535", payload.len()),
                });
            }
            Some(payload) => Some(MessagePayload::new(AnyOctetString::from_slice(payload))),
        },
    })
}

/// A `submit_sm` (§4.4.1) as a client session sends it upstream.
pub fn submit_sm(seq: u32, sm: &ShortMessage<'_>) -> Result<Command, BuildError> {
    let fields = common_fields(sm)?;
    let mut tlvs = Vec::new();
    if let Some(payload) = fields.message_payload {
        tlvs.push(MessageSubmissionRequestTlvValue::MessagePayload(payload));
    }
    if let Some((reference, total, segment)) = sm.sar {
        tlvs.push(MessageSubmissionRequestTlvValue::SarMsgRefNum(reference));
        tlvs.push(MessageSubmissionRequestTlvValue::SarTotalSegments(total));
        tlvs.push(MessageSubmissionRequestTlvValue::SarSegmentSeqnum(segment));
    }
    let pdu = SubmitSm::new(
        ServiceType::null(),
        Ton::from(sm.source.ton),
        Npi::from(sm.source.npi),
        fields.source_addr,
        Ton::from(sm.destination.ton),
        Npi::from(sm.destination.npi),
        fields.destination_addr,
        EsmClass::from(sm.esm_class),
        0,
        PriorityFlag::from(0),
        EmptyOrFullCOctetString::empty(),
        EmptyOrFullCOctetString::empty(),
        RegisteredDelivery::from(sm.registered_delivery),
        ReplaceIfPresentFlag::DoNotReplace,
        DataCoding::from(sm.data_coding),
        0,
        fields.short_message,
        tlvs,
    );
    Ok(Command::new(CommandStatus::EsmeRok, seq, pdu))
}

/// Receipt TLVs of a deliver_sm (SMPP 3.4 §5.3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiptTlvs<'a> {
    /// receipted_message_id: the id from *this* ESME's submit_sm_resp.
    pub receipted_message_id: &'a str,
    /// message_state (§5.2.28), e.g. `ReceiptState::message_state()`.
    pub message_state: u8,
}

/// A `deliver_sm` (§4.6.1) as the server session sends it to an ESME: a mobile-originated
/// message (`receipt: None`) or a delivery receipt (esm_class 0x04 and the receipt text in
/// `short_message`, plus the receipt TLVs).
pub fn deliver_sm(seq: u32, sm: &ShortMessage<'_>, receipt: Option<&ReceiptTlvs<'_>>) -> Result<Command, BuildError> {
    let fields = common_fields(sm)?;
    let mut tlvs = Vec::new();
    if let Some(payload) = fields.message_payload {
        tlvs.push(MessageDeliveryRequestTlvValue::MessagePayload(payload));
    }
    if let Some((reference, total, segment)) = sm.sar {
        tlvs.push(MessageDeliveryRequestTlvValue::SarMsgRefNum(reference));
        tlvs.push(MessageDeliveryRequestTlvValue::SarTotalSegments(total));
        tlvs.push(MessageDeliveryRequestTlvValue::SarSegmentSeqnum(segment));
    }
    if let Some(receipt) = receipt {
        tlvs.push(MessageDeliveryRequestTlvValue::ReceiptedMessageId(c_string(
            "receipted_message_id",
            receipt.receipted_message_id,
        )?));
        tlvs.push(MessageDeliveryRequestTlvValue::MessageState(MessageState::from(
            receipt.message_state,
        )));
    }
    let pdu = DeliverSm::new(
        ServiceType::null(),
        Ton::from(sm.source.ton),
        Npi::from(sm.source.npi),
        fields.source_addr,
        Ton::from(sm.destination.ton),
        Npi::from(sm.destination.npi),
        fields.destination_addr,
        EsmClass::from(sm.esm_class),
        0,
        PriorityFlag::from(0),
        EmptyOrFullCOctetString::empty(),
        EmptyOrFullCOctetString::empty(),
        RegisteredDelivery::from(sm.registered_delivery),
        ReplaceIfPresentFlag::DoNotReplace,
        DataCoding::from(sm.data_coding),
        0,
        fields.short_message,
        tlvs,
    );
    Ok(Command::new(CommandStatus::EsmeRok, seq, pdu))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::smpp::frame::{decode_frame, encode};
    use bytes::BytesMut;

    fn wire(command: &Command) -> Vec<u8> {
        let mut buf = BytesMut::new();
        encode(command, &mut buf);
        buf.to_vec()
    }

    fn plain<'a>(text: &'a [u8]) -> ShortMessage<'a> {
        ShortMessage {
            source: Address {
                ton: 1,
                npi: 1,
                addr: "12345",
            },
            destination: Address {
                ton: 1,
                npi: 1,
                addr: "447700900123",
            },
            esm_class: 0x00,
            registered_delivery: 0x01,
            data_coding: 0x00,
            short_message: text,
            message_payload: None,
            sar: None,
        }
    }

    #[test]
    fn submit_sm_sets_esm_class_explicitly() {
        let bytes = wire(&submit_sm(1, &plain(b"hello")).unwrap());
        // header 16, service_type 1, ton/npi 2, "12345\0" 6, ton/npi 2, dest 13 → esm_class.
        assert_eq!(bytes[16 + 1 + 2 + 6 + 2 + 13], 0x00);
        let udh = ShortMessage {
            esm_class: 0x40,
            ..plain(b"\x05\x00\x03\x01\x02\x01hi")
        };
        let bytes = wire(&submit_sm(2, &udh).unwrap());
        assert_eq!(bytes[16 + 1 + 2 + 6 + 2 + 13], 0x40);
    }

    #[test]
    fn submit_sm_with_sar_and_payload_round_trips() {
        let payload = vec![b'x'; 400];
        let sm = ShortMessage {
            short_message: b"",
            message_payload: Some(&payload),
            sar: Some((0x1234, 3, 2)),
            ..plain(b"")
        };
        let command = submit_sm(3, &sm).unwrap();
        let bytes = wire(&command);
        assert_eq!(decode_frame(BytesMut::from(&bytes[..])).unwrap(), command);
        // sar_msg_ref_num TLV: tag 0x020C, length 2, value 0x1234.
        assert!(bytes.windows(6).any(|w| w == [0x02, 0x0C, 0x00, 0x02, 0x12, 0x34]));
    }

    #[test]
    fn deliver_sm_receipt_carries_tlvs() {
        let sm = ShortMessage {
            esm_class: 0x04,
            registered_delivery: 0,
            ..plain(b"id:abc stat:DELIVRD err:000")
        };
        let receipt = ReceiptTlvs {
            receipted_message_id: "abc",
            message_state: 2,
        };
        let command = deliver_sm(4, &sm, Some(&receipt)).unwrap();
        let bytes = wire(&command);
        assert_eq!(decode_frame(BytesMut::from(&bytes[..])).unwrap(), command);
        assert!(bytes.ends_with(&[
            0x00, 0x1E, 0x00, 0x04, b'a', b'b', b'c', 0, 0x04, 0x27, 0x00, 0x01, 0x02
        ]));
    }

    #[test]
    fn invalid_values_are_build_errors() {
        let long = "x".repeat(65);
        assert_eq!(
            submit_sm_resp(1, CommandStatus::EsmeRok, &long).unwrap_err().field,
            "message_id"
        );
        assert!(submit_sm_resp(1, CommandStatus::EsmeRok, &"x".repeat(64)).is_ok());
        assert_eq!(
            submit_sm_resp(1, CommandStatus::EsmeRok, "é").unwrap_err().field,
            "message_id"
        );
        assert_eq!(
            submit_sm_resp(1, CommandStatus::EsmeRok, "a\0b").unwrap_err().field,
            "message_id"
        );
        let creds = BindCredentials {
            system_id: "esme",
            password: "waytoolongpassword",
            system_type: "",
        };
        let err = bind(BindKind::Transmitter, 1, &creds).unwrap_err();
        assert_eq!(err.field, "password");
        assert!(!err.to_string().contains("waytoolong"));
        let long_sm = vec![0u8; 256];
        assert_eq!(submit_sm(1, &plain(&long_sm)).unwrap_err().field, "short_message");
        let both = ShortMessage {
            message_payload: Some(b"x"),
            ..plain(b"y")
        };
        assert_eq!(submit_sm(1, &both).unwrap_err().field, "short_message");
        let bad_addr = ShortMessage {
            destination: Address {
                ton: 1,
                npi: 1,
                addr: "123456789012345678901",
            },
            ..plain(b"")
        };
        assert_eq!(submit_sm(1, &bad_addr).unwrap_err().field, "destination_addr");
    }

    #[test]
    fn binds_round_trip_for_each_kind() {
        let creds = BindCredentials {
            system_id: "esme1",
            password: "secret",
            system_type: "",
        };
        for (kind, id) in [
            (BindKind::Transmitter, 0x02u32),
            (BindKind::Receiver, 0x01),
            (BindKind::Transceiver, 0x09),
        ] {
            let command = bind(kind, 5, &creds).unwrap();
            assert_eq!(u32::from(command.id()), id);
            assert_eq!(BindKind::from_command_id(command.id()), Some(kind));
            let bytes = wire(&command);
            assert_eq!(decode_frame(BytesMut::from(&bytes[..])).unwrap(), command);
            let resp = bind_resp(kind, 5, CommandStatus::EsmeRbindfail, "sendium").unwrap();
            assert_eq!(u32::from(resp.id()), id | 0x8000_0000);
            assert_eq!(BindKind::from_command_id(resp.id()), Some(kind));
        }
        assert!(BindKind::Transceiver.can_transmit() && BindKind::Transceiver.can_receive());
        assert!(!BindKind::Receiver.can_transmit());
        assert!(!BindKind::Transmitter.can_receive());
        assert_eq!(BindKind::from_command_id(CommandId::SubmitSm), None);
    }
}
