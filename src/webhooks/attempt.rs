//! One delivery attempt: the event's body, its signed headers, one POST and what came of it.

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use plantstore_store::{Event, EventKind};
use reqwest::{StatusCode, header};
use serde_json::value::RawValue;

use super::signature::sign;

/// What one POST came to.
#[derive(Debug)]
pub(super) enum Attempt {
    /// A 2xx within the timeout.
    Delivered,
    /// 410: the receiver wants no more events.
    Gone,
    /// Anything else: to be tried again, not sooner than `retry_after` if the receiver said.
    Failed {
        error: String,
        retry_after: Option<Duration>,
    },
}

/// Where one endpoint's events go: its URL parsed once for all of its attempts (parsing
/// it for each showed in the delivery's profile), and its secret.
pub(super) struct Target {
    /// Why the stored URL cannot be used (`webhooks add` lets none such in).
    url: Result<reqwest::Url, String>,
    secret: String,
}

impl Target {
    pub(super) fn new(url: &str, secret: String) -> Self {
        let url = reqwest::Url::parse(url)
            .map_err(|err| format!("the endpoint's stored URL cannot be used: {err}"));
        Self { url, secret }
    }
}

impl Attempt {
    /// A failure the receiver gave no advice on.
    fn failed(error: String) -> Self {
        Attempt::Failed {
            error,
            retry_after: None,
        }
    }
}

/// The keep-alive client every endpoint's deliveries share.
#[derive(Debug, Clone)]
pub(super) struct Sender {
    /// Why there is none (no CA certificates on the machine, say): every attempt then fails
    /// with it, so `webhooks list` shows it, rather than the service not starting.
    client: Result<reqwest::Client, String>,
}

impl Sender {
    /// No redirects followed: a receiver moved is a failure an operator should see, not a
    /// place to send signed events to unasked.
    pub(super) fn new(timeout: Duration) -> Self {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("plantstore/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|err| format!("cannot make an HTTP client: {}", one_line(&err)));
        if let Err(err) = &client {
            tracing::error!(error = %err, "webhook deliveries will fail until this is fixed");
        }
        Self { client }
    }

    /// POSTs `event` to the target, signed with its secret.
    pub(super) async fn post(&self, target: &Target, event: &Event) -> Attempt {
        let (client, url) = match (&self.client, &target.url) {
            (Ok(client), Ok(url)) => (client, url),
            (Err(error), _) | (_, Err(error)) => return Attempt::failed(error.clone()),
        };
        let id = webhook_id(event);
        let body = body(event);
        let timestamp = Utc::now().timestamp();
        let Some(signature) = sign(&target.secret, &id, timestamp, body.as_bytes()) else {
            return Attempt::failed("the endpoint's stored secret is not whsec_ and base64".into());
        };
        let sent = client
            .post(url.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .header("webhook-id", id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(body)
            .send()
            .await;
        let response = match sent {
            Ok(response) => response,
            // Without the URL: it may carry credentials or a query string.
            Err(err) => return Attempt::failed(one_line(&err.without_url())),
        };
        let status = response.status();
        if status.is_success() {
            return Attempt::Delivered;
        }
        if status == StatusCode::GONE {
            return Attempt::Gone;
        }
        Attempt::Failed {
            error: format!("the receiver answered {status}"),
            retry_after: retry_after(response.headers()),
        }
    }
}

/// The same on every attempt of an event, as receivers deduplicate by it.
pub(super) fn webhook_id(event: &Event) -> String {
    match event.kind {
        EventKind::Deleted => format!("deletion_{}", event.entry.id),
        EventKind::Restored => format!("restore_{}", event.entry.id),
    }
}

#[derive(serde::Serialize)]
struct Body<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    timestamp: String,
    data: Data<'a>,
}

#[derive(serde::Serialize)]
struct Data<'a> {
    deletion_id: i64,
    plant_id: i64,
    caller: &'a str,
    request_id: &'a str,
    idempotency_key: Option<&'a str>,
    deleted_at: String,
    snapshot: Option<Box<RawValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    restored_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    restored_by: Option<&'a str>,
}

/// The event as JSON; the same bytes on every attempt.
pub(super) fn body(event: &Event) -> String {
    let entry = &event.entry;
    let restored = event.kind == EventKind::Restored;
    let body = Body {
        kind: event.kind.name(),
        timestamp: time(event.happened_at()),
        data: Data {
            deletion_id: entry.id,
            plant_id: entry.plant_id,
            caller: &entry.caller,
            request_id: &entry.request_id,
            idempotency_key: entry.idempotency_key.as_deref(),
            deleted_at: time(entry.deleted_at),
            snapshot: entry.snapshot_json(),
            restored_at: entry.restored_at.filter(|_| restored).map(time),
            restored_by: entry.restored_by.as_deref().filter(|_| restored),
        },
    };
    // Only strings, numbers and already-JSON snapshots: serialising cannot fail.
    serde_json::to_string(&body).unwrap_or_default()
}

fn time(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// `Retry-After` in seconds; the HTTP-date form is taken as "no advice".
fn retry_after(headers: &header::HeaderMap) -> Option<Duration> {
    let seconds: u64 = headers
        .get(header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds))
}

fn one_line(err: &dyn std::error::Error) -> String {
    let mut line = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        source = cause.source();
    }
    line
}
