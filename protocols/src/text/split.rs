//! Splitting encoded user data into SMS segments, and the concatenation UDHs that go in
//! front of each part.
//!
//! The split works on the *encoded* octets so the provider receives exactly the bytes the
//! ESME (or the HTTP encoder) produced — re-encoding could change them (GSM escapes, UCS2
//! vs UTF-16). Cuts are placed only between characters: never inside a GSM escape pair
//! (0x1B + septet), a UCS2 code unit, or a UTF-16 surrogate pair; a character split across
//! two parts shows as garbage on the handset.

use super::Alphabet;
use super::gsm7::ESCAPE;

/// `(single, per_part)`: how many octets of user data, as SMPP carries them, fit in one
/// unsegmented SMS, and in each part of a concatenated SMS with a 6-octet (8-bit
/// reference) concatenation UDH.
///
/// - `Gsm7`: 160 / 153 septets — one octet each, since SMPP carries them unpacked (the
///   6-octet UDH takes 7 septets of the 160).
/// - `Latin1`, `Ia5`, `Binary`: 140 / 134 octets.
/// - `Ucs2`: 140 / 134 octets, i.e. 70 / 67 UTF-16 code units.
pub fn segment_limits(alphabet: Alphabet) -> (usize, usize) {
    match alphabet {
        Alphabet::Gsm7 => (160, 153),
        Alphabet::Latin1 | Alphabet::Ia5 | Alphabet::Binary | Alphabet::Ucs2 => (140, 134),
    }
}

/// Splits encoded `user_data` into segments of at most `per_part` octets (see
/// [`segment_limits`]), or returns it whole when it fits in `single`.
///
/// Segments borrow from `user_data` and concatenate back to it exactly.
pub fn split(alphabet: Alphabet, user_data: &[u8]) -> Vec<&[u8]> {
    split_with_limits(alphabet, user_data, segment_limits(alphabet))
}

/// [`split`] with explicit `(single, per_part)` limits, e.g. one octet fewer per part for
/// a 7-octet 16-bit-reference UDH (152 septets / 133 octets / 132 UCS2 octets).
///
/// If a single character is longer than `per_part` (only with absurdly small limits) the
/// segment holds that character anyway, so the split always makes progress.
pub fn split_with_limits(alphabet: Alphabet, user_data: &[u8], (single, per_part): (usize, usize)) -> Vec<&[u8]> {
    if user_data.len() <= single {
        return vec![user_data];
    }
    let mut parts = Vec::with_capacity(user_data.len() / per_part.max(1) + 1);
    let mut rest = user_data;
    while !rest.is_empty() {
        let cut = cut_point(alphabet, rest, per_part);
        let (part, tail) = rest.split_at(cut);
        parts.push(part);
        rest = tail;
    }
    parts
}

/// Length of the character starting at `data[0]` (data is not empty).
fn unit_len(alphabet: Alphabet, data: &[u8]) -> usize {
    match alphabet {
        Alphabet::Gsm7 => match data {
            [ESCAPE, _, ..] => 2,
            _ => 1,
        },
        Alphabet::Ucs2 => match data {
            [hi, _, lo, _, ..] if is_high_surrogate(*hi) && is_low_surrogate(*lo) => 4,
            [_, _, ..] => 2,
            // A trailing odd octet (invalid UCS2) is kept as its own unit, bytes unchanged.
            _ => 1,
        },
        Alphabet::Latin1 | Alphabet::Ia5 | Alphabet::Binary => 1,
    }
}

fn is_high_surrogate(first_octet: u8) -> bool {
    (0xD8..=0xDB).contains(&first_octet)
}

fn is_low_surrogate(first_octet: u8) -> bool {
    (0xDC..=0xDF).contains(&first_octet)
}

/// The largest prefix of `data` of at most `max` octets that ends between characters
/// (at least one whole character).
fn cut_point(alphabet: Alphabet, data: &[u8], max: usize) -> usize {
    if data.len() <= max {
        return data.len();
    }
    let mut at = 0;
    while let Some(rest) = data.get(at..).filter(|rest| !rest.is_empty()) {
        let unit = unit_len(alphabet, rest);
        if at + unit > max {
            break;
        }
        at += unit;
    }
    if at == 0 {
        unit_len(alphabet, data).min(data.len())
    } else {
        at
    }
}

/// The concatenation UDH with an 8-bit reference (IEI 0x00, 3GPP TS 23.040 §9.2.3.24.1),
/// UDHL included: `05 00 03 ref total seq`. Set esm_class bit 0x40 (UDHI) on the PDU.
pub fn concat_udh_8bit(reference: u8, total: u8, seq: u8) -> [u8; 6] {
    [0x05, 0x00, 0x03, reference, total, seq]
}

/// The concatenation UDH with a 16-bit reference (IEI 0x08, §9.2.3.24.8), UDHL included:
/// `06 08 04 ref_hi ref_lo total seq`.
pub fn concat_udh_16bit(reference: u16, total: u8, seq: u8) -> [u8; 7] {
    let [hi, lo] = reference.to_be_bytes();
    [0x06, 0x08, 0x04, hi, lo, total, seq]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::encode;

    fn lengths(parts: &[&[u8]]) -> Vec<usize> {
        parts.iter().map(|p| p.len()).collect()
    }

    #[test]
    fn fits_in_one_segment() {
        let text = encode(Alphabet::Gsm7, &"a".repeat(160)).unwrap();
        assert_eq!(split(Alphabet::Gsm7, &text), vec![&text[..]]);
        let empty: &[u8] = &[];
        assert_eq!(split(Alphabet::Gsm7, empty), vec![empty]);
        let ucs2 = encode(Alphabet::Ucs2, &"é".repeat(70)).unwrap();
        assert_eq!(split(Alphabet::Ucs2, &ucs2).len(), 1);
    }

    #[test]
    fn gsm_161_splits_153_plus_8() {
        let text = encode(Alphabet::Gsm7, &"a".repeat(161)).unwrap();
        let parts = split(Alphabet::Gsm7, &text);
        assert_eq!(lengths(&parts), vec![153, 8]);
        assert_eq!(parts.concat(), text);
    }

    #[test]
    fn gsm_escape_pair_is_not_split_at_the_boundary() {
        // 152 plain septets, then '€' = 0x1B 0x65: the 153rd septet is the escape.
        let text = format!("{}€{}", "a".repeat(152), "b".repeat(7));
        let data = encode(Alphabet::Gsm7, &text).unwrap();
        assert_eq!(data.len(), 161);
        assert_eq!(data[152], ESCAPE);
        let parts = split(Alphabet::Gsm7, &data);
        assert_eq!(lengths(&parts), vec![152, 9]);
        assert_eq!(parts[1][..2], [ESCAPE, 0x65]);
        assert_eq!(parts.concat(), data);
    }

    #[test]
    fn gsm_all_escapes_stay_paired() {
        let data = encode(Alphabet::Gsm7, &"€".repeat(200)).unwrap();
        let parts = split(Alphabet::Gsm7, &data);
        for part in &parts {
            assert_eq!(part.len() % 2, 0);
            assert!(part.chunks(2).all(|pair| pair == [ESCAPE, 0x65]));
        }
        assert_eq!(parts.concat(), data);
    }

    #[test]
    fn gsm_escaped_escape_pairs_are_counted_from_the_start() {
        // 0x1B 0x1B is one pair: the 0x1B at index 153 starts a new pair, not the end of one.
        let mut data = vec![0x41; 151];
        data.extend_from_slice(&[ESCAPE, ESCAPE, ESCAPE, 0x65]);
        data.extend_from_slice(&[0x41; 10]);
        let parts = split(Alphabet::Gsm7, &data);
        assert_eq!(lengths(&parts), vec![153, 12]);
    }

    #[test]
    fn ucs2_surrogates_are_never_split() {
        // 66 BMP characters (132 octets), then emoji: the pair would straddle octet 134.
        let text = format!("{}{}", "a".repeat(66), "😀".repeat(10));
        let data = encode(Alphabet::Ucs2, &text).unwrap();
        let parts = split(Alphabet::Ucs2, &data);
        assert_eq!(parts[0].len(), 132);
        for part in &parts {
            assert!(part.len() <= 134);
            crate::text::decode(0x08, part).unwrap();
        }
        assert_eq!(parts.concat(), data);

        let emoji = encode(Alphabet::Ucs2, &"😀".repeat(50)).unwrap();
        let parts = split(Alphabet::Ucs2, &emoji);
        assert!(parts.iter().all(|p| p.len() % 4 == 0 && p.len() <= 134));
        assert_eq!(parts.concat(), emoji);
    }

    #[test]
    fn ucs2_code_units_are_never_split() {
        let data = encode(Alphabet::Ucs2, &"é".repeat(100)).unwrap();
        let parts = split_with_limits(Alphabet::Ucs2, &data, (140, 133));
        assert!(parts.iter().all(|p| p.len() % 2 == 0));
        assert_eq!(parts[0].len(), 132);
        // An odd trailing octet (invalid UCS2) is preserved, not dropped.
        let mut odd = data.clone();
        odd.push(0x41);
        assert_eq!(split(Alphabet::Ucs2, &odd).concat(), odd);
    }

    #[test]
    fn octet_alphabets_split_at_134() {
        let data = vec![0xE9u8; 300];
        for alphabet in [Alphabet::Latin1, Alphabet::Ia5, Alphabet::Binary] {
            let parts = split(alphabet, &data);
            assert_eq!(lengths(&parts), vec![134, 134, 32]);
        }
        assert_eq!(split(Alphabet::Latin1, &data[..140]).len(), 1);
    }

    #[test]
    fn tiny_limits_still_make_progress() {
        let data = encode(Alphabet::Gsm7, "€€").unwrap();
        assert_eq!(split_with_limits(Alphabet::Gsm7, &data, (0, 1)).len(), 2);
        assert_eq!(split_with_limits(Alphabet::Latin1, b"abc", (0, 0)).len(), 3);
    }

    #[test]
    fn limits_match_the_spec() {
        assert_eq!(segment_limits(Alphabet::Gsm7), (160, 153));
        assert_eq!(segment_limits(Alphabet::Ucs2), (140, 134));
        assert_eq!(segment_limits(Alphabet::Latin1), (140, 134));
    }

    #[test]
    fn concat_udhs() {
        assert_eq!(concat_udh_8bit(0x42, 3, 1), [0x05, 0x00, 0x03, 0x42, 0x03, 0x01]);
        assert_eq!(
            concat_udh_16bit(0x1234, 3, 2),
            [0x06, 0x08, 0x04, 0x12, 0x34, 0x03, 0x02]
        );
    }
}
