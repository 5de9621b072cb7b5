//! The GSM 03.38 (3GPP TS 23.038 §6.2.1) default alphabet and its extension table, over
//! *unpacked* septets: one septet per octet, as SMPP carries data_coding 0 (the SMSC packs
//! them for the air interface, not us).

use super::TextError;

/// Escape to the extension table (septet 0x1B).
pub const ESCAPE: u8 = 0x1B;

/// The default alphabet, indexed by septet. Index 0x1B is the escape, not a character; the
/// entry there is never matched when encoding and decodes as a space (see [`decode`]).
pub const DEFAULT_TABLE: [char; 128] = [
    '@', '£', '$', '¥', 'è', 'é', 'ù', 'ì', 'ò', 'Ç', '\n', 'Ø', 'ø', '\r', 'Å', 'å', //
    'Δ', '_', 'Φ', 'Γ', 'Λ', 'Ω', 'Π', 'Ψ', 'Σ', 'Θ', 'Ξ', ' ', 'Æ', 'æ', 'ß', 'É', //
    ' ', '!', '"', '#', '¤', '%', '&', '\'', '(', ')', '*', '+', ',', '-', '.', '/', //
    '0', '1', '2', '3', '4', '5', '6', '7', '8', '9', ':', ';', '<', '=', '>', '?', //
    '¡', 'A', 'B', 'C', 'D', 'E', 'F', 'G', 'H', 'I', 'J', 'K', 'L', 'M', 'N', 'O', //
    'P', 'Q', 'R', 'S', 'T', 'U', 'V', 'W', 'X', 'Y', 'Z', 'Ä', 'Ö', 'Ñ', 'Ü', '§', //
    '¿', 'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j', 'k', 'l', 'm', 'n', 'o', //
    'p', 'q', 'r', 's', 't', 'u', 'v', 'w', 'x', 'y', 'z', 'ä', 'ö', 'ñ', 'ü', 'à', //
];

/// The extension table: (septet after 0x1B, character).
pub const EXTENSION_TABLE: [(u8, char); 10] = [
    (0x0A, '\u{0C}'), // form feed (page break)
    (0x14, '^'),
    (0x28, '{'),
    (0x29, '}'),
    (0x2F, '\\'),
    (0x3C, '['),
    (0x3D, '~'),
    (0x3E, ']'),
    (0x40, '|'),
    (0x65, '€'),
];

/// Not-in-table marker for [`ASCII_TO_SEPTET`].
const NONE: u8 = 0xFF;
/// Marks an ASCII character that lives in the extension table.
const EXT_FLAG: u8 = 0x80;

/// ASCII fast path for encoding: septet, septet | EXT_FLAG, or NONE. Computed at compile
/// time from the two tables so it cannot drift from them.
const ASCII_TO_SEPTET: [u8; 128] = {
    let mut map = [NONE; 128];
    let mut i = 0;
    while i < 128 {
        let ch = DEFAULT_TABLE[i] as u32;
        if i != ESCAPE as usize && ch < 128 {
            map[ch as usize] = i as u8;
        }
        i += 1;
    }
    let mut j = 0;
    while j < EXTENSION_TABLE.len() {
        let (septet, ch) = EXTENSION_TABLE[j];
        if (ch as u32) < 128 {
            map[ch as usize] = septet | EXT_FLAG;
        }
        j += 1;
    }
    map
};

/// How one character is written in GSM 7-bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Septets {
    Default(u8),
    /// Written as 0x1B followed by this septet.
    Extension(u8),
}

/// The GSM encoding of `ch`, if it has one.
pub fn lookup(ch: char) -> Option<Septets> {
    if let Some(&mapped) = ASCII_TO_SEPTET.get(ch as usize) {
        return match mapped {
            NONE => None,
            m if m & EXT_FLAG != 0 => Some(Septets::Extension(m & !EXT_FLAG)),
            m => Some(Septets::Default(m)),
        };
    }
    if let Some(pos) = DEFAULT_TABLE
        .iter()
        .enumerate()
        .position(|(i, &c)| c == ch && i != usize::from(ESCAPE))
    {
        return u8::try_from(pos).ok().map(Septets::Default);
    }
    EXTENSION_TABLE
        .iter()
        .find(|(_, c)| *c == ch)
        .map(|(septet, _)| Septets::Extension(*septet))
}

/// True when `ch` can be sent in GSM 7-bit.
pub fn is_representable(ch: char) -> bool {
    lookup(ch).is_some()
}

fn default_char(septet: u8) -> Option<char> {
    DEFAULT_TABLE.get(usize::from(septet)).copied()
}

/// Decodes unpacked septets.
///
/// An escape followed by a septet the extension table does not define is shown as the
/// default-table character for that septet, and 0x1B 0x1B (reserved for a further
/// extension table) as a space — both as TS 23.038 tells a receiver to do. An octet above
/// 0x7F is not a septet, and an escape with nothing after it means the data was cut: both
/// are errors.
pub fn decode(bytes: &[u8]) -> Result<String, TextError> {
    let mut out = String::with_capacity(bytes.len());
    let mut iter = bytes.iter().copied().enumerate();
    while let Some((offset, septet)) = iter.next() {
        if septet == ESCAPE {
            let Some((next_offset, next)) = iter.next() else {
                return Err(TextError::DanglingEscape { offset });
            };
            let ch = match EXTENSION_TABLE.iter().find(|(s, _)| *s == next) {
                Some((_, ch)) => *ch,
                None if next == ESCAPE => ' ',
                None => default_char(next).ok_or(TextError::InvalidSeptet {
                    offset: next_offset,
                    byte: next,
                })?,
            };
            out.push(ch);
        } else {
            out.push(default_char(septet).ok_or(TextError::InvalidSeptet { offset, byte: septet })?);
        }
    }
    Ok(out)
}

/// Encodes `text` as unpacked septets, extension characters as 0x1B + septet.
pub fn encode(text: &str) -> Result<Vec<u8>, TextError> {
    let mut out = Vec::with_capacity(text.len());
    for (position, ch) in text.chars().enumerate() {
        match lookup(ch) {
            Some(Septets::Default(septet)) => out.push(septet),
            Some(Septets::Extension(septet)) => {
                out.push(ESCAPE);
                out.push(septet);
            }
            None => {
                return Err(TextError::Unrepresentable {
                    alphabet: super::Alphabet::Gsm7,
                    ch,
                    position,
                });
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_default_character_round_trips() {
        for (septet, &ch) in DEFAULT_TABLE.iter().enumerate() {
            if septet == usize::from(ESCAPE) {
                continue;
            }
            let septet = u8::try_from(septet).unwrap();
            let text = ch.to_string();
            assert_eq!(encode(&text).unwrap(), vec![septet], "{ch:?}");
            assert_eq!(decode(&[septet]).unwrap(), text);
        }
    }

    #[test]
    fn every_extension_character_uses_the_escape_and_round_trips() {
        for (septet, ch) in EXTENSION_TABLE {
            let text = ch.to_string();
            assert_eq!(encode(&text).unwrap(), vec![ESCAPE, septet], "{ch:?}");
            assert_eq!(decode(&[ESCAPE, septet]).unwrap(), text);
        }
        for ch in ['€', '[', ']', '{', '}', '~', '\\', '^', '|'] {
            assert_eq!(encode(&ch.to_string()).unwrap()[0], ESCAPE, "{ch:?}");
        }
    }

    #[test]
    fn ascii_that_differs_from_gsm_is_mapped() {
        // '@' is septet 0, '_' 0x11, '$' 0x02; '`' does not exist in GSM.
        assert_eq!(encode("@_$").unwrap(), vec![0x00, 0x11, 0x02]);
        assert!(encode("`").is_err());
        assert!(!is_representable('`'));
        assert!(!is_representable('ç'));
        assert!(is_representable('Ç'));
        assert!(!is_representable('\u{1B}'));
    }

    #[test]
    fn decode_edge_cases() {
        assert_eq!(decode(&[ESCAPE, 0x41]).unwrap(), "A");
        assert_eq!(decode(&[ESCAPE, ESCAPE]).unwrap(), " ");
        assert_eq!(
            decode(&[0x41, ESCAPE]).unwrap_err(),
            TextError::DanglingEscape { offset: 1 }
        );
        assert_eq!(
            decode(&[0x41, 0x80]).unwrap_err(),
            TextError::InvalidSeptet { offset: 1, byte: 0x80 }
        );
        assert!(decode(&[ESCAPE, 0xFF]).is_err());
        assert_eq!(decode(&[]).unwrap(), "");
    }

    #[test]
    fn unrepresentable_error_names_position_not_character() {
        let err = encode("ab😀").unwrap_err();
        assert!(matches!(
            err,
            TextError::Unrepresentable {
                ch: '😀',
                position: 2,
                ..
            }
        ));
        assert!(!err.to_string().contains('😀'));
    }
}
