//! Concatenation information of inbound multipart messages.
//!
//! An ESME marks a part of a long message in one of two ways: a User Data Header in front
//! of `short_message` (esm_class UDHI bit 0x40 set) holding a concatenation information
//! element, or the SAR TLVs (`sar_msg_ref_num`, `sar_total_segments`,
//! `sar_segment_seqnum`). Both end up as a [`Concat`], which Ingress uses to group parts.
//! Values are validated here because a part with seq 0, or seq beyond total, can never
//! complete a group and would sit in storage until it expires.

/// Where a part sits in its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Concat {
    /// The sender's reference for the whole message (8-bit references are widened).
    pub reference: u16,
    /// Number of parts, at least 1.
    pub total: u8,
    /// This part's number, 1-based, at most `total`.
    pub seq: u8,
}

/// The UDH or SAR values do not describe a valid part.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MultipartError {
    /// UDHI set but `short_message` is empty: there is no UDHL octet.
    #[error("UDH indicator set but the short message is empty")]
    MissingUdh,
    /// The UDHL octet claims more header octets than the message has.
    #[error("UDH length {udhl} exceeds the {available} octets after it")]
    UdhTooLong { udhl: usize, available: usize },
    /// An information element runs past the end of the UDH.
    #[error("information element {iei:#04x} at UDH offset {offset} runs past the header")]
    TruncatedElement { iei: u8, offset: usize },
    /// A concatenation element whose length is not 3 (IEI 0x00) or 4 (IEI 0x08).
    #[error("concatenation element {iei:#04x} has length {length}, expected {expected}")]
    BadConcatLength { iei: u8, length: usize, expected: usize },
    #[error("concatenated message with 0 parts")]
    ZeroTotal,
    #[error("part number 0")]
    ZeroSeq,
    #[error("part {seq} of a {total}-part message")]
    SeqBeyondTotal { seq: u8, total: u8 },
}

const IEI_CONCAT_8BIT: u8 = 0x00;
const IEI_CONCAT_16BIT: u8 = 0x08;

/// Splits a UDHI `short_message` into its concatenation info (if any), the UDH (UDHL octet
/// included) and the user data after it.
///
/// Information elements other than concatenation (ports, special SMS indication …) are
/// skipped but kept in the returned UDH bytes. If concatenation appears more than once the
/// last occurrence wins, as TS 23.040 §9.2.3.24 tells receivers to treat a repeated
/// non-repeatable element.
// The tuple is the public contract other crates code against; an alias would hide it.
#[allow(clippy::type_complexity)]
pub fn parse_udh(short_message: &[u8]) -> Result<(Option<Concat>, &[u8], &[u8]), MultipartError> {
    let Some((&udhl, after)) = short_message.split_first() else {
        return Err(MultipartError::MissingUdh);
    };
    let udhl = usize::from(udhl);
    if udhl > after.len() {
        return Err(MultipartError::UdhTooLong {
            udhl,
            available: after.len(),
        });
    }
    let (elements, user_data) = after.split_at(udhl);
    let udh = short_message.get(..=udhl).unwrap_or(short_message);

    let mut concat = None;
    let mut rest = elements;
    let mut offset = 1; // offset in the UDH, counting the UDHL octet
    while let Some((&iei, tail)) = rest.split_first() {
        let truncated = MultipartError::TruncatedElement { iei, offset };
        let Some((&length, tail)) = tail.split_first() else {
            return Err(truncated);
        };
        let length = usize::from(length);
        if length > tail.len() {
            return Err(truncated);
        }
        let (data, tail) = tail.split_at(length);
        match iei {
            IEI_CONCAT_8BIT => match *data {
                [reference, total, seq] => {
                    concat = Some(validate(u16::from(reference), total, seq)?);
                }
                _ => {
                    return Err(MultipartError::BadConcatLength {
                        iei,
                        length,
                        expected: 3,
                    });
                }
            },
            IEI_CONCAT_16BIT => match *data {
                [hi, lo, total, seq] => {
                    concat = Some(validate(u16::from_be_bytes([hi, lo]), total, seq)?);
                }
                _ => {
                    return Err(MultipartError::BadConcatLength {
                        iei,
                        length,
                        expected: 4,
                    });
                }
            },
            _ => {}
        }
        offset += 2 + length;
        rest = tail;
    }
    Ok((concat, udh, user_data))
}

/// Validates the values of the SAR TLVs (read from the PDU by the session).
pub fn from_sar(ref_num: u16, total: u8, seq: u8) -> Result<Concat, MultipartError> {
    validate(ref_num, total, seq)
}

fn validate(reference: u16, total: u8, seq: u8) -> Result<Concat, MultipartError> {
    if total == 0 {
        return Err(MultipartError::ZeroTotal);
    }
    if seq == 0 {
        return Err(MultipartError::ZeroSeq);
    }
    if seq > total {
        return Err(MultipartError::SeqBeyondTotal { seq, total });
    }
    Ok(Concat { reference, total, seq })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::{concat_udh_8bit, concat_udh_16bit};

    #[test]
    fn eight_bit_reference() {
        let sm = [0x05, 0x00, 0x03, 0xAB, 0x03, 0x02, b'h', b'i'];
        let (concat, udh, data) = parse_udh(&sm).unwrap();
        assert_eq!(
            concat,
            Some(Concat {
                reference: 0xAB,
                total: 3,
                seq: 2
            })
        );
        assert_eq!(udh, &sm[..6]);
        assert_eq!(data, b"hi");
    }

    #[test]
    fn sixteen_bit_reference() {
        let sm = [0x06, 0x08, 0x04, 0x12, 0x34, 0x02, 0x02, b'x'];
        let (concat, udh, data) = parse_udh(&sm).unwrap();
        assert_eq!(
            concat,
            Some(Concat {
                reference: 0x1234,
                total: 2,
                seq: 2
            })
        );
        assert_eq!(udh.len(), 7);
        assert_eq!(data, b"x");
    }

    #[test]
    fn builders_parse_back() {
        let mut sm = concat_udh_8bit(7, 4, 4).to_vec();
        sm.extend_from_slice(b"tail");
        let (concat, _, data) = parse_udh(&sm).unwrap();
        assert_eq!((concat.unwrap().reference, data), (7, &b"tail"[..]));
        let sm = concat_udh_16bit(0xBEEF, 2, 1);
        let (concat, _, data) = parse_udh(&sm).unwrap();
        assert_eq!(concat.unwrap().reference, 0xBEEF);
        assert!(data.is_empty());
    }

    #[test]
    fn several_elements() {
        // Application port addressing (0x05, 4 octets), then 8-bit concatenation, then a
        // special SMS indication (0x01, 2 octets).
        let sm = [
            0x0D, 0x05, 0x04, 0x0B, 0x84, 0x23, 0xF0, 0x00, 0x03, 0x11, 0x02, 0x01, 0x01, 0x00, b'd',
        ];
        // UDHL 0x0D = 13: 6 + 5 + 2 = 13 octets of elements.
        assert_eq!(sm.len(), 1 + 13 + 1);
        let (concat, udh, data) = parse_udh(&sm).unwrap();
        assert_eq!(
            concat,
            Some(Concat {
                reference: 0x11,
                total: 2,
                seq: 1
            })
        );
        assert_eq!(udh.len(), 14);
        assert_eq!(data, b"d");
    }

    #[test]
    fn udh_without_concatenation() {
        let sm = [0x04, 0x01, 0x02, 0x01, 0x00, b'z'];
        assert_eq!(parse_udh(&sm).unwrap(), (None, &sm[..5], &b"z"[..]));
        // UDHL 0: an empty header.
        assert_eq!(parse_udh(&[0x00, b'a']).unwrap(), (None, &[0u8][..], &b"a"[..]));
    }

    #[test]
    fn last_concatenation_element_wins() {
        let sm = [0x0B, 0x00, 0x03, 0x01, 0x02, 0x01, 0x08, 0x04, 0x00, 0x09, 0x03, 0x03];
        let (concat, _, _) = parse_udh(&sm).unwrap();
        assert_eq!(
            concat,
            Some(Concat {
                reference: 9,
                total: 3,
                seq: 3
            })
        );
    }

    #[test]
    fn malformed_udhs() {
        assert_eq!(parse_udh(&[]).unwrap_err(), MultipartError::MissingUdh);
        assert_eq!(
            parse_udh(&[0x05, 0x00, 0x03]).unwrap_err(),
            MultipartError::UdhTooLong { udhl: 5, available: 2 }
        );
        // Element length past the header (but within the message).
        assert_eq!(
            parse_udh(&[0x03, 0x00, 0x03, 0x01, 0x02, 0x01]).unwrap_err(),
            MultipartError::TruncatedElement { iei: 0x00, offset: 1 }
        );
        // IEI without a length octet.
        assert!(matches!(
            parse_udh(&[0x01, 0x00]).unwrap_err(),
            MultipartError::TruncatedElement { .. }
        ));
        assert_eq!(
            parse_udh(&[0x04, 0x00, 0x02, 0x01, 0x02]).unwrap_err(),
            MultipartError::BadConcatLength {
                iei: 0x00,
                length: 2,
                expected: 3
            }
        );
        assert_eq!(
            parse_udh(&[0x05, 0x08, 0x03, 0x00, 0x01, 0x02]).unwrap_err(),
            MultipartError::BadConcatLength {
                iei: 0x08,
                length: 3,
                expected: 4
            }
        );
        assert_eq!(
            parse_udh(&concat_udh_8bit(1, 3, 0)).unwrap_err(),
            MultipartError::ZeroSeq
        );
        assert_eq!(
            parse_udh(&concat_udh_8bit(1, 0, 1)).unwrap_err(),
            MultipartError::ZeroTotal
        );
        assert_eq!(
            parse_udh(&concat_udh_16bit(1, 2, 3)).unwrap_err(),
            MultipartError::SeqBeyondTotal { seq: 3, total: 2 }
        );
    }

    #[test]
    fn sar_validation() {
        assert_eq!(
            from_sar(0x0102, 3, 3).unwrap(),
            Concat {
                reference: 0x0102,
                total: 3,
                seq: 3
            }
        );
        assert_eq!(from_sar(1, 1, 1).unwrap().total, 1);
        assert_eq!(from_sar(1, 0, 0).unwrap_err(), MultipartError::ZeroTotal);
        assert_eq!(from_sar(1, 2, 0).unwrap_err(), MultipartError::ZeroSeq);
        assert_eq!(
            from_sar(1, 2, 5).unwrap_err(),
            MultipartError::SeqBeyondTotal { seq: 5, total: 2 }
        );
    }

    #[test]
    fn never_panics_on_any_short_input() {
        // Every 1..=4 octet input, and mutations of a longer one.
        for a in 0..=u8::MAX {
            let _ = parse_udh(&[a]);
            for b in 0..=u8::MAX {
                let _ = parse_udh(&[a, b]);
                let _ = parse_udh(&[a, 0x00, b, 0x01]);
                let _ = parse_udh(&[0x05, a, b, 0x01, 0x02, 0x01, 0x41]);
            }
        }
    }
}
