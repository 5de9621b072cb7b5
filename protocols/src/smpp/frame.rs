//! SMPP framing: splitting a byte stream into PDUs, decoding each PDU on its own, and
//! encoding PDUs back into a buffer.
//!
//! Why not rusmpp's own `CommandCodec`: after one PDU with a bad body it loses sync (the next
//! decode reads a garbage length), so one malformed `submit_sm` would kill a session carrying
//! thousands of good ones. Instead the stream is cut into frames by
//! [`tokio_util::codec::LengthDelimitedCodec`] — which only trusts `command_length` — and
//! [`decode_frame`] decodes each frame in isolation. A frame that fails to decode yields a
//! [`FrameError`] carrying the header fields needed to answer it, and the next frame in the
//! same read is unaffected.
//!
//! The builders the sessions answer with live in [`crate::smpp::build`] and are re-exported
//! here, so `smpp::frame::generic_nack(..)` and friends sit next to the codec.

use bytes::{Buf, BufMut, BytesMut};
use rusmpp::decode::{COctetStringDecodeError, DecodeError, DecodeErrorKind, DecodeWithLength, OctetStringDecodeError};
use rusmpp::encode::Length;
use rusmpp::fields::SmppField;
use rusmpp::{Command, CommandId, CommandStatus};
use tokio_util::codec::{LengthDelimitedCodec, LengthDelimitedCodecError};

pub use crate::smpp::build::*;

/// Length of the SMPP header: command_length, command_id, command_status, sequence_number.
pub const HEADER_LEN: usize = 16;

/// A sensible default for [`codec`]'s `max_command_length`.
///
/// The largest legitimate PDU Sendium expects is a `submit_sm`/`deliver_sm` carrying a
/// `message_payload` TLV of up to 64 KiB plus its fixed fields; 70 000 octets covers that
/// with room to spare while still refusing absurd lengths (a hostile or desynchronised peer
/// announcing 4 GiB) before anything is allocated.
pub const DEFAULT_MAX_COMMAND_LENGTH: u32 = 70_000;

/// Builds the frame splitter for an SMPP byte stream.
///
/// Each yielded frame is the *whole* PDU, its 4-byte `command_length` included, because
/// [`decode_frame`] re-reads the header from the frame (it needs `command_id` and
/// `sequence_number` even when the body is garbage). SMPP's length counts itself, so:
///
/// - `length_field_length(4)` at offset 0, big endian;
/// - `length_adjustment(0)`: the field value already is the frame length;
/// - `num_skip(0)`: keep the length field in the frame (the default skips it).
///
/// (`length_adjustment(-4)` with the default `num_skip` also works but strips the length
/// field; `length_adjustment(-4).num_skip(0)` yields every frame 4 bytes short.)
///
/// `max_frame_length(max_command_length)` is checked against the raw `command_length`
/// *before* the codec reserves buffer space, so an absurd length is an error without an
/// allocation; see [`is_frame_too_long`].
///
/// What the codec does **not** check is a `command_length` below 16: such a frame is
/// yielded as is and [`decode_frame`] rejects it with [`FrameErrorKind::TooShort`]. A
/// `command_length` of 0 is yielded as an empty frame *without consuming anything*, so the
/// session must close the connection on any error for which [`FrameError::must_close`] is
/// true (it is for every length error), or it would read the same empty frame forever.
///
/// Only the decoder half is meant to be used: write PDUs with [`encode`] (the codec's
/// encoder would prepend a second length).
pub fn codec(max_command_length: u32) -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .big_endian()
        .length_field_offset(0)
        .length_field_length(4)
        .length_adjustment(0)
        .num_skip(0)
        .max_frame_length(usize::try_from(max_command_length).unwrap_or(usize::MAX))
        .new_codec()
}

/// True when an error returned by [`codec`]'s decoder means "command_length above the
/// maximum".
///
/// The session answers it like a bad length (`generic_nack` with `ESME_RINVCMDLEN`, the
/// sequence number from [`peek_header`]) and then closes: the codec does not skip the
/// oversized PDU, so the stream cannot be resynchronised.
pub fn is_frame_too_long(err: &std::io::Error) -> bool {
    err.get_ref()
        .is_some_and(|inner| inner.is::<LengthDelimitedCodecError>())
}

/// The four header fields as they appear on the wire, without any interpretation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RawHeader {
    pub command_length: u32,
    pub command_id: u32,
    pub command_status: u32,
    pub sequence_number: u32,
}

/// Reads the SMPP header at the start of `buf`, if 16 bytes are there.
///
/// Used when the codec refuses a frame (too long) and the session still wants to answer
/// with the offender's sequence number.
pub fn peek_header(buf: &[u8]) -> Option<RawHeader> {
    Some(RawHeader {
        command_length: be_u32(buf, 0)?,
        command_id: be_u32(buf, 4)?,
        command_status: be_u32(buf, 8)?,
        sequence_number: be_u32(buf, 12)?,
    })
}

fn be_u32(buf: &[u8], at: usize) -> Option<u32> {
    let end = at.checked_add(4)?;
    let bytes: [u8; 4] = buf.get(at..end)?.try_into().ok()?;
    Some(u32::from_be_bytes(bytes))
}

/// A frame that could not be turned into a [`Command`].
///
/// It carries what the caller needs to answer the peer: the raw `command_id` and
/// `sequence_number` (0 when the frame was too short to hold them) and the [`kind`] of
/// failure, from which [`nack_status`](FrameError::nack_status) derives the status.
///
/// [`kind`]: FrameError::kind
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad SMPP PDU (command_id {command_id:#010x}, sequence_number {sequence_number}): {kind}")]
pub struct FrameError {
    pub command_id: u32,
    pub sequence_number: u32,
    pub kind: FrameErrorKind,
}

/// Why a frame was refused. Messages name fields and lengths, never field contents (they
/// may be message bodies or passwords).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameErrorKind {
    /// Fewer than 16 bytes, or a `command_length` below 16. The framing itself is suspect.
    #[error("PDU of {length} bytes is shorter than the 16-byte header")]
    TooShort { length: usize },
    /// `command_length` disagrees with the frame handed to [`decode_frame`] (only possible
    /// when the frame did not come from [`codec`]).
    #[error("command_length {declared} does not match the {actual}-byte frame")]
    LengthMismatch { declared: u32, actual: usize },
    /// `command_id` is not an SMPP command.
    #[error("unknown command_id")]
    UnknownCommand,
    /// A request that needs a body (submit_sm, bind_…) arrived with only the header.
    #[error("the PDU has no body but its command requires one")]
    MissingBody,
    /// A body-less command (enquire_link, unbind, generic_nack …) arrived with a body.
    #[error("{length} body bytes on a command that has no body")]
    UnexpectedBody { length: usize },
    /// A request's body decoded but `command_length` says there are more bytes after it.
    /// (Unread bytes after a *response* body are ignored, see [`decode_frame`].)
    #[error("{unread} bytes left after the last field")]
    TrailingBytes { unread: usize },
    /// The body does not decode. `field` is the innermost SMPP field rusmpp blamed,
    /// `status` the SMPP status chosen for it (see [`FrameError::nack_status`]).
    #[error("malformed body ({detail})")]
    MalformedBody {
        field: Option<SmppField>,
        status: CommandStatus,
        detail: String,
    },
}

impl FrameError {
    /// The `command_status` for the `generic_nack` answering this frame.
    ///
    /// Per SMPP 3.4 §4.3 `generic_nack` reports header problems:
    ///
    /// - unknown `command_id` → `ESME_RINVCMDID`;
    /// - a bad length (too short, not matching the frame, a body where none is allowed, a
    ///   missing body, trailing bytes) → `ESME_RINVCMDLEN`;
    /// - a body that does not decode → the §5.1.3 status of the field that failed when
    ///   rusmpp names one (`short_message`/`sm_length` → `ESME_RINVMSGLEN`, `source_addr` → `ESME_RINVSRCADR`, `destination_addr` →
    ///   `ESME_RINVDSTADR`, `system_id` → `ESME_RINVSYSID`, `password` → `ESME_RINVPASWD`,
    ///   `system_type` → `ESME_RINVSYSTYP`, `service_type` → `ESME_RINVSERTYP`,
    ///   `schedule_delivery_time` → `ESME_RINVSCHED`, `validity_period` →
    ///   `ESME_RINVEXPIRY`, `message_id` → `ESME_RINVMSGID`, `esm_class` →
    ///   `ESME_RINVESMCLASS`, any TLV — message_payload included, rusmpp blames the TLV
    ///   stream — → `ESME_RINVOPTPARSTREAM` (0xC0)); otherwise
    ///   `ESME_RINVCMDLEN` when the body ran out or a field overran its maximum (the
    ///   length is what is wrong), and `ESME_RSYSERR` — 3.4's "could not process" — for
    ///   anything else (e.g. a non-ASCII C-string).
    pub fn nack_status(&self) -> CommandStatus {
        match &self.kind {
            FrameErrorKind::UnknownCommand => CommandStatus::EsmeRinvcmdid,
            FrameErrorKind::TooShort { .. }
            | FrameErrorKind::LengthMismatch { .. }
            | FrameErrorKind::MissingBody
            | FrameErrorKind::UnexpectedBody { .. }
            | FrameErrorKind::TrailingBytes { .. } => CommandStatus::EsmeRinvcmdlen,
            FrameErrorKind::MalformedBody { status, .. } => *status,
        }
    }

    /// True when the byte stream can no longer be trusted and the session must close after
    /// answering: a `command_length` below 16 (with 0 the codec never advances) or one
    /// that does not match the frame. Every other error leaves the next frame intact.
    pub fn must_close(&self) -> bool {
        matches!(
            self.kind,
            FrameErrorKind::TooShort { .. } | FrameErrorKind::LengthMismatch { .. }
        )
    }

    /// The `generic_nack` to send back, or `None` when the offending PDU was itself a
    /// `generic_nack` (answering a nack with a nack lets two confused peers loop forever).
    pub fn reply(&self) -> Option<Command> {
        if self.command_id == u32::from(CommandId::GenericNack) {
            return None;
        }
        Some(generic_nack(self.sequence_number, self.nack_status()))
    }
}

/// Commands that never carry a body (rusmpp decodes them only from an empty body).
fn is_bodyless(id: CommandId) -> bool {
    matches!(
        id,
        CommandId::Unbind
            | CommandId::UnbindResp
            | CommandId::EnquireLink
            | CommandId::EnquireLinkResp
            | CommandId::GenericNack
            | CommandId::CancelSmResp
            | CommandId::ReplaceSmResp
            | CommandId::CancelBroadcastSmResp
    )
}

/// Decodes one whole PDU (as yielded by [`codec`]) into an owned [`Command`].
///
/// The frame is decoded on its own, so a bad frame never affects the next one.
///
/// A *response* whose body is empty (16-byte `submit_sm_resp`, `bind_…_resp` or
/// `deliver_sm_resp`, as SMSCs send with an error status, and some with `ESME_ROK`)
/// decodes to a `Command` whose `pdu()` is `None`: treat it as "no message_id". A request
/// without its body is [`FrameErrorKind::MissingBody`].
///
/// Bytes left after a response's last known field (e.g. a second TLV in a `bind_resp`,
/// where rusmpp reads only sc_interface_version) are ignored, as SMPP 3.4 asks of
/// unsupported optional parameters; after a request they are [`FrameErrorKind::TrailingBytes`].
///
/// Unknown command ids are refused here ([`FrameErrorKind::UnknownCommand`]) rather than
/// passed on as rusmpp's `Pdu::Other`. SMPP 5.0-only commands that rusmpp knows
/// (broadcast_sm …) do decode; the session decides whether it supports them.
pub fn decode_frame(mut frame: BytesMut) -> Result<Command, FrameError> {
    let length = frame.len();
    let command_id = be_u32(&frame, 4).unwrap_or(0);
    let sequence_number = be_u32(&frame, 12).unwrap_or(0);
    let fail = |kind| FrameError {
        command_id,
        sequence_number,
        kind,
    };

    let Some(declared) = be_u32(&frame, 0) else {
        return Err(fail(FrameErrorKind::TooShort { length }));
    };
    let declared_len = usize::try_from(declared).unwrap_or(usize::MAX);
    if declared_len < HEADER_LEN {
        return Err(fail(FrameErrorKind::TooShort { length: declared_len }));
    }
    if declared_len != length {
        return Err(fail(FrameErrorKind::LengthMismatch {
            declared,
            actual: length,
        }));
    }

    let id = CommandId::from(command_id);
    if matches!(id, CommandId::Other(_)) {
        return Err(fail(FrameErrorKind::UnknownCommand));
    }

    let body_len = length - HEADER_LEN;
    // rusmpp decodes from command_id on: drop the length field, tell it how much follows.
    frame.advance(4);
    let after_length = length - 4;
    let (command, consumed) = match <Command as DecodeWithLength>::decode(&mut frame, after_length) {
        Ok(decoded) => decoded,
        Err(err) => {
            let (field, status) = classify(&err);
            return Err(fail(FrameErrorKind::MalformedBody {
                field,
                status,
                detail: err.to_string(),
            }));
        }
    };

    if command.pdu().is_none() {
        if body_len > 0 {
            // rusmpp returns no PDU for a body-less command that has a body.
            return Err(fail(FrameErrorKind::UnexpectedBody { length: body_len }));
        }
        if id.is_operation() && !is_bodyless(id) {
            return Err(fail(FrameErrorKind::MissingBody));
        }
    }
    // Responses are allowed unread bytes: SMPP 3.4 tells a receiver to ignore optional
    // parameters it does not support, and an SMSC that adds a vendor TLV to its
    // bind_resp (rusmpp reads at most one TLV there) must not keep a destination unbound.
    // A request is ours to judge, and extra bytes mean a wrong command_length.
    if consumed != after_length && !id.is_response() {
        return Err(fail(FrameErrorKind::TrailingBytes {
            unread: after_length.saturating_sub(consumed),
        }));
    }
    Ok(command)
}

/// Picks the field to blame and the SMPP status for a body decode error.
fn classify(err: &DecodeError) -> (Option<SmppField>, CommandStatus) {
    // The verbose source chain runs from the outermost field (the PDU) to the innermost.
    let mut fields = Vec::new();
    let mut innermost = err;
    while let Some(source) = innermost.source() {
        fields.push(source.field());
        innermost = source.error();
    }

    // The outermost field with a specific status: inner fields are often generic
    // names (`value`, `tag`) of a wrapper type whose meaning the outer field carries.
    if let Some((field, status)) = fields
        .iter()
        .find_map(|field| field_status(*field).map(|status| (*field, status)))
    {
        return (Some(field), status);
    }

    let field = fields.iter().rev().find(|field| **field != SmppField::pdu).copied();
    let status = match innermost.kind() {
        DecodeErrorKind::UnexpectedEof | DecodeErrorKind::TooManyElements { .. } => CommandStatus::EsmeRinvcmdlen,
        DecodeErrorKind::COctetStringDecodeError(
            COctetStringDecodeError::TooFewBytes { .. } | COctetStringDecodeError::NotNullTerminated,
        ) => CommandStatus::EsmeRinvcmdlen,
        DecodeErrorKind::OctetStringDecodeError(
            OctetStringDecodeError::TooFewBytes { .. } | OctetStringDecodeError::TooManyBytes { .. },
        ) => CommandStatus::EsmeRinvcmdlen,
        _ => CommandStatus::EsmeRsyserr,
    };
    (field, status)
}

/// The SMPP 3.4 §5.1.3 status that names a problem with `field`, if there is one.
fn field_status(field: SmppField) -> Option<CommandStatus> {
    Some(match field {
        SmppField::short_message | SmppField::sm_length | SmppField::message_payload => CommandStatus::EsmeRinvmsglen,
        SmppField::source_addr => CommandStatus::EsmeRinvsrcadr,
        SmppField::destination_addr | SmppField::dest_address => CommandStatus::EsmeRinvdstadr,
        SmppField::system_id => CommandStatus::EsmeRinvsysid,
        SmppField::password => CommandStatus::EsmeRinvpaswd,
        SmppField::system_type => CommandStatus::EsmeRinvsystyp,
        SmppField::service_type => CommandStatus::EsmeRinvsertyp,
        SmppField::schedule_delivery_time => CommandStatus::EsmeRinvsched,
        SmppField::validity_period => CommandStatus::EsmeRinvexpiry,
        SmppField::message_id => CommandStatus::EsmeRinvmsgid,
        SmppField::esm_class => CommandStatus::EsmeRinvesmclass,
        SmppField::number_of_dests => CommandStatus::EsmeRinvnumdests,
        // ESME_RINVOPTPARSTREAM in SMPP 3.4, ESME_RINVTLVSTREAM in 5.0 (both 0xC0).
        SmppField::tlvs => CommandStatus::EsmeRinvtlvstream,
        _ => return None,
    })
}

/// Appends `command` as one complete PDU (command_length first) to `dst`.
///
/// Appending rather than returning a buffer lets a session encode a whole batch of
/// responses into one buffer and write it with one syscall.
pub fn encode(command: &Command, dst: &mut BytesMut) {
    // rusmpp's length covers everything after command_length.
    let total = command.length().saturating_add(4);
    dst.reserve(total);
    // No rusmpp PDU comes near 4 GiB (every field is bounded); saturate rather than wrap.
    dst.put_u32(u32::try_from(total).unwrap_or(u32::MAX));
    rusmpp::encode::owned::Encode::encode(command, dst);
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusmpp::pdus::{BindTransceiver, DeliverSm, SubmitSm};
    use rusmpp::tlvs::MessageDeliveryRequestTlvValue;
    use rusmpp::types::{COctetString, EmptyOrFullCOctetString, OctetString};
    use rusmpp::values::{
        DataCoding, EsmClass, InterfaceVersion, MessageState, Npi, PriorityFlag, RegisteredDelivery,
        ReplaceIfPresentFlag, ServiceType, Ton,
    };
    use tokio_util::codec::Decoder;

    /// Builds a PDU from a command id, status, sequence and hand-written body, computing
    /// command_length, so the expected bytes in each test read like the spec's tables.
    fn pdu(command_id: u32, status: u32, seq: u32, body: &[&[u8]]) -> Vec<u8> {
        let body: Vec<u8> = body.concat();
        let mut out = Vec::new();
        out.extend_from_slice(&u32::try_from(16 + body.len()).unwrap().to_be_bytes());
        out.extend_from_slice(&command_id.to_be_bytes());
        out.extend_from_slice(&status.to_be_bytes());
        out.extend_from_slice(&seq.to_be_bytes());
        out.extend_from_slice(&body);
        out
    }

    fn encoded(command: &Command) -> Vec<u8> {
        let mut buf = BytesMut::new();
        encode(command, &mut buf);
        buf.to_vec()
    }

    /// Runs `wire` through the codec and decode_frame, returning every result in order.
    fn decode_all(wire: &[u8]) -> Vec<Result<Command, FrameError>> {
        let mut codec = codec(DEFAULT_MAX_COMMAND_LENGTH);
        let mut buf = BytesMut::from(wire);
        let mut out = Vec::new();
        while let Some(frame) = codec.decode(&mut buf).unwrap() {
            let result = decode_frame(frame);
            let stop = result.as_ref().is_err_and(FrameError::must_close);
            out.push(result);
            if stop {
                break;
            }
        }
        assert!(buf.is_empty(), "codec left {} bytes", buf.len());
        out
    }

    fn round_trip(command: &Command, expected: &[u8]) {
        assert_eq!(encoded(command), expected, "encoding differs from the spec layout");
        let decoded = decode_all(expected);
        assert_eq!(decoded.len(), 1);
        assert_eq!(decoded[0].as_ref().unwrap(), command);
    }

    fn c<const MIN: usize, const MAX: usize>(s: &str) -> COctetString<MIN, MAX> {
        COctetString::from_string(s.to_owned()).unwrap()
    }

    fn sample_submit_sm(seq: u32) -> Command {
        let sm = SubmitSm::builder()
            .service_type(ServiceType::null())
            .source_addr_ton(Ton::International)
            .source_addr_npi(Npi::Isdn)
            .source_addr(c("12345"))
            .dest_addr_ton(Ton::International)
            .dest_addr_npi(Npi::Isdn)
            .destination_addr(c("447700900123"))
            .esm_class(EsmClass::from(0x00))
            .protocol_id(0)
            .priority_flag(PriorityFlag::from(0))
            .schedule_delivery_time(EmptyOrFullCOctetString::empty())
            .validity_period(EmptyOrFullCOctetString::empty())
            .registered_delivery(RegisteredDelivery::from(0x01))
            .replace_if_present_flag(ReplaceIfPresentFlag::DoNotReplace)
            .data_coding(DataCoding::McSpecific)
            .sm_default_msg_id(0)
            .short_message(OctetString::from_static_slice(b"hello").unwrap())
            .build();
        Command::new(CommandStatus::EsmeRok, seq, sm)
    }

    fn sample_submit_sm_bytes(seq: u32) -> Vec<u8> {
        pdu(
            0x0000_0004,
            0,
            seq,
            &[
                b"\0",               // service_type ""
                &[0x01, 0x01],       // source_addr_ton, source_addr_npi
                b"12345\0",          // source_addr
                &[0x01, 0x01],       // dest_addr_ton, dest_addr_npi
                b"447700900123\0",   // destination_addr
                &[0x00, 0x00, 0x00], // esm_class, protocol_id, priority_flag
                b"\0\0",             // schedule_delivery_time, validity_period
                &[0x01, 0x00, 0x00], // registered_delivery, replace_if_present, data_coding
                &[0x00, 0x05],       // sm_default_msg_id, sm_length
                b"hello",            // short_message
            ],
        )
    }

    #[test]
    fn codec_yields_whole_pdus_including_command_length() {
        let mut wire = BytesMut::new();
        encode(&enquire_link(7), &mut wire);
        encode(&sample_submit_sm(8), &mut wire);
        let mut codec = codec(DEFAULT_MAX_COMMAND_LENGTH);
        let first = codec.decode(&mut wire).unwrap().unwrap();
        assert_eq!(&first[..], &pdu(0x15, 0, 7, &[])[..]);
        let second = codec.decode(&mut wire).unwrap().unwrap();
        assert_eq!(&second[..], &sample_submit_sm_bytes(8)[..]);
        assert!(codec.decode(&mut wire).unwrap().is_none());
    }

    #[test]
    fn codec_waits_for_partial_pdus() {
        let wire = sample_submit_sm_bytes(3);
        let mut codec = codec(DEFAULT_MAX_COMMAND_LENGTH);
        let mut buf = BytesMut::new();
        for (i, byte) in wire.iter().enumerate() {
            buf.put_u8(*byte);
            let frame = codec.decode(&mut buf).unwrap();
            if i + 1 < wire.len() {
                assert!(frame.is_none(), "frame yielded after {} bytes", i + 1);
            } else {
                assert_eq!(decode_frame(frame.unwrap()).unwrap(), sample_submit_sm(3));
            }
        }
    }

    #[test]
    fn bind_transceiver_round_trip() {
        let bind = BindTransceiver::builder()
            .system_id(c("esme1"))
            .password(c("secret"))
            .system_type(c(""))
            .interface_version(InterfaceVersion::Smpp3_4)
            .addr_ton(Ton::Unknown)
            .addr_npi(Npi::Unknown)
            .address_range(c(""))
            .build();
        let command = Command::new(CommandStatus::EsmeRok, 1, bind);
        let expected = pdu(
            0x0000_0009,
            0,
            1,
            &[b"esme1\0", b"secret\0", b"\0", &[0x34, 0x00, 0x00], b"\0"],
        );
        assert_eq!(expected.len(), 34);
        round_trip(&command, &expected);
    }

    #[test]
    fn bind_transceiver_resp_round_trip() {
        let command = bind_resp(BindKind::Transceiver, 1, CommandStatus::EsmeRok, "sendium").unwrap();
        round_trip(&command, &pdu(0x8000_0009, 0, 1, &[b"sendium\0"]));
    }

    #[test]
    fn submit_sm_round_trip() {
        let expected = sample_submit_sm_bytes(2);
        assert_eq!(expected.len(), 55);
        round_trip(&sample_submit_sm(2), &expected);
    }

    #[test]
    fn submit_sm_resp_round_trip() {
        let command = submit_sm_resp(2, CommandStatus::EsmeRok, "0190c3e2-aa").unwrap();
        round_trip(&command, &pdu(0x8000_0004, 0, 2, &[b"0190c3e2-aa\0"]));
    }

    #[test]
    fn deliver_sm_receipt_round_trip() {
        let text =
            b"id:1a2b3c sub:001 dlvrd:001 submit date:2401011200 done date:2401011201 stat:DELIVRD err:000 text:hello";
        let mut sm = DeliverSm::builder()
            .service_type(ServiceType::null())
            .source_addr_ton(Ton::International)
            .source_addr_npi(Npi::Isdn)
            .source_addr(c("447700900123"))
            .dest_addr_ton(Ton::Unknown)
            .dest_addr_npi(Npi::Unknown)
            .destination_addr(c("12345"))
            .esm_class(EsmClass::from(0x04))
            .data_coding(DataCoding::McSpecific)
            .short_message(OctetString::from_static_slice(text).unwrap())
            .build();
        sm.push_tlv(MessageDeliveryRequestTlvValue::ReceiptedMessageId(c("1a2b3c")));
        sm.push_tlv(MessageDeliveryRequestTlvValue::MessageState(MessageState::Delivered));
        let command = Command::new(CommandStatus::EsmeRok, 9, sm);
        let sm_length = [u8::try_from(text.len()).unwrap()];
        let expected = pdu(
            0x0000_0005,
            0,
            9,
            &[
                b"\0",
                &[0x01, 0x01],
                b"447700900123\0",
                &[0x00, 0x00],
                b"12345\0",
                &[0x04, 0x00, 0x00], // esm_class = SMSC delivery receipt
                b"\0\0",
                &[0x00, 0x00, 0x00],
                &[0x00],
                &sm_length,
                text,
                &[0x00, 0x1E, 0x00, 0x07], // receipted_message_id, length 7
                b"1a2b3c\0",
                &[0x04, 0x27, 0x00, 0x01, 0x02], // message_state = DELIVERED
            ],
        );
        round_trip(&command, &expected);
    }

    #[test]
    fn deliver_sm_resp_round_trip() {
        // SMPP 3.4 §4.6.2: message_id is unused and set to NULL.
        round_trip(
            &deliver_sm_resp(4, CommandStatus::EsmeRok),
            &pdu(0x8000_0005, 0, 4, &[b"\0"]),
        );
    }

    #[test]
    fn enquire_link_unbind_and_generic_nack_round_trip() {
        round_trip(&enquire_link(5), &pdu(0x0000_0015, 0, 5, &[]));
        round_trip(&enquire_link_resp(5), &pdu(0x8000_0015, 0, 5, &[]));
        round_trip(&unbind(6), &pdu(0x0000_0006, 0, 6, &[]));
        round_trip(&unbind_resp(6), &pdu(0x8000_0006, 0, 6, &[]));
        round_trip(
            &generic_nack(7, CommandStatus::EsmeRinvcmdid),
            &pdu(0x8000_0000, 3, 7, &[]),
        );
    }

    #[test]
    fn empty_response_bodies_decode_without_pdu() {
        for id in [0x8000_0004u32, 0x8000_0005, 0x8000_0009] {
            let cmd = decode_frame(BytesMut::from(&pdu(id, 0x58, 11, &[])[..])).unwrap();
            assert_eq!(u32::from(cmd.id()), id);
            assert_eq!(cmd.status(), CommandStatus::EsmeRthrottled);
            assert_eq!(cmd.sequence_number(), 11);
            assert!(cmd.pdu().is_none());
        }
    }

    #[test]
    fn request_without_body_is_missing_body() {
        let err = decode_frame(BytesMut::from(&pdu(0x04, 0, 12, &[])[..])).unwrap_err();
        assert_eq!(err.kind, FrameErrorKind::MissingBody);
        assert_eq!(err.sequence_number, 12);
        assert_eq!(err.nack_status(), CommandStatus::EsmeRinvcmdlen);
    }

    #[test]
    fn bodyless_command_with_body_is_refused() {
        let err = decode_frame(BytesMut::from(&pdu(0x15, 0, 13, &[b"xx"])[..])).unwrap_err();
        assert_eq!(err.kind, FrameErrorKind::UnexpectedBody { length: 2 });
        assert_eq!(err.nack_status(), CommandStatus::EsmeRinvcmdlen);
        assert!(!err.must_close());
    }

    #[test]
    fn trailing_bytes_after_a_fixed_body_are_refused() {
        let err = decode_frame(BytesMut::from(
            &pdu(0x09, 0, 14, &[b"a\0b\0\0", &[0x34, 0, 0], b"\0", b"junk"])[..],
        ))
        .unwrap_err();
        assert_eq!(err.kind, FrameErrorKind::TrailingBytes { unread: 4 });
        assert_eq!(err.sequence_number, 14);
    }

    #[test]
    fn extra_tlvs_after_a_response_are_ignored() {
        let wire = pdu(
            0x8000_0009,
            0,
            15,
            &[
                b"smsc\0",
                &[0x02, 0x10, 0x00, 0x01, 0x34],       // sc_interface_version
                &[0x14, 0x00, 0x00, 0x02, 0xAB, 0xCD], // a vendor TLV
            ],
        );
        let cmd = decode_frame(BytesMut::from(&wire[..])).unwrap();
        assert_eq!(cmd.sequence_number(), 15);
        assert!(matches!(cmd.pdu(), Some(rusmpp::Pdu::BindTransceiverResp(_))));
    }

    /// submit_sm bytes cut `cut` bytes before the end, with command_length fixed up so the
    /// frame itself is consistent and only the body is short.
    fn truncated_submit_sm(seq: u32, cut: usize) -> Vec<u8> {
        let mut bytes = sample_submit_sm_bytes(seq);
        bytes.truncate(bytes.len() - cut);
        let len = u32::try_from(bytes.len()).unwrap().to_be_bytes();
        bytes[..4].copy_from_slice(&len);
        bytes
    }

    #[test]
    fn malformed_body_keeps_sequence_and_next_pdu_decodes() {
        // Truncated in the middle of short_message ("hel" of "hello").
        let mut wire = truncated_submit_sm(41, 2);
        wire.extend_from_slice(&sample_submit_sm_bytes(42));
        let results = decode_all(&wire);
        assert_eq!(results.len(), 2);
        let err = results[0].as_ref().unwrap_err();
        assert_eq!(err.sequence_number, 41);
        assert_eq!(err.command_id, 0x04);
        assert!(matches!(
            err.kind,
            FrameErrorKind::MalformedBody {
                field: Some(SmppField::short_message),
                ..
            }
        ));
        assert_eq!(err.nack_status(), CommandStatus::EsmeRinvmsglen);
        assert!(!err.must_close());
        assert_eq!(err.reply().unwrap(), generic_nack(41, CommandStatus::EsmeRinvmsglen));
        assert_eq!(results[1].as_ref().unwrap(), &sample_submit_sm(42));
    }

    #[test]
    fn sm_length_beyond_the_body_is_malformed() {
        let mut bad = sample_submit_sm_bytes(50);
        let sm_length_at = bad.len() - 6;
        assert_eq!(bad[sm_length_at], 5);
        bad[sm_length_at] = 200;
        let mut wire = bad;
        wire.extend_from_slice(&pdu(0x15, 0, 51, &[]));
        let results = decode_all(&wire);
        let err = results[0].as_ref().unwrap_err();
        assert_eq!(err.sequence_number, 50);
        assert_eq!(err.nack_status(), CommandStatus::EsmeRinvmsglen);
        assert_eq!(results[1].as_ref().unwrap(), &enquire_link(51));
    }

    #[test]
    fn bad_fields_map_to_their_status() {
        // source_addr longer than 21 octets (no NUL within the maximum).
        let long_src = pdu(
            0x04,
            0,
            60,
            &[
                b"\0",
                &[1, 1],
                &[b'1'; 30],
                b"\0",
                &[1, 1],
                b"4477\0",
                &[0; 3],
                b"\0\0",
                &[0; 5],
            ],
        );
        let err = decode_frame(BytesMut::from(&long_src[..])).unwrap_err();
        assert_eq!(err.nack_status(), CommandStatus::EsmeRinvsrcadr, "{err}");

        // bind with a password longer than 8 characters.
        let long_pw = pdu(
            0x02,
            0,
            61,
            &[b"esme\0", b"muchtoolongpassword\0", b"\0", &[0x34, 0, 0], b"\0"],
        );
        let err = decode_frame(BytesMut::from(&long_pw[..])).unwrap_err();
        assert_eq!(err.nack_status(), CommandStatus::EsmeRinvpaswd, "{err}");
        assert_eq!(err.sequence_number, 61);
        // The error text never carries field contents.
        assert!(!err.to_string().contains("muchtoolong"));

        // A TLV whose length runs past the body.
        let mut bad_tlv = sample_submit_sm_bytes(62);
        bad_tlv.extend_from_slice(&[0x04, 0x24, 0x01, 0x00, b'x']);
        let len = u32::try_from(bad_tlv.len()).unwrap().to_be_bytes();
        bad_tlv[..4].copy_from_slice(&len);
        let err = decode_frame(BytesMut::from(&bad_tlv[..])).unwrap_err();
        assert_eq!(err.nack_status(), CommandStatus::EsmeRinvtlvstream, "{err}");
    }

    #[test]
    fn unknown_command_id_is_rinvcmdid() {
        let mut wire = pdu(0x0000_0777, 0, 70, &[b"whatever"]);
        wire.extend_from_slice(&pdu(0x15, 0, 71, &[]));
        let results = decode_all(&wire);
        let err = results[0].as_ref().unwrap_err();
        assert_eq!(err.kind, FrameErrorKind::UnknownCommand);
        assert_eq!(err.command_id, 0x777);
        assert_eq!(err.sequence_number, 70);
        assert_eq!(err.nack_status(), CommandStatus::EsmeRinvcmdid);
        assert_eq!(err.reply().unwrap(), generic_nack(70, CommandStatus::EsmeRinvcmdid));
        assert_eq!(results[1].as_ref().unwrap(), &enquire_link(71));
    }

    #[test]
    fn a_bad_generic_nack_is_not_answered() {
        let err = decode_frame(BytesMut::from(&pdu(0x8000_0000, 0, 72, &[b"x"])[..])).unwrap_err();
        assert!(err.reply().is_none());
    }

    #[test]
    fn short_command_length_is_an_error_that_closes() {
        for declared in [0u32, 3, 4, 8, 15] {
            let mut wire = declared.to_be_bytes().to_vec();
            wire.extend_from_slice(&[0, 0, 0, 0x15, 0, 0, 0, 0, 0, 0, 0, 9]);
            let mut codec = codec(DEFAULT_MAX_COMMAND_LENGTH);
            let mut buf = BytesMut::from(&wire[..]);
            let frame = codec.decode(&mut buf).unwrap().unwrap();
            let err = decode_frame(frame).unwrap_err();
            assert!(matches!(err.kind, FrameErrorKind::TooShort { .. }), "{declared}");
            assert_eq!(err.nack_status(), CommandStatus::EsmeRinvcmdlen);
            assert!(err.must_close());
        }
        // Pinned because it is why must_close exists: length 0 never advances the codec.
        let mut codec = codec(DEFAULT_MAX_COMMAND_LENGTH);
        let mut buf = BytesMut::from(&[0u8; 16][..]);
        assert!(codec.decode(&mut buf).unwrap().unwrap().is_empty());
        assert_eq!(buf.len(), 16);
    }

    #[test]
    fn decode_frame_refuses_tiny_and_mismatched_frames() {
        let err = decode_frame(BytesMut::from(&[0u8, 0][..])).unwrap_err();
        assert_eq!(err.kind, FrameErrorKind::TooShort { length: 2 });
        assert_eq!((err.command_id, err.sequence_number), (0, 0));

        let mut wire = pdu(0x15, 0, 80, &[]);
        wire.push(0);
        let err = decode_frame(BytesMut::from(&wire[..])).unwrap_err();
        assert_eq!(
            err.kind,
            FrameErrorKind::LengthMismatch {
                declared: 16,
                actual: 17
            }
        );
        assert_eq!(err.sequence_number, 80);
        assert!(err.must_close());
    }

    #[test]
    fn length_above_maximum_is_refused_without_allocating() {
        let mut codec = codec(1024);
        let mut buf = BytesMut::with_capacity(64);
        buf.extend_from_slice(&pdu(0x04, 0, 90, &[])[..]);
        buf[..4].copy_from_slice(&u32::MAX.to_be_bytes());
        let capacity = buf.capacity();
        let err = codec.decode(&mut buf).unwrap_err();
        assert!(is_frame_too_long(&err));
        assert_eq!(buf.capacity(), capacity, "the codec reserved space for the frame");
        assert_eq!(peek_header(&buf).unwrap().sequence_number, 90);

        // Exactly the maximum is still accepted (and then awaited).
        let mut buf = BytesMut::from(&1024u32.to_be_bytes()[..]);
        assert!(codec.decode(&mut buf).unwrap().is_none());
        // An I/O error is not mistaken for a length error.
        assert!(!is_frame_too_long(&std::io::Error::other("boom")));
    }

    #[test]
    fn many_pdus_are_encoded_into_one_buffer() {
        let mut buf = BytesMut::new();
        for seq in 0..100 {
            encode(&submit_sm_resp(seq, CommandStatus::EsmeRok, "id").unwrap(), &mut buf);
        }
        let results = decode_all(&buf);
        assert_eq!(results.len(), 100);
        for (seq, result) in results.into_iter().enumerate() {
            assert_eq!(result.unwrap().sequence_number(), u32::try_from(seq).unwrap());
        }
    }

    /// Tiny deterministic PRNG (xorshift64*), so the fuzz test is reproducible without a
    /// dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: usize) -> usize {
            usize::try_from(self.next() % u64::try_from(n.max(1)).unwrap()).unwrap()
        }
        fn byte(&mut self) -> u8 {
            self.next().to_be_bytes()[0]
        }
    }

    #[test]
    fn fuzz_random_truncated_and_mutated_frames_never_panic() {
        let mut rng = Rng(0x5EED_1234_ABCD_0001);
        let mut samples: Vec<Vec<u8>> = vec![
            sample_submit_sm_bytes(1),
            encoded(&enquire_link(2)),
            encoded(&generic_nack(3, CommandStatus::EsmeRsyserr)),
            encoded(&submit_sm_resp(4, CommandStatus::EsmeRok, "abc").unwrap()),
            encoded(&deliver_sm_resp(5, CommandStatus::EsmeRok)),
            encoded(&bind_resp(BindKind::Receiver, 6, CommandStatus::EsmeRok, "x").unwrap()),
            pdu(0x09, 0, 7, &[b"esme1\0", b"secret\0", b"\0", &[0x34, 0, 0], b"\0"]),
        ];
        let mut receipt = sample_submit_sm_bytes(8);
        receipt[7] = 0x05; // the same layout as deliver_sm
        receipt.extend_from_slice(&[0x04, 0x27, 0x00, 0x01, 0x02]);
        let len = u32::try_from(receipt.len()).unwrap().to_be_bytes();
        receipt[..4].copy_from_slice(&len);
        samples.push(receipt);

        let mut decoded_ok = 0usize;
        for round in 0..20_000 {
            let mut bytes = samples[rng.below(samples.len())].clone();
            match round % 4 {
                // Pure noise.
                0 => {
                    let n = rng.below(300);
                    bytes = (0..n).map(|_| rng.byte()).collect();
                }
                // Truncated body, length fixed up to match.
                1 => {
                    let keep = rng.below(bytes.len() + 1);
                    bytes.truncate(keep);
                    if bytes.len() >= 4 {
                        let len = u32::try_from(bytes.len()).unwrap().to_be_bytes();
                        bytes[..4].copy_from_slice(&len);
                    }
                }
                // Random byte mutations, anywhere (header included).
                2 => {
                    for _ in 0..=rng.below(6) {
                        let at = rng.below(bytes.len());
                        if let Some(b) = bytes.get_mut(at) {
                            *b = rng.byte();
                        }
                    }
                }
                // Mutated body behind an intact header, with random garbage appended.
                _ => {
                    for _ in 0..=rng.below(4) {
                        let at = 16 + rng.below(bytes.len().saturating_sub(16));
                        if let Some(b) = bytes.get_mut(at) {
                            *b = rng.byte();
                        }
                    }
                    for _ in 0..rng.below(8) {
                        bytes.push(rng.byte());
                    }
                    let len = u32::try_from(bytes.len()).unwrap().to_be_bytes();
                    bytes[..4].copy_from_slice(&len);
                }
            }

            // Direct decode of the frame …
            if decode_frame(BytesMut::from(&bytes[..])).is_ok() {
                decoded_ok += 1;
            }
            // … and through the codec followed by a known-good PDU.
            let mut codec = codec(4096);
            let mut buf = BytesMut::from(&bytes[..]);
            buf.extend_from_slice(&pdu(0x15, 0, 99, &[]));
            for _ in 0..4 {
                match codec.decode(&mut buf) {
                    Ok(Some(frame)) => {
                        if decode_frame(frame).is_err_and(|e| e.must_close()) {
                            break;
                        }
                    }
                    Ok(None) | Err(_) => break,
                }
            }
        }
        // The mutations are not so destructive that nothing ever decodes.
        assert!(decoded_ok > 100, "only {decoded_ok} frames decoded");
    }
}
