//! An event's id and body (the deletion log entry as JSON), whatever its destination.

use chrono::{DateTime, SecondsFormat, Utc};
use plantstore_store::{
    DeletionRecord,
    destinations::{Event, EventKind},
};
use serde_json::value::RawValue;

/// The same on every attempt of an event, as receivers and JetStream deduplicate by it:
/// the `webhook-id` header, and the `Nats-Msg-Id`.
pub(super) fn event_id(event: &Event) -> String {
    match event.kind {
        EventKind::PlantDeleted => format!("deletion_{}", event.entry.id),
        EventKind::PlantRestored => format!("restore_{}", event.entry.id),
    }
}

/// A deletion log entry's own fields as JSON, in one order for an event's `data` and for
/// `plantstore deletions list --json`, each with its id and restore fields around it.
#[derive(serde::Serialize)]
pub(crate) struct EntryJson<'a> {
    plant_id: i64,
    caller: &'a str,
    request_id: &'a str,
    idempotency_key: Option<&'a str>,
    deleted_at: String,
    snapshot: Option<Box<RawValue>>,
}

impl<'a> EntryJson<'a> {
    pub(crate) fn new(entry: &'a DeletionRecord, time: fn(DateTime<Utc>) -> String) -> Self {
        Self {
            plant_id: entry.plant_id,
            caller: &entry.caller,
            request_id: &entry.request_id,
            idempotency_key: entry.idempotency_key.as_deref(),
            deleted_at: time(entry.deleted_at),
            snapshot: entry.snapshot_json(),
        }
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
    #[serde(flatten)]
    entry: EntryJson<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    restored_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    restored_by: Option<&'a str>,
}

/// The event as JSON; the same bytes on every attempt.
pub(super) fn body(event: &Event) -> String {
    let entry = &event.entry;
    let restored = event.kind == EventKind::PlantRestored;
    let body = Body {
        kind: event.kind.name(),
        timestamp: time(event.happened_at()),
        data: Data {
            deletion_id: entry.id,
            entry: EntryJson::new(entry, time),
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
