//! A client certificate's subject, as `tls-subject` compares it: the attributes CN, O, OU,
//! C, L and ST of the leaf certificate's subject name, read from its DER after rustls has
//! verified the chain. Other attributes and string types are skipped, never guessed.

use rustls::pki_types::CertificateDer;

/// The attribute names `tls-subject` may use, with their OIDs (2.5.4.x, DER content).
const ATTRIBUTES: [(&str, &[u8]); 6] = [
    ("CN", &[0x55, 0x04, 0x03]),
    ("C", &[0x55, 0x04, 0x06]),
    ("L", &[0x55, 0x04, 0x07]),
    ("ST", &[0x55, 0x04, 0x08]),
    ("O", &[0x55, 0x04, 0x0A]),
    ("OU", &[0x55, 0x04, 0x0B]),
];

/// The names accepted in `tls-subject`, for messages.
pub const SUBJECT_ATTRIBUTES: &str = "CN, O, OU, C, L, ST";

/// Attribute/value pairs, e.g. `[("CN", "esme1"), ("O", "Shop")]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Subject(pub Vec<(String, String)>);

impl Subject {
    /// The subject of a verified leaf certificate; None when it cannot be read.
    pub fn of(cert: &CertificateDer<'_>) -> Option<Subject> {
        let cert = webpki::EndEntityCert::try_from(cert).ok()?;
        parse_rdn_sequence(cert.subject())
    }

    /// `tls-subject` text: `NAME=value` pairs separated by commas, NAME one of
    /// [`SUBJECT_ATTRIBUTES`] (spaces around pairs are ignored; values may not contain
    /// commas).
    pub fn parse(text: &str) -> Result<Subject, String> {
        let mut pairs = Vec::new();
        for part in text.split(',') {
            let part = part.trim();
            let Some((name, value)) = part.split_once('=') else {
                return Err(format!("{part:?} is not NAME=value"));
            };
            let name = name.trim();
            let Some((known, _)) = ATTRIBUTES.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)) else {
                return Err(format!("{name:?} is not one of {SUBJECT_ATTRIBUTES}"));
            };
            if value.trim().is_empty() {
                return Err(format!("{name} has no value"));
            }
            pairs.push(((*known).to_owned(), value.trim().to_owned()));
        }
        Ok(Subject(pairs))
    }

    /// Every pair of `required` is in this subject (values compared exactly).
    pub fn satisfies(&self, required: &Subject) -> bool {
        required.0.iter().all(|pair| self.0.contains(pair))
    }
}

/// One DER TLV: (tag, content, rest). Only the length forms DER uses up to 64 KiB.
fn tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = match first {
        0..=0x7F => (usize::from(first), rest),
        0x81 => (usize::from(*rest.first()?), rest.get(1..)?),
        0x82 => (
            usize::from(*rest.first()?) << 8 | usize::from(*rest.get(1)?),
            rest.get(2..)?,
        ),
        _ => return None,
    };
    Some((tag, rest.get(..len)?, rest.get(len..)?))
}

fn parse_rdn_sequence(mut rdns: &[u8]) -> Option<Subject> {
    let mut pairs = Vec::new();
    while !rdns.is_empty() {
        let (tag, mut set, rest) = tlv(rdns)?;
        rdns = rest;
        if tag != 0x31 {
            return None;
        }
        while !set.is_empty() {
            let (tag, attribute, rest) = tlv(set)?;
            set = rest;
            if tag != 0x30 {
                return None;
            }
            let (oid_tag, oid, value) = tlv(attribute)?;
            if oid_tag != 0x06 {
                return None;
            }
            let (value_tag, value, _) = tlv(value)?;
            let Some((name, _)) = ATTRIBUTES.iter().find(|(_, o)| *o == oid) else {
                continue;
            };
            if let Some(text) = decode_string(value_tag, value) {
                pairs.push(((*name).to_owned(), text));
            }
        }
    }
    Some(Subject(pairs))
}

/// UTF8String, PrintableString, IA5String and BMPString; other string types are skipped.
fn decode_string(tag: u8, value: &[u8]) -> Option<String> {
    match tag {
        0x0C | 0x13 | 0x16 => String::from_utf8(value.to_vec()).ok(),
        0x1E => {
            let units: Vec<u16> = value
                .chunks_exact(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]))
                .collect();
            String::from_utf16(&units).ok()
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_subject_of_a_certificate() {
        let mut params = rcgen::CertificateParams::new(vec!["esme1.example".into()]).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(rcgen::DnType::CommonName, "esme1");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "Shop Ltd");
        params.distinguished_name.push(rcgen::DnType::CountryName, "GB");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let subject = Subject::of(cert.der()).unwrap();
        assert!(subject.0.contains(&("CN".into(), "esme1".into())), "{subject:?}");
        assert!(subject.0.contains(&("O".into(), "Shop Ltd".into())), "{subject:?}");
        assert!(subject.satisfies(&Subject::parse("CN=esme1").unwrap()));
        assert!(subject.satisfies(&Subject::parse(" cn = esme1 , O=Shop Ltd,C=GB").unwrap()));
        assert!(!subject.satisfies(&Subject::parse("CN=esme2").unwrap()));
        assert!(!subject.satisfies(&Subject::parse("CN=esme1,OU=ops").unwrap()));
    }

    #[test]
    fn parse_names_what_is_wrong() {
        assert!(Subject::parse("esme1").unwrap_err().contains("NAME=value"));
        assert!(Subject::parse("XX=1").unwrap_err().contains("CN, O, OU"));
        assert!(Subject::parse("CN=").unwrap_err().contains("no value"));
    }

    #[test]
    fn malformed_der_is_none_not_a_panic() {
        for bad in [
            &[0x31u8][..],
            &[0x31, 0x05, 0x30],
            &[0x30, 0x00],
            &[0x31, 0x84, 0, 0, 0, 1],
        ] {
            assert_eq!(parse_rdn_sequence(bad), None);
        }
        assert_eq!(parse_rdn_sequence(&[]), Some(Subject::default()));
    }
}
