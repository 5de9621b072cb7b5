//! A submission's fields, rendered from the destination's templates into a JSON object, a
//! form body or a query string.

use bytes::Bytes;

use crate::smpp::client::OutboundSubmit;
use crate::text::{self, Alphabet};

/// esm_class bit: the short_message starts with a user data header.
const UDHI: u8 = 0x40;

/// A placeholder of a field template.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placeholder {
    From,
    To,
    Text,
    Coding,
    Id,
    Callback,
    /// When the provider is to deliver the message: RFC 3339 in UTC, empty for at once.
    DeliverAt,
}

impl Placeholder {
    /// The placeholder of a template's `{name}`.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "from" => Self::From,
            "to" => Self::To,
            "text" => Self::Text,
            "coding" => Self::Coding,
            "id" => Self::Id,
            "callback" => Self::Callback,
            "deliver_at" => Self::DeliverAt,
            _ => return None,
        })
    }
}

/// One piece of a field template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    Literal(String),
    Value(Placeholder),
}

/// A field: its name and template.
pub type Field = (String, Vec<Piece>);

/// How the fields travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// POST, `application/json`: an object of strings.
    Json,
    /// POST, `application/x-www-form-urlencoded`.
    Form,
    /// GET: the query string.
    Query,
}

/// What the placeholders of one submission stand for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Values {
    pub from: String,
    pub to: String,
    pub text: String,
    pub coding: &'static str,
    pub id: String,
    pub callback: String,
    /// `{deliver_at}`: RFC 3339 in UTC while the part's schedule is in the future, else
    /// empty.
    pub deliver_at: String,
}

/// Why a part cannot be sent over HTTP.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the part's user data cannot be decoded as its data_coding says")]
pub struct Undecodable;

impl Values {
    /// The values of a part: its text decoded per its data_coding, without any UDH.
    pub fn of(part: &OutboundSubmit, id: String, callback: String) -> Result<Self, Undecodable> {
        let mut data: &[u8] = &part.short_message;
        if part.esm_class & UDHI != 0 {
            let udh_len = usize::from(*data.first().ok_or(Undecodable)?) + 1;
            data = data.get(udh_len..).ok_or(Undecodable)?;
        }
        let alphabet = Alphabet::from_data_coding(part.data_coding);
        let text = match alphabet {
            Alphabet::Binary => hex(data),
            _ => text::decode(part.data_coding, data).map_err(|_| Undecodable)?,
        };
        Ok(Values {
            from: part.source.addr.clone(),
            to: part.destination.addr.clone(),
            text,
            coding: coding_name(alphabet),
            id,
            callback,
            deliver_at: part
                .schedule_delivery_time
                .filter(|&at| at > crate::smpp::time::now_ms())
                // Ingress refuses times past 2099: one here is given as the latest.
                .map(|at| crate::smpp::time::rfc3339(at.min(crate::smpp::time::LATEST_MS)).unwrap_or_default())
                .unwrap_or_default(),
        })
    }

    /// The part is scheduled for later: only a destination whose fields carry
    /// `{deliver_at}` can send it as asked.
    pub fn scheduled(&self) -> bool {
        !self.deliver_at.is_empty()
    }

    fn get(&self, p: Placeholder) -> &str {
        match p {
            Placeholder::From => &self.from,
            Placeholder::To => &self.to,
            Placeholder::Text => &self.text,
            Placeholder::Coding => self.coding,
            Placeholder::Id => &self.id,
            Placeholder::Callback => &self.callback,
            Placeholder::DeliverAt => &self.deliver_at,
        }
    }
}

/// `{coding}`: `gsm7|ucs2|latin1|ascii|binary`.
pub fn coding_name(a: Alphabet) -> &'static str {
    match a {
        Alphabet::Gsm7 => "gsm7",
        Alphabet::Ucs2 => "ucs2",
        Alphabet::Latin1 => "latin1",
        Alphabet::Ia5 => "ascii",
        Alphabet::Binary => "binary",
    }
}

fn hex(data: &[u8]) -> String {
    data.iter().map(|b| format!("{b:02x}")).collect()
}

fn expand(template: &[Piece], values: &Values) -> String {
    let mut out = String::new();
    for piece in template {
        match piece {
            Piece::Literal(s) => out.push_str(s),
            Piece::Value(p) => out.push_str(values.get(*p)),
        }
    }
    out
}

/// The rendered fields: `(body, content type)` for POST, or the query string to append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rendered {
    Body { body: Bytes, content_type: &'static str },
    Query(String),
}

/// Render the fields of one submission.
pub fn render(fields: &[Field], encoding: Encoding, values: &Values) -> Rendered {
    let pairs = fields.iter().map(|(name, t)| (name.as_str(), expand(t, values)));
    match encoding {
        Encoding::Json => {
            let map: serde_json::Map<String, serde_json::Value> = pairs
                .map(|(k, v)| (k.to_owned(), serde_json::Value::String(v)))
                .collect();
            Rendered::Body {
                body: Bytes::from(serde_json::Value::Object(map).to_string()),
                content_type: "application/json",
            }
        }
        Encoding::Form => Rendered::Body {
            body: Bytes::from(form(pairs)),
            content_type: "application/x-www-form-urlencoded",
        },
        Encoding::Query => Rendered::Query(form(pairs)),
    }
}

fn form<'a>(pairs: impl Iterator<Item = (&'a str, String)>) -> String {
    let mut s = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        s.append_pair(k, &v);
    }
    s.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::smpp::SmppAddress;

    fn values() -> Values {
        Values {
            from: "Shop".into(),
            to: "447700900123".into(),
            text: "a \"quote\" & ü=1".into(),
            coding: "ucs2",
            id: "m-1".into(),
            callback: "http://gw/v1/providers/h/receipts".into(),
            deliver_at: String::new(),
        }
    }

    fn fields() -> Vec<Field> {
        vec![
            (
                "to".into(),
                vec![Piece::Literal("+".into()), Piece::Value(Placeholder::To)],
            ),
            ("msg".into(), vec![Piece::Value(Placeholder::Text)]),
            ("ref".into(), vec![Piece::Value(Placeholder::Id)]),
        ]
    }

    #[test]
    fn json_escapes_the_text() {
        let Rendered::Body { body, content_type } = render(&fields(), Encoding::Json, &values()) else {
            panic!("a body")
        };
        assert_eq!(content_type, "application/json");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["to"], "+447700900123");
        assert_eq!(v["msg"], "a \"quote\" & ü=1");
        assert_eq!(v["ref"], "m-1");
    }

    #[test]
    fn form_and_query_percent_encode() {
        let Rendered::Body { body, content_type } = render(&fields(), Encoding::Form, &values()) else {
            panic!("a body")
        };
        assert_eq!(content_type, "application/x-www-form-urlencoded");
        assert_eq!(
            &body[..],
            b"to=%2B447700900123&msg=a+%22quote%22+%26+%C3%BC%3D1&ref=m-1"
        );
        assert_eq!(
            render(&fields(), Encoding::Query, &values()),
            Rendered::Query("to=%2B447700900123&msg=a+%22quote%22+%26+%C3%BC%3D1&ref=m-1".into())
        );
    }

    #[test]
    fn values_strip_the_udh_and_name_the_coding() {
        let mut sm = text::concat_udh_8bit(7, 2, 1).to_vec();
        sm.extend_from_slice(&text::encode(Alphabet::Gsm7, "hello").unwrap());
        let part = OutboundSubmit {
            service_type: String::new(),
            source: SmppAddress::new(5, 0, "Shop"),
            destination: SmppAddress::new(1, 1, "447700900123"),
            esm_class: 0x43,
            protocol_id: 0,
            priority_flag: 0,
            registered_delivery: 1,
            data_coding: 0,
            short_message: sm,
            schedule_delivery_time: None,
        };
        let v = Values::of(&part, "x".into(), String::new()).unwrap();
        assert_eq!(
            (v.text.as_str(), v.coding, v.to.as_str()),
            ("hello", "gsm7", "447700900123")
        );
        assert!(!v.scheduled() && v.deliver_at.is_empty());
        // A schedule in the future is `{deliver_at}` in UTC; one gone by is no schedule.
        let mut later = part.clone();
        let at = crate::smpp::time::now_ms() + 86_400_000;
        later.schedule_delivery_time = Some(at);
        let v = Values::of(&later, "x".into(), String::new()).unwrap();
        assert!(v.scheduled());
        let parsed = humantime::parse_rfc3339(&v.deliver_at).unwrap();
        let ms = u64::try_from(parsed.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()).unwrap();
        assert_eq!(ms, at - at % 1_000, "{}", v.deliver_at);
        later.schedule_delivery_time = Some(1_000);
        assert!(!Values::of(&later, "x".into(), String::new()).unwrap().scheduled());
        let mut bad = part;
        bad.short_message = vec![9, 0];
        assert_eq!(Values::of(&bad, "x".into(), String::new()), Err(Undecodable));
    }
}
