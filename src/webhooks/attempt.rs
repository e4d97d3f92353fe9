//! One delivery attempt: the event's body, its signed headers, one POST and what came of it.

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use plantstore_store::{Event, EventKind};
use serde_json::value::RawValue;

use super::{
    client::{Address, Connection, Connector},
    signature::sign,
};

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

/// Where one endpoint's events go: its URL taken apart once for all of its attempts
/// (parsing it for each showed in the delivery's profile), and its secret.
pub(super) struct Target {
    /// Why the stored URL cannot be used (`webhooks add` lets none such in).
    address: Result<Address, String>,
    secret: String,
}

impl Target {
    pub(super) fn new(url: &str, secret: String) -> Self {
        Self {
            address: Address::parse(url),
            secret,
        }
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

/// Posts events; one per endpoint's delivery, all sharing one TLS configuration.
#[derive(Clone)]
pub(super) struct Sender {
    connector: Connector,
    timeout: Duration,
}

impl Sender {
    /// No redirects followed (nothing here follows them): a receiver moved is a failure an
    /// operator should see, not a place to send signed events to unasked.
    pub(super) fn new(timeout: Duration) -> Self {
        Self {
            connector: Connector::new(),
            timeout,
        }
    }

    /// POSTs `event` to the target, signed with its secret, over `connection` when there
    /// is one; the connection back when it can carry another.
    pub(super) async fn post(
        &self,
        target: &Target,
        connection: Option<Connection>,
        event: &Event,
    ) -> (Attempt, Option<Connection>) {
        let address = match &target.address {
            Ok(address) => address,
            Err(error) => return (Attempt::failed(error.clone()), connection),
        };
        let id = webhook_id(event);
        let body = body(event);
        let timestamp = Utc::now().timestamp();
        let Some(signature) = sign(&target.secret, &id, timestamp, body.as_bytes()) else {
            let error = "the endpoint's stored secret is not whsec_ and base64";
            return (Attempt::failed(error.into()), connection);
        };
        let mut headers = HeaderMap::with_capacity(8);
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(header::USER_AGENT, HeaderValue::from_static(USER_AGENT));
        for (name, value) in [
            ("webhook-id", id),
            ("webhook-timestamp", timestamp.to_string()),
            ("webhook-signature", signature),
        ] {
            // ASCII by construction; were one not, no unsigned request goes out.
            let Ok(value) = HeaderValue::try_from(value) else {
                let error = format!("cannot make the {name} header");
                return (Attempt::failed(error), connection);
            };
            headers.insert(name, value);
        }
        let posted = self
            .connector
            .post(address, connection, headers, body.into());
        let (answer, connection) = match tokio::time::timeout(self.timeout, posted).await {
            Ok(posted) => posted,
            Err(_) => (Err("no answer within the timeout".into()), None),
        };
        let attempt = match answer {
            Err(error) => Attempt::failed(error),
            Ok(answer) if answer.status.is_success() => Attempt::Delivered,
            Ok(answer) if answer.status == StatusCode::GONE => Attempt::Gone,
            Ok(answer) => Attempt::Failed {
                error: format!("the receiver answered {}", answer.status),
                retry_after: retry_after(&answer.headers),
            },
        };
        (attempt, connection)
    }
}

const USER_AGENT: &str = concat!("plantstore/", env!("CARGO_PKG_VERSION"));

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
