//! SMPP framing and PDU decoding as the server session reads an ESME's bytes.
//!
//! Input: one config byte (bits 0-1 pick `max_command_length`, bits 2-4 the number of
//! cuts), one byte per cut (the length of that read), then the byte stream. The stream
//! is fed into a `BytesMut` one read at a time, and every complete frame is cut by
//! `frame::codec` and decoded by `frame::decode_frame`, exactly as
//! `server::session::Session::process_frames` does; decoded submits and binds go through
//! the protocols-level checks the session applies (UDH, SAR, validity period).
//!
//! Checked: nothing panics; the outcome does not depend on how the stream was split into
//! reads; a frame that does not close the session consumed at least a header (so the
//! read loop always ends); a decoded request encodes back to bytes that decode to the
//! same command; every reply the session would write is a valid PDU.
#![no_main]
#![forbid(unsafe_code)]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use rusmpp::tlvs::TlvValue;
use rusmpp::{Command, CommandId, CommandStatus, Pdu};
use sendium_fuzz::Input;
use sendium_protocols::multipart;
use sendium_protocols::smpp::frame::{self, FrameError, RawHeader};
use sendium_protocols::smpp::time;
use tokio_util::codec::Decoder;

/// `max_command_length` values: the server's default and small ones that make the
/// "too long" path reachable.
const MAX_LENGTHS: [u32; 4] = [frame::DEFAULT_MAX_COMMAND_LENGTH, 1024, 64, 16];

/// A fixed "now" for relative validity periods (2026-06-01).
const NOW_MS: u64 = 1_780_272_000_000;

/// What the session saw, in order.
#[derive(Debug, PartialEq)]
enum Event {
    Command(Box<Command>),
    Bad(FrameError),
    /// The codec refused the stream (`command_length` above the maximum). The header is
    /// not compared: whether all 16 bytes of it had arrived depends on the reads.
    Refused {
        too_long: bool,
    },
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let config = input.byte();
    let max = MAX_LENGTHS[usize::from(config & 0x03)];
    let cuts = usize::from((config >> 2) & 0x07);
    let lengths: Vec<usize> = (0..cuts).map(|_| usize::from(input.byte())).collect();
    let stream = input.rest();

    let mut pieces = Vec::with_capacity(cuts + 1);
    let mut rest = stream;
    for len in lengths {
        let (piece, tail) = rest.split_at(len.min(rest.len()));
        pieces.push(piece);
        rest = tail;
    }
    pieces.push(rest);

    let (split, split_out) = read(max, &pieces);
    let (whole, whole_out) = read(max, &[stream]);
    assert_eq!(split, whole, "the outcome depends on how the stream was split");
    assert_eq!(split_out, whole_out, "the replies depend on how the stream was split");

    // Every reply the session would write decodes.
    let mut codec = frame::codec(frame::DEFAULT_MAX_COMMAND_LENGTH);
    let mut out = BytesMut::from(&split_out[..]);
    while let Some(reply) = codec.decode(&mut out).expect("a reply longer than the maximum") {
        frame::decode_frame(reply).expect("the session wrote a PDU that does not decode");
    }
    assert!(out.is_empty(), "a partial reply was written");
});

/// The session's read loop over `reads`; returns what it saw and the bytes it would write.
fn read(max: u32, reads: &[&[u8]]) -> (Vec<Event>, BytesMut) {
    let mut codec = frame::codec(max);
    let mut rbuf = BytesMut::new();
    let mut out = BytesMut::new();
    let mut events = Vec::new();
    let total: usize = reads.iter().map(|r| r.len()).sum();
    let mut frames = 0usize;
    for read in reads {
        // A read of 0 bytes is the end of the stream, never data.
        if read.is_empty() {
            continue;
        }
        rbuf.extend_from_slice(read);
        loop {
            match codec.decode(&mut rbuf) {
                Ok(Some(bytes)) => {
                    frames += 1;
                    let len = bytes.len();
                    match frame::decode_frame(bytes) {
                        Ok(command) => {
                            assert!(len >= frame::HEADER_LEN, "a {len}-byte frame decoded");
                            // Requests only: rusmpp 0.4 reads a response's TLV whose value
                            // is shorter than its declared length (e.g. a bind_resp's
                            // sc_interface_version slot holding source_network_id, length
                            // 32, value "c") and re-encodes the declared length, which then
                            // does not decode (corpus: crash-rusmpp-response-tlv). The
                            // session ignores what responses carry beyond their status.
                            if !command.id().is_response() {
                                check_round_trip(&command);
                            }
                            on_command(&command, &mut out);
                            events.push(Event::Command(Box::new(command)));
                        }
                        Err(err) => {
                            if let Some(reply) = err.reply() {
                                frame::encode(&reply, &mut out);
                            }
                            let close = err.must_close();
                            if !close {
                                assert!(len >= frame::HEADER_LEN, "{err}: kept reading after {len} bytes");
                            }
                            events.push(Event::Bad(err));
                            if close {
                                return (events, out);
                            }
                        }
                    }
                    // Every frame that does not close consumed a header: the loop ends.
                    assert!(
                        frames <= total / frame::HEADER_LEN + 1,
                        "the read loop does not advance"
                    );
                }
                Ok(None) => break,
                Err(err) => {
                    let too_long = frame::is_frame_too_long(&err);
                    let header: Option<RawHeader> = frame::peek_header(&rbuf);
                    if too_long
                        && let Some(h) = header
                        && h.command_id != u32::from(CommandId::GenericNack)
                    {
                        // Not part of `out`: it depends on how much of the header arrived.
                        let nack = frame::generic_nack(h.sequence_number, CommandStatus::EsmeRinvcmdlen);
                        frame::encode(&nack, &mut BytesMut::new());
                    }
                    events.push(Event::Refused { too_long });
                    return (events, out);
                }
            }
        }
    }
    (events, out)
}

/// A decoded command encodes to bytes that decode to the same command.
fn check_round_trip(command: &Command) {
    let mut buf = BytesMut::new();
    frame::encode(command, &mut buf);
    match frame::decode_frame(buf.clone()) {
        Ok(again) => assert_eq!(&again, command, "decode(encode(command)) differs"),
        Err(err) => panic!("{command:?} re-encodes to {buf:?}, which does not decode: {err}"),
    }
}

/// The pure parts of `Session::on_command`.
fn on_command(command: &Command, out: &mut BytesMut) {
    let seq = command.sequence_number();
    match command.pdu() {
        Some(Pdu::SubmitSm(sm)) => {
            let status = inbound_submit(sm).err().unwrap_or(CommandStatus::EsmeRok);
            let reply = frame::submit_sm_resp(seq, status, if status == CommandStatus::EsmeRok { "1" } else { "" })
                .expect("a fixed message_id is valid");
            frame::encode(&reply, out);
        }
        Some(Pdu::BindTransmitter(b)) => bind(b.system_id.as_str(), b.password.as_str(), out, seq),
        Some(Pdu::BindReceiver(b)) => bind(b.system_id.as_str(), b.password.as_str(), out, seq),
        Some(Pdu::BindTransceiver(b)) => bind(b.system_id.as_str(), b.password.as_str(), out, seq),
        _ => match command.id() {
            CommandId::EnquireLink => frame::encode(&frame::enquire_link_resp(seq), out),
            CommandId::Unbind => frame::encode(&frame::unbind_resp(seq), out),
            id if id.is_response() => {}
            _ => frame::encode(&frame::generic_nack(seq, CommandStatus::EsmeRinvbndsts), out),
        },
    }
}

fn bind(system_id: &str, password: &str, out: &mut BytesMut, seq: u32) {
    let _ = (system_id.len(), password.len());
    let resp = frame::bind_resp(frame::BindKind::Transceiver, seq, CommandStatus::EsmeRok, "sendium")
        .expect("a fixed system_id is valid");
    frame::encode(&resp, out);
}

/// The checks of `server::convert::inbound_submit` (private to the server), made of the
/// public pieces it calls.
fn inbound_submit(sm: &rusmpp::pdus::SubmitSm) -> Result<(), CommandStatus> {
    if sm.destination_addr.as_str().is_empty() {
        return Err(CommandStatus::EsmeRinvdstadr);
    }
    let mut payload = None;
    let (mut sar_ref, mut sar_total, mut sar_seq) = (None, None, None);
    for tlv in sm.tlvs() {
        match tlv.value() {
            Some(TlvValue::MessagePayload(value)) => payload = Some(value.value.as_ref()),
            Some(TlvValue::SarMsgRefNum(value)) => sar_ref = Some(*value),
            Some(TlvValue::SarTotalSegments(value)) => sar_total = Some(*value),
            Some(TlvValue::SarSegmentSeqnum(value)) => sar_seq = Some(*value),
            _ => {}
        }
    }
    let short_message: &[u8] = sm.short_message().as_ref();
    let data = match payload {
        Some(_) if !short_message.is_empty() => return Err(CommandStatus::EsmeRinvmsglen),
        Some(payload) => payload,
        None => short_message,
    };
    if u8::from(sm.esm_class) & 0x40 != 0 {
        match multipart::parse_udh(data) {
            Ok((concat, udh, user_data)) => {
                assert_eq!(
                    [udh, user_data].concat(),
                    data,
                    "UDH and user data do not make up the message"
                );
                if let Some(c) = concat {
                    assert!(c.total >= 1 && c.seq >= 1 && c.seq <= c.total, "{c:?}");
                }
            }
            Err(_) => return Err(CommandStatus::EsmeRinvmsglen),
        }
    }
    match (sar_ref, sar_total, sar_seq) {
        (None, None, None) => {}
        (Some(reference), Some(total), Some(seq)) => {
            multipart::from_sar(reference, total, seq).map_err(|_| CommandStatus::EsmeRinvtlvval)?;
        }
        _ => return Err(CommandStatus::EsmeRinvtlvval),
    }
    let validity = sm.validity_period.as_str();
    if !validity.is_empty() {
        time::parse(validity, NOW_MS).map_err(|_| CommandStatus::EsmeRinvexpiry)?;
    }
    let schedule = sm.schedule_delivery_time.as_str();
    if !schedule.is_empty() {
        time::parse(schedule, NOW_MS).map_err(|_| CommandStatus::EsmeRinvsched)?;
    }
    Ok(())
}
