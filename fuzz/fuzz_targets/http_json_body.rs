//! The body of `POST /v1/messages`: `sendium_protocols::http::parse_submission` (JSON,
//! known fields only, each field's type) and `validate_submission` (the rules on `from`,
//! `to`, `text`, `callback_url` and `idempotency_key`, with the callback target check).
//!
//! Input: the raw request body.
//!
//! Checked: nothing panics; an accepted submission satisfies every documented rule; it
//! is a fixed point (validating its own fields again gives it back); an error names one
//! of the body's fields.
#![no_main]
#![forbid(unsafe_code)]

use libfuzzer_sys::fuzz_target;
use sendium_protocols::http::{
    CallbackTargets, MAX_IDEMPOTENCY_KEY, MAX_TEXT_CHARS, MAX_URL, parse_submission, validate_submission,
};

const FIELDS: [&str; 6] = ["body", "from", "to", "text", "callback_url", "idempotency_key"];

fuzz_target!(|data: &[u8]| {
    let targets = CallbackTargets::default();
    let submission = match parse_submission("esme1", data, &targets) {
        Ok(s) => s,
        Err(err) => {
            assert!(FIELDS.contains(&err.field), "unknown field {:?}", err.field);
            return;
        }
    };
    assert_eq!(submission.account, "esme1");

    let from = &submission.from;
    assert!(!from.is_empty() && from.len() <= 20, "from {from:?}");
    assert_eq!(from.trim(), from);
    let numeric = from.trim_start_matches('+').chars().all(|c| c.is_ascii_digit());
    assert!(
        numeric || (from.chars().count() <= 11 && from.chars().all(|c| c.is_ascii_alphanumeric() || c == ' ')),
        "from {from:?}"
    );
    let to = &submission.to;
    assert!(
        !to.is_empty() && to.len() <= 20 && to.bytes().all(|b| b.is_ascii_digit()),
        "to {to:?}"
    );
    let text = &submission.text;
    assert!(!text.is_empty() && text.chars().count() <= MAX_TEXT_CHARS);
    if let Some(url) = &submission.callback_url {
        assert!(url.len() <= MAX_URL);
        assert!(url.starts_with("http://") || url.starts_with("https://"), "{url:?}");
        assert!(!url.contains(char::is_whitespace));
        assert!(targets.check_url(url).is_ok());
    }
    if let Some(key) = &submission.idempotency_key {
        assert!(!key.is_empty() && key.len() <= MAX_IDEMPOTENCY_KEY);
    }

    let again = validate_submission(
        "esme1",
        from,
        to,
        text,
        submission.callback_url.as_deref(),
        submission.idempotency_key.as_deref(),
        &targets,
    );
    assert_eq!(again.as_ref(), Ok(&submission), "validation is not a fixed point");
});
