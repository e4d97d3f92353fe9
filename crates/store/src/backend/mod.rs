//! What the backends share to implement the interface, and the service never uses: commit
//! news, the rows both select, the checks both make. The group commit is a crate of its own.

mod commit_news;

use chrono::{DateTime, Utc};

pub use commit_news::CommitNews;

use crate::{
    DeletionRecord, RestoreError, StoreError,
    destinations::{
        DestinationKind, EndpointRecord, EndpointState, Event, EventKind, EventKinds, Lease,
        LogPosition, Signing, StoredMessage, StreamTarget, WebhookTarget,
    },
};

pub fn not_found_if_none(rows_affected: u64) -> Result<(), StoreError> {
    if rows_affected == 0 {
        Err(StoreError::NotFound)
    } else {
        Ok(())
    }
}

/// A log entry as read before restoring it.
#[derive(Debug)]
pub struct EntryState {
    pub plant_id: i64,
    pub has_snapshot: bool,
    pub restored_at: Option<DateTime<Utc>>,
    pub restored_by: Option<String>,
    pub plant_exists: bool,
}

impl EntryState {
    /// Refuses a restore that cannot be done whatever the table's columns are, checked in
    /// the order a user would fix them.
    pub fn restorable(self) -> Result<(), RestoreError> {
        if let Some(at) = self.restored_at {
            return Err(RestoreError::AlreadyRestored {
                at,
                by: self.restored_by.unwrap_or_default(),
            });
        }
        if !self.has_snapshot {
            return Err(RestoreError::NoSnapshot);
        }
        if self.plant_exists {
            return Err(RestoreError::PlantExists(self.plant_id));
        }
        Ok(())
    }
}

/// The columns of `plants` now (`table`) against those of a snapshot, each list sorted.
pub fn column_changes(table: &[String], snapshot: &[String]) -> Result<(), RestoreError> {
    let mut missing: Vec<String> = table
        .iter()
        .filter(|c| !snapshot.contains(c))
        .cloned()
        .collect();
    let mut unknown: Vec<String> = snapshot
        .iter()
        .filter(|c| !table.contains(c))
        .cloned()
        .collect();
    if missing.is_empty() && unknown.is_empty() {
        return Ok(());
    }
    missing.sort();
    unknown.sort();
    Err(RestoreError::ColumnsChanged { missing, unknown })
}

/// `pos`, `kind` and `seq` as in `LogPosition`.
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
            position: LogPosition {
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

#[derive(Debug)]
pub struct LeaseRow {
    pub id: i64,
    pub url: String,
    pub kind: String,
    pub stream: Option<String>,
    pub subject_prefix: Option<String>,
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
        let secrets = Signing {
            secret: row.secret,
            previous_secret: row.previous_secret,
        };
        Ok(Lease {
            endpoint_id: row.id,
            kind: destination(
                &row.kind,
                row.url,
                row.http2,
                secrets,
                row.stream,
                row.subject_prefix,
            )?,
            events: event_kinds(&row.events)?,
            generation: row.generation,
            cursor: LogPosition {
                pos: row.cursor_pos,
                kind: row.cursor_kind,
                seq: row.cursor_id,
            },
        })
    }
}

#[derive(Debug)]
pub struct EndpointRow {
    pub id: i64,
    pub url: String,
    pub kind: String,
    pub stream: Option<String>,
    pub subject_prefix: Option<String>,
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
            kind: destination(
                &row.kind,
                row.url,
                row.http2,
                row.previous_secret_until,
                row.stream,
                row.subject_prefix,
            )?,
            events: event_kinds(&row.events)?,
            state: EndpointState::try_from(row.state.as_str())?,
            delivered_through: row.delivered_through,
            pending: row.pending,
            last_error: row.last_error,
            next_attempt_at: row.next_attempt_at,
            created_at: row.created_at,
        })
    }
}

/// A webhook uses `http2` and the secrets; a stream needs `stream` and `subject_prefix` set.
fn destination<Secrets>(
    kind: &str,
    url: String,
    http2: bool,
    secrets: Secrets,
    stream: Option<String>,
    subject_prefix: Option<String>,
) -> Result<DestinationKind<Secrets>, StoreError> {
    match (kind, stream, subject_prefix) {
        ("webhook", _, _) => Ok(DestinationKind::Webhook(WebhookTarget {
            url,
            http2,
            secrets,
        })),
        ("nats", Some(stream), Some(subject_prefix)) => Ok(DestinationKind::Stream(StreamTarget {
            url,
            stream,
            subject_prefix,
        })),
        _ => Err(StoreError::Broken("a destination of an unknown kind")),
    }
}

/// A new destination's columns; `secret` is empty for a stream.
pub struct DestinationColumns<'a> {
    pub kind: &'static str,
    pub url: &'a str,
    pub secret: &'a str,
    pub http2: bool,
    pub stream: Option<&'a str>,
    pub subject_prefix: Option<&'a str>,
}

impl<'a> From<&'a DestinationKind<String>> for DestinationColumns<'a> {
    fn from(kind: &'a DestinationKind<String>) -> Self {
        match kind {
            DestinationKind::Webhook(webhook) => DestinationColumns {
                kind: "webhook",
                url: &webhook.url,
                secret: &webhook.secrets,
                http2: webhook.http2,
                stream: None,
                subject_prefix: None,
            },
            DestinationKind::Stream(target) => DestinationColumns {
                kind: "nats",
                url: &target.url,
                secret: "",
                http2: false,
                stream: Some(&target.stream),
                subject_prefix: Some(&target.subject_prefix),
            },
        }
    }
}

#[derive(Debug)]
pub struct StoredMessageRow {
    pub plant_id: i64,
    pub stream_seq: i64,
    pub pos: i64,
    pub kind: i64,
    pub seq: i64,
}

impl From<StoredMessageRow> for StoredMessage {
    fn from(row: StoredMessageRow) -> Self {
        StoredMessage {
            plant_id: row.plant_id,
            stream_seq: row.stream_seq,
            position: LogPosition {
                pos: row.pos,
                kind: row.kind,
                seq: row.seq,
            },
        }
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

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaFacts {
    /// The declared type of `plants.id`; `None` when there is no such column.
    pub plants_id_type: Option<String>,
    /// An integer type: smallint, integer or bigint (SQLite: INTEGER affinity).
    pub plants_id_is_integer: bool,
    /// A primary key or unique index on exactly `(id)`, with no condition: one id can
    /// never name, and so never delete, several rows.
    pub plants_id_is_unique: bool,
    /// As the latest migration leaves them.
    pub has_own_tables: bool,
}

pub fn schema_verdict(facts: &SchemaFacts) -> Result<(), StoreError> {
    let Some(id_type) = &facts.plants_id_type else {
        return Err(StoreError::Schema(
            "the database has no plants.id column: create the plants table, or start with PLANTSTORE_MIGRATE=true".into(),
        ));
    };
    if !facts.plants_id_is_integer {
        return Err(StoreError::Schema(format!(
            "plants.id is of type {id_type}: the service needs an integer column (smallint, integer or bigint) to delete plants by id"
        )));
    }
    if !facts.plants_id_is_unique {
        return Err(StoreError::Schema(format!(
            "plants.id ({id_type}) is not unique: add a primary key or a unique index on plants (id), so that one id can never delete several rows"
        )));
    }
    if !facts.has_own_tables {
        return Err(StoreError::Schema(
            "the service's own tables are missing or older than this version: run `plantstore migrate` once, or start with PLANTSTORE_MIGRATE=true".into(),
        ));
    }
    Ok(())
}
