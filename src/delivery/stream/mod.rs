//! Deletion events into a NATS JetStream stream, one message per event on `<prefix>.<plant
//! id>` expecting its plant's previous one (`Nats-Expected-Last-Subject-Sequence`), so one
//! stored before a crash but never recorded is found there instead of being stored twice.

mod check;
mod server;

pub(crate) use check::{TargetUse, check_target};
pub(crate) use server::stored_url;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex as SyncMutex},
    time::Duration,
};

use async_nats::jetstream::{
    self,
    context::PublishErrorKind,
    message::PublishMessage,
    stream::{LastRawMessageErrorKind, Stream},
};
use plantstore_store::{
    Store,
    destinations::{Event, StoredMessage, StreamTarget},
};
use tokio::sync::Mutex;

use super::{
    attempt::Attempt,
    event::{body, event_id},
};
use crate::telemetry::one_line;
use server::{Connection, Server, Trouble, jetstream_missing};

const EVENT_TYPE_HEADER: &str = "Plantstore-Event-Type";
/// Publishes per attempt: again with the store's recorded sequence, again after finding the
/// subject emptied (limits, a purge); beyond that, something else keeps publishing there.
const REPUBLISH: usize = 4;

/// A stream destination's connection, made on first use and again after a failed connect or
/// an unacknowledged publish: the client's own reconnects miss a path gone silent.
pub(super) struct StreamPublisher {
    server: Server,
    target: StreamTarget,
    timeout: Duration,
    connection: Mutex<Option<Arc<Connection>>>,
    store: Arc<dyn Store>,
    endpoint_id: i64,
    unsaved: SyncMutex<UnsavedMessages>,
}

impl StreamPublisher {
    pub(super) fn new(
        endpoint_id: i64,
        target: StreamTarget,
        timeout: Duration,
        store: &Arc<dyn Store>,
    ) -> Result<Self, String> {
        Ok(Self {
            server: Server::parse(&target.url)
                .map_err(|err| format!("the destination's stored URL cannot be used: {err}"))?,
            target,
            timeout,
            connection: Mutex::new(None),
            store: Arc::clone(store),
            endpoint_id,
            unsaved: SyncMutex::default(),
        })
    }

    /// The connection, made now if there is none (one attempt at a time makes it).
    async fn connection(&self) -> Result<Arc<Connection>, String> {
        let mut held = self.connection.lock().await;
        if let Some(connection) = held.as_ref() {
            return Ok(Arc::clone(connection));
        }
        let trouble = Trouble::default();
        let client = self.server.connect(self.timeout, &trouble).await?;
        let mut context = jetstream::new(client.clone());
        context.set_timeout(self.timeout);
        let stream = context
            .get_stream_no_info(&self.target.stream)
            .await
            .map_err(|err| format!("cannot use the stream: {}", one_line(&err)))?;
        let connection = Arc::new(Connection {
            client,
            context,
            stream,
            trouble,
        });
        *held = Some(Arc::clone(&connection));
        Ok(connection)
    }

    /// Drops `connection` unless another attempt replaced it; the next one connects anew.
    async fn forget(&self, connection: &Arc<Connection>) {
        let mut held = self.connection.lock().await;
        if held
            .as_ref()
            .is_some_and(|current| Arc::ptr_eq(current, connection))
        {
            *held = None;
        }
    }

    /// Delivered once the message is in the stream, published now or found there already.
    pub(super) async fn publish(&self, event: &Event) -> Attempt {
        let plant = event.entry.plant_id;
        let last = self.lock_unsaved().last(plant);
        match self.publish_after(event, last).await {
            Ok(message) => {
                self.lock_unsaved().stored(message);
                Attempt::Delivered
            }
            Err(error) => Attempt::failed(error),
        }
    }

    pub(super) fn unsaved(&self) -> Vec<StoredMessage> {
        self.lock_unsaved().unsaved()
    }

    pub(super) fn has_unsaved(&self) -> bool {
        self.lock_unsaved().has_unsaved()
    }

    pub(super) fn saved(&self, saved: &[StoredMessage]) {
        self.lock_unsaved().saved(saved);
    }

    /// Held for short updates only, never across an await; a lock poisoned by a panic in
    /// one is taken as it is, so that one panic does not become one per later attempt.
    fn lock_unsaved(&self) -> std::sync::MutexGuard<'_, UnsavedMessages> {
        self.unsaved
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Publishes `event` after `last`, the plant's unsaved message; without one the subject
    /// is expected empty (no store read for most first messages), and if that is refused
    /// the store's record is read. Returns the plant's last message, new or found stored.
    async fn publish_after(
        &self,
        event: &Event,
        last: Option<StoredMessage>,
    ) -> Result<StoredMessage, String> {
        let plant = event.entry.plant_id;
        if let Some(last) = last.filter(|last| last.position >= event.position) {
            return Ok(last);
        }
        let connection = self.connection().await?;
        if let Some(error) = connection.unusable() {
            return Err(error);
        }
        let Connection {
            context, stream, ..
        } = connection.as_ref();
        let subject = format!("{}.{}", self.target.subject_prefix, plant);
        let id = event_id(event);
        let stored = |stream_seq: u64| {
            Ok(StoredMessage {
                plant_id: plant,
                stream_seq: stream_seq as i64,
                position: event.position,
            })
        };
        let mut expected = last.map_or(0, |last| last.stream_seq.unsigned_abs());
        let mut store_read = last.is_some();
        for _ in 0..REPUBLISH {
            let message = PublishMessage::build()
                .payload(body(event).into())
                .message_id(&id)
                .header("Content-Type", "application/json")
                .header(EVENT_TYPE_HEADER, event.kind.name());
            // Off only in the negative control's test build (tests/api/streams.rs), which
            // shows that without it a crash stores repeats.
            #[cfg(not(feature = "negative-control"))]
            let message = message.expected_last_subject_sequence(expected);
            let acknowledged = match context.send_publish(subject.clone(), message).await {
                Ok(acknowledgement) => acknowledgement.await,
                Err(err) => Err(err),
            };
            let err = match acknowledged {
                Ok(ack) if ack.stream != self.target.stream => {
                    return Err(format!(
                        "{subject} is captured by the stream {}, not {}",
                        ack.stream, self.target.stream
                    ));
                }
                Ok(ack) if ack.duplicate => {
                    return match self.repeat(stream, &id, ack.sequence).await {
                        Ok(()) => stored(ack.sequence),
                        Err(error) => Err(error),
                    };
                }
                Ok(ack) => return stored(ack.sequence),
                Err(err) => err,
            };
            if err.kind() == PublishErrorKind::TimedOut {
                self.forget(&connection).await;
                if let Some(error) = connection.unusable() {
                    return Err(error);
                }
            }
            if err.kind() == PublishErrorKind::StreamNotFound
                && let Some(error) = jetstream_missing(context).await
            {
                return Err(error);
            }
            if err.kind() != PublishErrorKind::WrongLastSequence {
                return Err(describe_publish(&err, &self.target));
            }
            if !store_read {
                store_read = true;
                match self.store.stored_message(self.endpoint_id, plant).await {
                    Ok(recorded) => match recorded {
                        Some(recorded) if recorded.position >= event.position => {
                            return Ok(recorded);
                        }
                        Some(recorded) => {
                            expected = recorded.stream_seq.unsigned_abs();
                            continue;
                        }
                        None => {}
                    },
                    Err(err) => {
                        return Err(format!(
                            "cannot read the destination's last message on {subject}: {err}"
                        ));
                    }
                }
            }
            // The subject holds messages after the one recorded: the first of them is this
            // event's when a crash came between its acknowledgement and the save.
            match stream
                .get_first_raw_message_by_subject(&subject, expected + 1)
                .await
            {
                Ok(found) if found.headers.get("Nats-Msg-Id").map(|v| v.as_str()) == Some(&id) => {
                    return stored(found.sequence);
                }
                Ok(found) => {
                    return Err(format!(
                        "a message this destination did not publish is on {subject} at stream sequence {} (Nats-Msg-Id {}) where {id} was due; remove it from the stream to go on",
                        found.sequence,
                        found
                            .headers
                            .get("Nats-Msg-Id")
                            .map_or("unset", |v| v.as_str())
                    ));
                }
                Err(err) if err.kind() == LastRawMessageErrorKind::NoMessageFound => {}
                Err(err) => {
                    return Err(format!("cannot read {subject} back: {}", one_line(&err)));
                }
            }
            // Nothing after the recorded message: it left the stream (its limits, a purge),
            // so this one goes after whatever is last there now.
            expected = match stream.get_last_raw_message_by_subject(&subject).await {
                Ok(last) => last.sequence,
                Err(err) if err.kind() == LastRawMessageErrorKind::NoMessageFound => 0,
                Err(err) => {
                    return Err(format!("cannot read {subject} back: {}", one_line(&err)));
                }
            };
        }
        Err(format!(
            "another publisher keeps adding messages to {subject}"
        ))
    }

    /// JetStream took the message for a repeat of the one at `sequence` (same
    /// `Nats-Msg-Id`, within the duplicate window): stored if that one is still there, else
    /// only once the window has passed, so it is tried again until then.
    async fn repeat(&self, stream: &Stream<()>, id: &str, sequence: u64) -> Result<(), String> {
        match stream.get_raw_message(sequence).await {
            Ok(found) if found.headers.get("Nats-Msg-Id").map(|v| v.as_str()) == Some(id) => Ok(()),
            _ => Err(format!(
                "JetStream dropped {id} as a repeat of a message no longer in the stream; it is stored once the stream's duplicate window has passed"
            )),
        }
    }
}

fn describe_publish(err: &jetstream::context::PublishError, target: &StreamTarget) -> String {
    match err.kind() {
        PublishErrorKind::StreamNotFound => format!(
            "no stream captures {}.>: the stream {} is missing, or does not take these subjects",
            target.subject_prefix, target.stream
        ),
        PublishErrorKind::TimedOut => {
            "no acknowledgement from the NATS server within the timeout".into()
        }
        _ => format!("the NATS server refused the message: {}", one_line(err)),
    }
}

/// Messages stored but not yet saved, by plant, for the plant's next publish and the next
/// report; forgotten once saved (a plant's next event is rare, and reads the store).
#[derive(Default)]
struct UnsavedMessages {
    unsaved: HashMap<i64, StoredMessage>,
}

impl UnsavedMessages {
    fn last(&self, plant: i64) -> Option<StoredMessage> {
        self.unsaved.get(&plant).copied()
    }

    /// The plant's last message is `message` now, unless a later one is known already.
    fn stored(&mut self, message: StoredMessage) {
        let last = self.unsaved.entry(message.plant_id).or_insert(message);
        if last.position < message.position {
            *last = message;
        }
    }

    fn has_unsaved(&self) -> bool {
        !self.unsaved.is_empty()
    }

    fn unsaved(&self) -> Vec<StoredMessage> {
        self.unsaved.values().copied().collect()
    }

    fn saved(&mut self, saved: &[StoredMessage]) {
        for message in saved {
            if self.unsaved.get(&message.plant_id) == Some(message) {
                self.unsaved.remove(&message.plant_id);
            }
        }
    }
}
