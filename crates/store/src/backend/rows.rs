//! Rows as both backends select them, and what they mean to the interface.

use chrono::{DateTime, Utc};

use crate::{
    DeletionRecord, EndpointRecord, EndpointState, Event, EventKind, EventKinds, Lease, Signing,
    StoreError, StreamPosition,
};

/// An event as both backends select it: `kind` 0 is a delete, 1 a restore; `seq` orders
/// the events of one place and kind (the entry's id; on SQLite a restore's own sequence).
#[derive(Debug)]
pub struct EventRow {
    pub pos: i64,
    pub kind: i64,
    pub seq: i64,
    pub id: i64,
    pub plant_id: i64,
    pub caller: String,
    pub request_id: String,
    pub idempotency_key: Option<String>,
    pub deleted_at: DateTime<Utc>,
    pub snapshot: Option<String>,
    pub restored_at: Option<DateTime<Utc>>,
    pub restored_by: Option<String>,
}

impl TryFrom<EventRow> for Event {
    type Error = StoreError;

    fn try_from(row: EventRow) -> Result<Self, StoreError> {
        Ok(Event {
            position: StreamPosition {
                pos: row.pos,
                kind: row.kind,
                seq: row.seq,
            },
            kind: EventKind::try_from(row.kind)?,
            entry: DeletionRecord {
                id: row.id,
                plant_id: row.plant_id,
                caller: row.caller,
                request_id: row.request_id,
                idempotency_key: row.idempotency_key,
                deleted_at: row.deleted_at,
                snapshot: row.snapshot,
                restored_at: row.restored_at,
                restored_by: row.restored_by,
            },
        })
    }
}

/// A claimed endpoint as both backends return it.
#[derive(Debug)]
pub struct LeaseRow {
    pub id: i64,
    pub url: String,
    pub events: String,
    pub secret: String,
    /// Set only while the rotation's overlap lasts.
    pub previous_secret: Option<String>,
    pub http2: bool,
    pub generation: i64,
    pub cursor_pos: i64,
    pub cursor_kind: i64,
    pub cursor_id: i64,
}

impl TryFrom<LeaseRow> for Lease {
    type Error = StoreError;

    fn try_from(row: LeaseRow) -> Result<Self, StoreError> {
        Ok(Lease {
            endpoint_id: row.id,
            url: row.url,
            events: event_kinds(&row.events)?,
            signing: Signing {
                secret: row.secret,
                previous_secret: row.previous_secret,
            },
            http2: row.http2,
            generation: row.generation,
            cursor: StreamPosition {
                pos: row.cursor_pos,
                kind: row.cursor_kind,
                seq: row.cursor_id,
            },
        })
    }
}

/// An endpoint as both backends list it.
#[derive(Debug)]
pub struct EndpointRow {
    pub id: i64,
    pub url: String,
    pub events: String,
    pub http2: bool,
    pub previous_secret_until: Option<DateTime<Utc>>,
    pub state: String,
    pub delivered_through: Option<i64>,
    pub pending: i64,
    pub last_error: Option<String>,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

impl TryFrom<EndpointRow> for EndpointRecord {
    type Error = StoreError;

    fn try_from(row: EndpointRow) -> Result<Self, StoreError> {
        Ok(EndpointRecord {
            id: row.id,
            url: row.url,
            events: event_kinds(&row.events)?,
            http2: row.http2,
            previous_secret_until: row.previous_secret_until,
            state: EndpointState::try_from(row.state.as_str())?,
            delivered_through: row.delivered_through,
            pending: row.pending,
            last_error: row.last_error,
            next_attempt_at: row.next_attempt_at,
            created_at: row.created_at,
        })
    }
}

/// The `events` column: the types' names, comma-separated.
pub fn event_list(kinds: &EventKinds) -> String {
    kinds
        .iter()
        .map(|kind| kind.name())
        .collect::<Vec<_>>()
        .join(",")
}

fn event_kinds(list: &str) -> Result<EventKinds, StoreError> {
    list.split(',')
        .map(|name| {
            EventKind::from_name(name)
                .ok_or(StoreError::Broken("an endpoint with an unknown event type"))
        })
        .collect()
}
