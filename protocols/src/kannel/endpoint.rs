//! `GET`/`POST /cgi-bin/sendsms`: credentials, then parameters, then one admission per
//! receiver through the same handler as `POST /v1/messages`; the answer is Kannel's text.
//!
//! A POST carries the same parameters as an `application/x-www-form-urlencoded` body
//! (parameters in the query string count too, after the body's). Kannel's other POST
//! forms (a `text/plain` body with `X-Kannel-*` headers, XML) are refused with Kannel's
//! "Unsupported content-type" answer.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::sendsms::{self, Answer, Params};
use crate::auth_guard::Verdict;
use crate::http::{BodyError, HttpOutcome, Ingress};

/// The answer as Kannel's smsbox sends it: plain text in a `text/html` body, not cached.
fn reply(a: Answer) -> Response {
    metrics::counter!("sendium_sendsms_requests_total", "status" => a.status.to_string()).increment(1);
    let status = StatusCode::from_u16(a.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        status,
        [
            (header::CONTENT_TYPE, "text/html"),
            (header::PRAGMA, "no-cache"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        a.text,
    )
        .into_response()
}

/// The request's parameters: the query string, and a form body after it.
async fn params(state: &Ingress, req: Request) -> Result<Params, Answer> {
    let (parts, body) = req.into_parts();
    let mut raw = parts.uri.query().unwrap_or_default().as_bytes().to_vec();
    if parts.method == Method::POST {
        let form = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/x-www-form-urlencoded"));
        if !form {
            return Err(Answer {
                status: 415,
                text: "Unsupported content-type, rejected".into(),
            });
        }
        let body = match state.read_body(body).await {
            Ok(b) => b,
            Err(BodyError::TooLarge) => {
                return Err(Answer {
                    status: 413,
                    text: format!("The body is larger than {} bytes, rejected", state.max_body_bytes),
                });
            }
            Err(BodyError::TooSlow) => {
                return Err(Answer {
                    status: 408,
                    text: "The body did not arrive in time, rejected".into(),
                });
            }
        };
        raw.push(b'&');
        raw.extend_from_slice(&body);
    }
    Ok(Params::parse(&raw))
}

pub(crate) async fn sendsms(State(state): State<Arc<Ingress>>, req: Request) -> Response {
    let ip = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(a)| a.ip());
    if let Some(ip) = ip
        && let Verdict::Refuse(_) = state.auth.check(ip, None)
    {
        // Kannel has no back-off answer of its own: an address that keeps failing is
        // told what it was told before, without its credentials being looked at.
        metrics::counter!("sendium_auth_refused_total", "listener" => "sendsms").increment(1);
        return reply(Answer::forbidden());
    }
    let params = match params(&state, req).await {
        Ok(p) => p,
        Err(a) => return reply(a),
    };
    let account = match params.credentials() {
        (Some(user), Some(pass)) => state.access.sendsms_account(user, pass, ip),
        _ => None,
    };
    let Some(account) = account else {
        if let Some(ip) = ip {
            tracing::warn!(peer = %ip, "/cgi-bin/sendsms request with a wrong or missing username or password");
            state.auth_failed(ip, "sendsms").await;
        }
        return reply(Answer::forbidden());
    };
    let request = match sendsms::parse(&params) {
        Ok(r) => r,
        Err(a) => return reply(a),
    };
    if let Some(url) = &request.dlr_url
        && state.callback_targets.check_url(url).is_err()
    {
        return reply(Answer {
            status: 400,
            text: "DLR-URL field misformed, rejected".into(),
        });
    }
    if !request.to.iter().all(|_| state.admit_rate(&account)) {
        return reply(Answer::unavailable());
    }
    let receivers = request.to.clone();
    let outcomes = state.handler.sendsms(&account, request).await;
    reply(answer(&receivers, &outcomes))
}

/// One answer for the outcomes of a request's receivers.
fn answer(receivers: &[String], outcomes: &[HttpOutcome]) -> Answer {
    let admitted = |o: &HttpOutcome| {
        matches!(
            o,
            HttpOutcome::Accepted(_) | HttpOutcome::Duplicate(_) | HttpOutcome::Queued(_)
        )
    };
    if outcomes.len() == receivers.len() && outcomes.iter().all(admitted) {
        if outcomes.iter().any(|o| matches!(o, HttpOutcome::Queued(_))) {
            return Answer::queued();
        }
        return Answer::accepted();
    }
    if outcomes.iter().any(admitted) {
        let failed: Vec<String> = receivers
            .iter()
            .zip(outcomes)
            .filter(|(_, o)| !admitted(o))
            .map(|(r, _)| r.clone())
            .collect();
        return Answer::failed_receivers(&failed);
    }
    match outcomes.first() {
        // Receipts asked for while receipts are disabled: no retry will help.
        Some(HttpOutcome::Invalid {
            field: "callback_url", ..
        }) => Answer::not_routable(),
        // `deferred` further ahead than the receipt it asks for can be kept.
        Some(HttpOutcome::Invalid {
            field: "deliver_at", ..
        }) => Answer {
            status: 400,
            text: "Deferred field misformed, rejected".into(),
        },
        Some(HttpOutcome::Invalid { .. }) => Answer {
            status: 400,
            text: "Charset or body misformed, rejected".into(),
        },
        _ => Answer::unavailable(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_become_kannels_answers() {
        let to = ["111".to_string(), "222".to_string()];
        let ok = HttpOutcome::Accepted("id".into());
        let full = HttpOutcome::Unavailable;
        assert_eq!(answer(&to, &[ok.clone(), ok.clone()]), Answer::accepted());
        assert_eq!(
            answer(&to, &[ok, full.clone()]).text,
            "Sending failed. Failed receivers are: 222"
        );
        assert_eq!(answer(&to, &[full.clone(), full.clone()]), Answer::unavailable());
        let queued = HttpOutcome::Queued("id".into());
        let ok = HttpOutcome::Accepted("id".into());
        assert_eq!(
            answer(&to, &[ok.clone(), queued.clone()]),
            Answer {
                status: 202,
                text: "3: Queued for later delivery".into()
            },
            "stored, and one receiver waits for a destination"
        );
        assert_eq!(
            answer(&to, &[queued, full]).text,
            "Sending failed. Failed receivers are: 222"
        );
        let disabled = HttpOutcome::Invalid {
            field: "callback_url",
            reason: String::new(),
        };
        assert_eq!(answer(&to[..1], &[disabled]).status, 403);
    }
}
