//! Wire helpers shared by the kit's SMPP peers: a batching non-blocking connection, SMPP
//! status names, TLV accessors and an independent concatenation-header parser.

use std::io;

use bytes::{Buf, BytesMut};
use rusmpp::tlvs::{Tlv, TlvValue};
use rusmpp::{Command, CommandStatus};
use sendium_protocols::smpp::frame;
use tokio::net::TcpStream;
use tokio_util::codec::{Decoder, LengthDelimitedCodec};

/// `ESME_RTHROTTLED`-style name of a status (`0x…` for statuses rusmpp does not know).
pub fn status_name(status: CommandStatus) -> String {
    let debug = format!("{status:?}");
    match debug.strip_prefix("Esme") {
        Some(rest) if !matches!(status, CommandStatus::Other(_)) => format!("ESME_{}", rest.to_uppercase()),
        _ => format!("{:#010x}", u32::from(status)),
    }
}

/// One PDU as bytes (command_length included).
pub fn encode_to_vec(command: &Command) -> Vec<u8> {
    let mut buf = BytesMut::new();
    frame::encode(command, &mut buf);
    buf.to_vec()
}

/// A TCP connection with read and write buffers, used in "do everything that is ready"
/// loops: [`Conn::try_fill`] drains the socket without waiting, [`Conn::next_frame`] cuts
/// PDUs, [`Conn::push`] appends answers to one write buffer, [`Conn::try_flush`] writes as
/// much as the socket takes. The caller waits on `stream.readable()` / `stream.writable()`.
#[derive(Debug)]
pub struct Conn {
    pub stream: TcpStream,
    pub rbuf: BytesMut,
    pub wbuf: BytesMut,
    codec: LengthDelimitedCodec,
    /// The peer closed its side.
    pub eof: bool,
}

const READ_CHUNK: usize = 64 * 1024;

impl Conn {
    pub fn new(stream: TcpStream) -> Conn {
        let _ = stream.set_nodelay(true);
        Conn {
            stream,
            rbuf: BytesMut::with_capacity(READ_CHUNK),
            wbuf: BytesMut::with_capacity(READ_CHUNK),
            codec: frame::codec(frame::DEFAULT_MAX_COMMAND_LENGTH),
            eof: false,
        }
    }

    /// Reads whatever the socket holds right now (until it would block, EOF, or `max`
    /// buffered bytes). Returns the number of bytes read.
    pub fn try_fill(&mut self, max: usize) -> io::Result<usize> {
        let mut total = 0;
        while !self.eof && self.rbuf.len() < max {
            if self.rbuf.capacity() - self.rbuf.len() < READ_CHUNK / 4 {
                self.rbuf.reserve(READ_CHUNK);
            }
            match self.stream.try_read_buf(&mut self.rbuf) {
                Ok(0) => self.eof = true,
                Ok(n) => total += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(total)
    }

    /// Waits until at least one byte arrived (or EOF), then drains like [`Conn::try_fill`].
    pub async fn fill(&mut self, max: usize) -> io::Result<usize> {
        loop {
            let n = self.try_fill(max)?;
            if n > 0 || self.eof {
                return Ok(n);
            }
            self.stream.readable().await?;
        }
    }

    /// The next whole PDU in the read buffer. An error means the codec refused the
    /// command_length (too long); the stream cannot be resynchronised.
    pub fn next_frame(&mut self) -> io::Result<Option<BytesMut>> {
        self.codec.decode(&mut self.rbuf)
    }

    /// Appends one PDU to the write buffer.
    pub fn push(&mut self, command: &Command) {
        frame::encode(command, &mut self.wbuf);
    }

    /// Writes as much of the write buffer as the socket takes without waiting.
    pub fn try_flush(&mut self) -> io::Result<()> {
        while !self.wbuf.is_empty() {
            match self.stream.try_write(&self.wbuf) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.wbuf.advance(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if self.wbuf.is_empty() && self.wbuf.capacity() > 4 * READ_CHUNK {
            self.wbuf = BytesMut::with_capacity(READ_CHUNK);
        }
        Ok(())
    }

    /// Writes the whole write buffer, waiting for the socket as needed.
    pub async fn flush(&mut self) -> io::Result<()> {
        loop {
            self.try_flush()?;
            if self.wbuf.is_empty() {
                return Ok(());
            }
            self.stream.writable().await?;
        }
    }
}

/// Reference of a concatenated part, by the mechanism that carried it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConcatRef {
    /// UDH information element 0x00.
    Udh8(u8),
    /// UDH information element 0x08.
    Udh16(u16),
    /// sar_msg_ref_num TLV.
    Sar(u16),
}

/// Where a part sits in its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PartInfo {
    pub reference: ConcatRef,
    pub total: u8,
    pub seq: u8,
}

/// Splits a UDHI short_message into (concatenation info, user data offset). `None` when
/// the UDH is malformed (then the whole short_message is treated as user data).
pub fn parse_udh(short_message: &[u8]) -> Option<(Option<PartInfo>, usize)> {
    let (&udhl, rest) = short_message.split_first()?;
    let udhl = usize::from(udhl);
    let mut elements = rest.get(..udhl)?;
    let mut concat = None;
    while let [iei, len, tail @ ..] = elements {
        let len = usize::from(*len);
        let data = tail.get(..len)?;
        match (*iei, data) {
            (0x00, &[reference, total, seq]) => {
                concat = Some(PartInfo {
                    reference: ConcatRef::Udh8(reference),
                    total,
                    seq,
                });
            }
            (0x08, &[hi, lo, total, seq]) => {
                concat = Some(PartInfo {
                    reference: ConcatRef::Udh16(u16::from_be_bytes([hi, lo])),
                    total,
                    seq,
                });
            }
            _ => {}
        }
        elements = &tail[len..];
    }
    if !elements.is_empty() {
        return None;
    }
    Some((concat, 1 + udhl))
}

/// The TLVs of a submit_sm / deliver_sm that the kit reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KnownTlvs {
    pub message_payload: Option<Vec<u8>>,
    pub sar_msg_ref_num: Option<u16>,
    pub sar_total_segments: Option<u8>,
    pub sar_segment_seqnum: Option<u8>,
    pub receipted_message_id: Option<String>,
    pub message_state: Option<u8>,
}

impl KnownTlvs {
    pub fn read(tlvs: &[Tlv]) -> KnownTlvs {
        let mut out = KnownTlvs::default();
        for tlv in tlvs {
            match tlv.value() {
                Some(TlvValue::MessagePayload(p)) => out.message_payload = Some(p.value.as_ref().to_vec()),
                Some(TlvValue::SarMsgRefNum(v)) => out.sar_msg_ref_num = Some(*v),
                Some(TlvValue::SarTotalSegments(v)) => out.sar_total_segments = Some(*v),
                Some(TlvValue::SarSegmentSeqnum(v)) => out.sar_segment_seqnum = Some(*v),
                Some(TlvValue::ReceiptedMessageId(v)) => out.receipted_message_id = Some(v.as_str().to_owned()),
                Some(TlvValue::MessageState(v)) => out.message_state = Some(u8::from(*v)),
                _ => {}
            }
        }
        out
    }

    /// The SAR triple when all three TLVs are present.
    pub fn sar(&self) -> Option<(u16, u8, u8)> {
        Some((
            self.sar_msg_ref_num?,
            self.sar_total_segments?,
            self.sar_segment_seqnum?,
        ))
    }
}

/// Concatenation info and user data of a message: UDH (when esm_class has UDHI) first,
/// then SAR TLVs. `data` is `short_message`, or `message_payload` when that is set.
pub fn split_user_data<'a>(esm_class: u8, data: &'a [u8], tlvs: &KnownTlvs) -> (Option<PartInfo>, &'a [u8]) {
    if esm_class & 0x40 != 0
        && let Some((concat, offset)) = parse_udh(data)
    {
        let user_data = data.get(offset..).unwrap_or(&[]);
        return (concat.or_else(|| sar_part(tlvs)), user_data);
    }
    (sar_part(tlvs), data)
}

fn sar_part(tlvs: &KnownTlvs) -> Option<PartInfo> {
    tlvs.sar().map(|(reference, total, seq)| PartInfo {
        reference: ConcatRef::Sar(reference),
        total,
        seq,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names() {
        assert_eq!(status_name(CommandStatus::EsmeRthrottled), "ESME_RTHROTTLED");
        assert_eq!(status_name(CommandStatus::EsmeRok), "ESME_ROK");
        assert_eq!(status_name(CommandStatus::Other(0x400)), "0x00000400");
    }

    #[test]
    fn udh_parsing() {
        let (c, off) = parse_udh(&[0x05, 0x00, 0x03, 0xAB, 0x03, 0x02, b'h']).unwrap();
        assert_eq!(
            c,
            Some(PartInfo {
                reference: ConcatRef::Udh8(0xAB),
                total: 3,
                seq: 2
            })
        );
        assert_eq!(off, 6);
        let (c, off) = parse_udh(&[0x06, 0x08, 0x04, 0x12, 0x34, 0x02, 0x01, b'h']).unwrap();
        assert_eq!(c.unwrap().reference, ConcatRef::Udh16(0x1234));
        assert_eq!(off, 7);
        // a port element only
        let (c, off) = parse_udh(&[0x04, 0x04, 0x02, 0x00, 0x10, b'x']).unwrap();
        assert_eq!((c, off), (None, 5));
        assert!(parse_udh(&[0x05, 0x00, 0x03]).is_none());
        assert!(parse_udh(&[]).is_none());
    }
}
