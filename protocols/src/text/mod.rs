//! SMS text: which alphabet a `data_coding` value means, and converting between Rust
//! strings and the octets SMPP carries in `short_message` / `message_payload`.
//!
//! Sendium keeps user data *encoded* once it is admitted (the bytes an ESME sent are the
//! bytes the provider gets), so decoding is only needed to show or inspect text, and
//! encoding only for HTTP ingress and generated receipts. Splitting for sending
//! ([`split`]) works on encoded bytes for the same reason.

pub mod gsm7;
mod split;

pub use split::{concat_udh_8bit, concat_udh_16bit, segment_limits, split, split_with_limits};

/// The character sets Sendium understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Alphabet {
    /// GSM 03.38 default alphabet + extension table, as *unpacked* septets (one per octet,
    /// as SMPP carries data_coding 0).
    Gsm7,
    /// ISO-8859-1: one octet per character, U+0000..U+00FF.
    Latin1,
    /// UCS2, read and written as UTF-16BE so that characters outside the BMP (emoji) survive
    /// as surrogate pairs, as every current handset sends them.
    Ucs2,
    /// IA5 / ASCII (T.50): 7-bit, one octet per character.
    Ia5,
    /// Anything that is not text we can decode (8-bit data, compressed, or an alphabet we do
    /// not implement): passed through untouched.
    Binary,
}

impl Alphabet {
    /// Classifies an SMPP `data_coding` value.
    ///
    /// - 0x00 SMSC default alphabet → `Gsm7` (Sendium's SMSC default), 0x01 → `Ia5`,
    ///   0x03 → `Latin1`, 0x08 → `Ucs2`, 0x02/0x04 (octet unspecified) → `Binary`; the
    ///   other SMPP-assigned values below 0x10 (JIS, Cyrillic, Hebrew, pictogram, Kanji,
    ///   KS C 5601) are alphabets Sendium does not implement → `Binary`.
    /// - 0x10..=0x3F and 0x40..=0x7F: GSM 03.38 §4 general data coding and
    ///   automatic-deletion groups. Bit 5 set means compressed → `Binary`; otherwise bits
    ///   3..2 pick the alphabet: 00 `Gsm7`, 01 8-bit `Binary`, 10 `Ucs2`, 11 reserved
    ///   (`Binary`). The message class in bits 1..0 does not change the bytes.
    /// - 0xC0..=0xDF: message waiting indication groups with GSM 7-bit text → `Gsm7`;
    ///   0xE0..=0xEF: message waiting indication with UCS2 text → `Ucs2`.
    /// - 0xF0..=0xFF: data coding / message class group: bit 2 clear → `Gsm7`, set →
    ///   8-bit `Binary`.
    /// - Everything else (0x80..=0xBF reserved) → `Binary`: never guess at text.
    pub fn from_data_coding(dcs: u8) -> Alphabet {
        match dcs {
            0x00 => Alphabet::Gsm7,
            0x01 => Alphabet::Ia5,
            0x03 => Alphabet::Latin1,
            0x08 => Alphabet::Ucs2,
            0x02 | 0x04..=0x07 | 0x09..=0x0F => Alphabet::Binary,
            0x10..=0x7F => {
                if dcs & 0x20 != 0 {
                    Alphabet::Binary
                } else {
                    match (dcs >> 2) & 0x03 {
                        0b00 => Alphabet::Gsm7,
                        0b10 => Alphabet::Ucs2,
                        _ => Alphabet::Binary,
                    }
                }
            }
            0xC0..=0xDF => Alphabet::Gsm7,
            0xE0..=0xEF => Alphabet::Ucs2,
            0xF0..=0xFF => {
                if dcs & 0x04 == 0 {
                    Alphabet::Gsm7
                } else {
                    Alphabet::Binary
                }
            }
            _ => Alphabet::Binary,
        }
    }

    /// The `data_coding` Sendium writes for this alphabet. Binary is 0x04, which means
    /// "8-bit data" both in SMPP and in GSM 03.38, so it survives SMSCs that pass DCS on.
    pub fn data_coding(&self) -> u8 {
        match self {
            Alphabet::Gsm7 => 0x00,
            Alphabet::Ia5 => 0x01,
            Alphabet::Latin1 => 0x03,
            Alphabet::Ucs2 => 0x08,
            Alphabet::Binary => 0x04,
        }
    }
}

/// Text that cannot be decoded or encoded.
///
/// Errors give offsets and positions but their messages never include the character or
/// byte values of the text (which is a message body and must not reach logs); the
/// offending value is available in the fields for code that needs it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    /// An octet above 0x7F in GSM 7-bit data (each octet must hold one septet).
    #[error("octet at offset {offset} is not a GSM 7-bit septet")]
    InvalidSeptet { offset: usize, byte: u8 },
    /// A GSM escape (0x1B) as the last octet: the data was cut in the middle of a character.
    #[error("GSM escape at offset {offset} has no character after it")]
    DanglingEscape { offset: usize },
    /// An octet above 0x7F in IA5 data.
    #[error("octet at offset {offset} is not IA5/ASCII")]
    InvalidIa5 { offset: usize, byte: u8 },
    /// UCS2 data with an odd number of octets.
    #[error("UCS2 data of {length} octets is not a whole number of code units")]
    OddUcs2Length { length: usize },
    /// A UTF-16 surrogate without its partner.
    #[error("unpaired UTF-16 surrogate at offset {offset}")]
    LoneSurrogate { offset: usize, unit: u16 },
    /// The data_coding says the data is not text.
    #[error("data_coding {data_coding:#04x} is not a text alphabet")]
    NotText { data_coding: u8 },
    /// The character at `position` (counted in chars) has no encoding in `alphabet`.
    #[error("character at position {position} cannot be encoded in {alphabet:?}")]
    Unrepresentable {
        alphabet: Alphabet,
        ch: char,
        position: usize,
    },
}

/// Decodes SMPP user data according to `dcs` (see [`Alphabet::from_data_coding`]).
pub fn decode(dcs: u8, bytes: &[u8]) -> Result<String, TextError> {
    match Alphabet::from_data_coding(dcs) {
        Alphabet::Gsm7 => gsm7::decode(bytes),
        Alphabet::Latin1 => Ok(bytes.iter().copied().map(char::from).collect()),
        Alphabet::Ia5 => bytes
            .iter()
            .enumerate()
            .map(|(offset, &byte)| {
                if byte.is_ascii() {
                    Ok(char::from(byte))
                } else {
                    Err(TextError::InvalidIa5 { offset, byte })
                }
            })
            .collect(),
        Alphabet::Ucs2 => decode_utf16be(bytes),
        Alphabet::Binary => Err(TextError::NotText { data_coding: dcs }),
    }
}

fn decode_utf16be(bytes: &[u8]) -> Result<String, TextError> {
    // `& 1` rather than `is_multiple_of`, which needs Rust 1.87 (MSRV is 1.85).
    if bytes.len() & 1 != 0 {
        return Err(TextError::OddUcs2Length { length: bytes.len() });
    }
    let units = bytes.chunks_exact(2).map(|pair| u16::from_be_bytes([pair[0], pair[1]]));
    let mut out = String::with_capacity(bytes.len() / 2);
    let mut offset = 0;
    for decoded in char::decode_utf16(units) {
        match decoded {
            Ok(ch) => {
                offset += ch.len_utf16() * 2;
                out.push(ch);
            }
            Err(err) => {
                return Err(TextError::LoneSurrogate {
                    offset,
                    unit: err.unpaired_surrogate(),
                });
            }
        }
    }
    Ok(out)
}

/// Encodes `text` in `alphabet`. `Binary` is not a text encoding and is refused.
pub fn encode(alphabet: Alphabet, text: &str) -> Result<Vec<u8>, TextError> {
    let unrepresentable = |(position, ch)| TextError::Unrepresentable { alphabet, ch, position };
    match alphabet {
        Alphabet::Gsm7 => gsm7::encode(text),
        Alphabet::Latin1 => text
            .chars()
            .enumerate()
            .map(|(position, ch)| u8::try_from(ch).map_err(|_| unrepresentable((position, ch))))
            .collect(),
        Alphabet::Ia5 => text
            .chars()
            .enumerate()
            .map(|(position, ch)| {
                u8::try_from(ch)
                    .ok()
                    .filter(u8::is_ascii)
                    .ok_or_else(|| unrepresentable((position, ch)))
            })
            .collect(),
        Alphabet::Ucs2 => Ok(text.encode_utf16().flat_map(u16::to_be_bytes).collect()),
        Alphabet::Binary => Err(TextError::NotText {
            data_coding: alphabet.data_coding(),
        }),
    }
}

/// The alphabet HTTP ingress sends `text` in: GSM 7-bit when every character has a GSM
/// encoding (160 characters per SMS), UCS2 otherwise (70) — Latin-1 is never chosen
/// because many networks do not deliver data_coding 3 to handsets.
pub fn best_alphabet(text: &str) -> Alphabet {
    if text.chars().all(gsm7::is_representable) {
        Alphabet::Gsm7
    } else {
        Alphabet::Ucs2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_coding_classification() {
        let cases = [
            (0x00, Alphabet::Gsm7),
            (0x01, Alphabet::Ia5),
            (0x02, Alphabet::Binary),
            (0x03, Alphabet::Latin1),
            (0x04, Alphabet::Binary),
            (0x05, Alphabet::Binary),
            (0x06, Alphabet::Binary),
            (0x08, Alphabet::Ucs2),
            (0x0E, Alphabet::Binary),
            (0x10, Alphabet::Gsm7),   // GSM 7-bit, class 0 (flash)
            (0x11, Alphabet::Gsm7),   // class 1
            (0x14, Alphabet::Binary), // 8-bit data with class
            (0x18, Alphabet::Ucs2),   // UCS2 with class
            (0x1C, Alphabet::Binary), // reserved alphabet
            (0x20, Alphabet::Binary), // compressed
            (0x38, Alphabet::Binary), // compressed UCS2
            (0x40, Alphabet::Gsm7),   // auto-delete, GSM
            (0x48, Alphabet::Ucs2),   // auto-delete, UCS2
            (0x80, Alphabet::Binary), // reserved
            (0xC0, Alphabet::Gsm7),   // MWI discard
            (0xD8, Alphabet::Gsm7),   // MWI store
            (0xE0, Alphabet::Ucs2),   // MWI store UCS2
            (0xF0, Alphabet::Gsm7),   // class 0 GSM
            (0xF3, Alphabet::Gsm7),
            (0xF4, Alphabet::Binary), // class 0 8-bit
            (0xF6, Alphabet::Binary), // SIM data download
        ];
        for (dcs, alphabet) in cases {
            assert_eq!(Alphabet::from_data_coding(dcs), alphabet, "{dcs:#04x}");
        }
        for alphabet in [
            Alphabet::Gsm7,
            Alphabet::Latin1,
            Alphabet::Ucs2,
            Alphabet::Ia5,
            Alphabet::Binary,
        ] {
            assert_eq!(Alphabet::from_data_coding(alphabet.data_coding()), alphabet);
        }
        // Every value classifies without panicking.
        for dcs in 0..=u8::MAX {
            let _ = Alphabet::from_data_coding(dcs);
        }
    }

    #[test]
    fn latin1_round_trips() {
        let bytes = encode(Alphabet::Latin1, "café ÿ").unwrap();
        assert_eq!(bytes, b"caf\xE9 \xFF");
        assert_eq!(decode(0x03, &bytes).unwrap(), "café ÿ");
        assert!(matches!(
            encode(Alphabet::Latin1, "€").unwrap_err(),
            TextError::Unrepresentable { position: 0, .. }
        ));
    }

    #[test]
    fn ia5_is_ascii() {
        assert_eq!(encode(Alphabet::Ia5, "Hi @_").unwrap(), b"Hi @_");
        assert_eq!(decode(0x01, b"Hi @_").unwrap(), "Hi @_");
        assert!(encode(Alphabet::Ia5, "é").is_err());
        assert_eq!(
            decode(0x01, b"a\xE9").unwrap_err(),
            TextError::InvalidIa5 { offset: 1, byte: 0xE9 }
        );
    }

    #[test]
    fn ucs2_is_utf16be_with_surrogates() {
        let bytes = encode(Alphabet::Ucs2, "Aé😀").unwrap();
        assert_eq!(bytes, [0x00, 0x41, 0x00, 0xE9, 0xD8, 0x3D, 0xDE, 0x00]);
        assert_eq!(decode(0x08, &bytes).unwrap(), "Aé😀");
        assert_eq!(decode(0x18, &bytes).unwrap(), "Aé😀");
    }

    #[test]
    fn invalid_ucs2_is_an_error() {
        assert_eq!(
            decode(0x08, &[0x00, 0x41, 0x00]).unwrap_err(),
            TextError::OddUcs2Length { length: 3 }
        );
        // Lone high surrogate at the end, and in the middle.
        assert_eq!(
            decode(0x08, &[0x00, 0x41, 0xD8, 0x3D]).unwrap_err(),
            TextError::LoneSurrogate {
                offset: 2,
                unit: 0xD83D
            }
        );
        assert!(decode(0x08, &[0xD8, 0x3D, 0x00, 0x41]).is_err());
        // Lone low surrogate.
        assert!(decode(0x08, &[0xDE, 0x00]).is_err());
    }

    #[test]
    fn gsm_through_the_dispatch() {
        let bytes = encode(Alphabet::Gsm7, "Price: 5€ [ok]").unwrap();
        assert_eq!(decode(0x00, &bytes).unwrap(), "Price: 5€ [ok]");
        assert_eq!(decode(0xF1, &bytes).unwrap(), "Price: 5€ [ok]");
    }

    #[test]
    fn binary_is_not_text() {
        assert_eq!(
            decode(0x04, b"\x01\x02").unwrap_err(),
            TextError::NotText { data_coding: 0x04 }
        );
        assert!(encode(Alphabet::Binary, "x").is_err());
    }

    #[test]
    fn best_alphabet_prefers_gsm() {
        assert_eq!(best_alphabet("hello {world} €"), Alphabet::Gsm7);
        assert_eq!(best_alphabet(""), Alphabet::Gsm7);
        assert_eq!(best_alphabet("ça va"), Alphabet::Ucs2);
        assert_eq!(best_alphabet("привет"), Alphabet::Ucs2);
        assert_eq!(best_alphabet("hi 😀"), Alphabet::Ucs2);
    }
}
