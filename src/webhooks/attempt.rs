//! One delivery attempt: the event's body, its signed headers, one POST and what came of it.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use chrono::{DateTime, SecondsFormat, Utc};
use http::StatusCode;
use plantstore_store::{Event, EventKind};
use serde_json::value::RawValue;

use super::{
    client::{self, Address, Answered, NoAnswer},
    signature::Key,
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

impl Attempt {
    /// A failure the receiver gave no advice on.
    fn failed(error: String) -> Self {
        Attempt::Failed {
            error,
            retry_after: None,
        }
    }

    /// What an answer, or the lack of one, means for the event.
    pub(super) fn of(answered: Answered) -> Self {
        match answered {
            Err(NoAnswer::Failed(error) | NoAnswer::Unanswered(error)) => Attempt::failed(error),
            Ok(answer) if answer.status.is_success() => Attempt::Delivered,
            Ok(answer) if answer.status == StatusCode::GONE => Attempt::Gone,
            Ok(answer) => Attempt::Failed {
                error: format!("the receiver answered {}", answer.status),
                retry_after: answer.retry_after,
            },
        }
    }
}

/// Where one endpoint's events go: its URL taken apart once for all of its attempts
/// (parsing it for each showed in the delivery's profile), and its secret.
pub(super) struct Target {
    /// Why the stored URL cannot be used (`webhooks add` lets none such in).
    address: Result<Arc<Address>, String>,
    /// `None` when the stored secret is not `whsec_` and base64.
    key: Option<Key>,
}

impl Target {
    pub(super) fn new(url: &str, secret: &str) -> Self {
        Self {
            address: Address::parse(url).map(Arc::new),
            key: Key::of(secret),
        }
    }

    pub(super) fn address(&self) -> Option<&Arc<Address>> {
        self.address.as_ref().ok()
    }

    /// The signed POST of `event`, or the failed attempt when none can be made. No
    /// redirects are followed (nothing here follows them): a receiver moved is a failure
    /// an operator should see, not a place to send signed events to unasked.
    pub(super) fn request(&self, event: &Event) -> Result<Bytes, Attempt> {
        let address = self
            .address
            .as_ref()
            .map_err(|error| Attempt::failed(error.clone()))?;
        let id = webhook_id(event);
        let body = body(event);
        let Some(key) = &self.key else {
            let error = "the endpoint's stored secret is not whsec_ and base64";
            return Err(Attempt::failed(error.into()));
        };
        let timestamp = Utc::now().timestamp();
        let signature = key.sign(&id, timestamp, body.as_bytes());
        let timestamp = timestamp.to_string();
        let headers = [
            ("content-type", "application/json"),
            ("user-agent", USER_AGENT),
            ("webhook-id", &id),
            ("webhook-timestamp", &timestamp),
            ("webhook-signature", &signature),
        ];
        // ASCII by construction; were one not, no unsigned request goes out.
        client::request(address, &headers, body.as_bytes()).map_err(Attempt::failed)
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
