//! The crate's umbrella error, for callers that handle every protocol failure the same way
//! (log the kind, refuse the input). Each operation family keeps its own precise error;
//! they all convert into this one with `?`.

use crate::multipart::MultipartError;
use crate::receipt::ReceiptError;
use crate::smpp::build::BuildError;
use crate::smpp::frame::FrameError;
use crate::text::TextError;

/// Any error of `sendium-protocols`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Text(#[from] TextError),
    #[error(transparent)]
    Multipart(#[from] MultipartError),
    #[error(transparent)]
    Receipt(#[from] ReceiptError),
}

/// `e` and its sources on one line, `: `-separated: the reason a wrapper's own message
/// hides (a TLS handshake's "invalid peer certificate: UnknownIssuer").
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_convert_into_the_umbrella() {
        fn fails() -> Result<(), Error> {
            crate::multipart::from_sar(1, 0, 1)?;
            Ok(())
        }
        assert_eq!(fails().unwrap_err(), Error::Multipart(MultipartError::ZeroTotal));
        let err: Error = crate::text::decode(0x08, &[0]).unwrap_err().into();
        assert_eq!(
            err.to_string(),
            "UCS2 data of 1 octets is not a whole number of code units"
        );
    }
}
