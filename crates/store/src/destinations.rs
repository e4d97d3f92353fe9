//! Deletion events as storage sees them: destinations (webhooks, JetStream streams), the
//! log's events in order, and the lease that lets one instance at a time deliver to each.

use std::{collections::BTreeSet, time::Duration};

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::{DeletionRecord, StoreError};

/// A place in the log's order of events: commit-ordered `pos`, `EventKind::log_order`, then
/// `seq` (the entry's id; on SQLite a restore's own sequence number).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct LogPosition {
    pub pos: i64,
    pub kind: i64,
    pub seq: i64,
}

impl LogPosition {
    /// The `(pos, seq)` events of `kind` must be above to come after this position, so each
    /// kind is read from its own index, in its own order, and only as far as needed.
    pub fn after_for(self, kind: EventKind) -> (i64, i64) {
        match kind.log_order().cmp(&self.kind) {
            std::cmp::Ordering::Greater => (self.pos, i64::MIN),
            std::cmp::Ordering::Equal => (self.pos, self.seq),
            std::cmp::Ordering::Less => (self.pos, i64::MAX),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EventKind {
    PlantDeleted,
    PlantRestored,
}

impl EventKind {
    /// In the order lists show them.
    pub const ALL: [EventKind; 2] = [EventKind::PlantDeleted, EventKind::PlantRestored];

    /// The event type as bodies and `--events` name it.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::PlantDeleted => "plant.deleted",
            EventKind::PlantRestored => "plant.restored",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.name() == name)
    }

    /// Where events of this kind stand among those of one log position: deletes first.
    pub fn log_order(self) -> i64 {
        match self {
            EventKind::PlantDeleted => 0,
            EventKind::PlantRestored => 1,
        }
    }
}

pub type EventKinds = BTreeSet<EventKind>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointState {
    /// Its last attempt delivered, or it has had none yet.
    Active,
    /// Its last attempt failed; it is tried again at `next_attempt_at`.
    Failing,
    /// The receiver answered 410; nothing is sent until `webhooks enable`.
    Disabled,
}

impl EndpointState {
    /// As the `state` column and `webhooks list` hold it.
    pub fn as_str(self) -> &'static str {
        match self {
            EndpointState::Active => "active",
            EndpointState::Failing => "failing",
            EndpointState::Disabled => "disabled",
        }
    }
}

/// Any other text is a row this version cannot read.
impl TryFrom<&str> for EndpointState {
    type Error = StoreError;

    fn try_from(text: &str) -> Result<Self, StoreError> {
        match text {
            "active" => Ok(EndpointState::Active),
            "failing" => Ok(EndpointState::Failing),
            "disabled" => Ok(EndpointState::Disabled),
            _ => Err(StoreError::Broken("an endpoint in an unknown state")),
        }
    }
}

/// An unknown code is a row this version cannot deliver: refused, never guessed at.
impl TryFrom<i64> for EventKind {
    type Error = StoreError;

    fn try_from(code: i64) -> Result<Self, StoreError> {
        Self::ALL
            .into_iter()
            .find(|kind| kind.log_order() == code)
            .ok_or(StoreError::Broken("an event of an unknown kind"))
    }
}

/// A deletion log entry, as a delete or as its restore.
#[derive(Debug, Clone)]
pub struct Event {
    pub position: LogPosition,
    pub kind: EventKind,
    pub entry: DeletionRecord,
}

impl Event {
    /// When it happened: the restore's time for a restore, else the delete's.
    pub fn happened_at(&self) -> DateTime<Utc> {
        match (self.kind, self.entry.restored_at) {
            (EventKind::PlantRestored, Some(restored_at)) => restored_at,
            _ => self.entry.deleted_at,
        }
    }
}

/// `Secrets` is what the use at hand holds of a webhook's signing secrets: the new one when
/// added, both in a lease, in a listing only when the old one stops signing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DestinationKind<Secrets> {
    Webhook(WebhookTarget<Secrets>),
    Stream(StreamTarget),
}

impl<Secrets> DestinationKind<Secrets> {
    pub fn url(&self) -> &str {
        match self {
            DestinationKind::Webhook(webhook) => &webhook.url,
            DestinationKind::Stream(stream) => &stream.url,
        }
    }

    /// Whether `other` sends to the same place the same way; secrets aside.
    pub fn same_target<Other>(&self, other: &DestinationKind<Other>) -> bool {
        match (self, other) {
            (DestinationKind::Webhook(one), DestinationKind::Webhook(two)) => {
                one.url == two.url && one.http2 == two.http2
            }
            (DestinationKind::Stream(one), DestinationKind::Stream(two)) => one == two,
            _ => false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookTarget<Secrets> {
    pub url: String,
    /// HTTP/2 with prior knowledge on a plain-http URL (`webhooks add --http2`).
    pub http2: bool,
    pub secrets: Secrets,
}

/// A JetStream stream on the NATS server at `url`, on subjects `<subject_prefix>.<plant id>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamTarget {
    pub url: String,
    pub stream: String,
    pub subject_prefix: String,
}

/// The last message JetStream stored on a plant's subject for a stream destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredMessage {
    pub plant_id: i64,
    pub stream_seq: i64,
    pub position: LogPosition,
}

/// Of a webhook's secrets, only until when the one before the last rotation also signs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointRecord {
    pub id: i64,
    pub kind: DestinationKind<Option<DateTime<Utc>>>,
    pub events: EventKinds,
    pub state: EndpointState,
    pub delivered_through: Option<i64>,
    /// Events after the cursor, of any type (some may not be for this endpoint).
    pub pending: i64,
    pub last_error: Option<String>,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub endpoint_id: i64,
    pub kind: DestinationKind<Signing>,
    pub events: EventKinds,
    /// Moves with `replay` or `enable`: a report carrying an older one is refused.
    pub generation: i64,
    pub cursor: LogPosition,
}

/// During a rotation's overlap, requests are signed with the previous secret too.
#[derive(Clone, PartialEq, Eq)]
pub struct Signing {
    pub secret: String,
    pub previous_secret: Option<String>,
}

impl std::fmt::Debug for Signing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signing")
            .field("secret", &"<redacted>")
            .field(
                "previous_secret",
                &self.previous_secret.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

#[derive(Clone)]
pub struct NewEndpoint {
    pub kind: DestinationKind<String>,
    pub events: EventKinds,
}

#[derive(Debug, Clone)]
pub struct DeliveryReport {
    pub cursor: LogPosition,
    /// The deletion log id of the last event delivered, when the cursor moved.
    pub delivered_through: Option<i64>,
    pub state: EndpointState,
    pub last_error: Option<String>,
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// A stream's messages stored since the last report, saved in the cursor's transaction.
    pub stored: Vec<StoredMessage>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayOutcome {
    Done,
    NoEndpoint,
    NoEntry,
}

#[async_trait]
pub trait Destinations: Send + Sync {
    /// Gets the events committed from now on; `StoreError::Duplicate` when the URL is taken.
    async fn add_endpoint(&self, endpoint: &NewEndpoint) -> Result<i64, StoreError>;

    /// Until `overlap` has passed, requests are signed with the old secret too; returns when
    /// it ends. `StoreError::NotFound` when no endpoint has that id.
    async fn rotate_secret(
        &self,
        id: i64,
        secret: &str,
        overlap: Duration,
    ) -> Result<DateTime<Utc>, StoreError>;

    async fn list_endpoints(&self) -> Result<Vec<EndpointRecord>, StoreError>;

    /// Keeps the endpoint's cursor, state and recorded messages. `StoreError::NotFound` when
    /// no endpoint has that id, `StoreError::Duplicate` when another one has the URL.
    async fn change_url(&self, id: i64, url: &str) -> Result<(), StoreError>;

    /// `StoreError::NotFound` when no endpoint has that id.
    async fn remove_endpoint(&self, id: i64) -> Result<(), StoreError>;

    /// Delivers again from where it stopped.
    async fn enable_endpoint(&self, id: i64) -> Result<(), StoreError>;

    /// Moves the cursor back to just before entry `from`; a stream destination forgets the
    /// messages it recorded, so it publishes those events again.
    async fn replay_endpoint(&self, id: i64, from: i64) -> Result<ReplayOutcome, StoreError>;

    /// Takes or renews every lease not disabled nor held elsewhere; returns all `owner` holds.
    async fn claim_endpoints(
        &self,
        owner: &str,
        lease_length: Duration,
    ) -> Result<Vec<Lease>, StoreError>;

    /// In log order; only events whose place no later commit can take and that no failover
    /// can take back (on PostgreSQL, those the synchronous standbys hold).
    async fn read_events(&self, after: LogPosition, limit: i64) -> Result<Vec<Event>, StoreError>;

    async fn stored_message(
        &self,
        endpoint_id: i64,
        plant_id: i64,
    ) -> Result<Option<StoredMessage>, StoreError>;

    /// Saves delivery's progress; `false` when the lease is no longer this owner's, or the
    /// generation moved (then delivery must stop).
    async fn report_delivery(
        &self,
        lease: &Lease,
        owner: &str,
        report: &DeliveryReport,
    ) -> Result<bool, StoreError>;

    /// Gives up every lease `owner` holds, so another instance takes over at once.
    async fn release_endpoints(&self, owner: &str) -> Result<(), StoreError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_is_read_from_just_after_the_position() {
        let at = |pos, kind, seq| LogPosition { pos, kind, seq };
        for cursor in [at(10, 0, 5), at(10, 1, 5), at(10, 2, 0), at(10, 0, 9)] {
            for kind in EventKind::ALL {
                let (pos, seq) = cursor.after_for(kind);
                for event_pos in 9..=11 {
                    for event_id in [i64::MIN + 1, 4, 5, 6, 100] {
                        let event = at(event_pos, kind.log_order(), event_id);
                        assert_eq!(
                            event > cursor,
                            (event_pos, event_id) > (pos, seq),
                            "{event:?} after {cursor:?}"
                        );
                    }
                }
            }
        }
    }
}
