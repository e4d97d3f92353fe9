//! Deletion events into a NATS JetStream stream: one message per event on
//! `<prefix>.<plant id>`, each published with the stream sequence of its plant's previous
//! message as `Nats-Expected-Last-Subject-Sequence`, so that a message stored before a
//! crash but never recorded is found on its subject instead of being stored twice.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex as SyncMutex},
    time::Duration,
};

use async_nats::{
    ConnectOptions, ServerError,
    connection::State,
    jetstream::{
        self,
        context::{AccountErrorKind, PublishErrorKind},
        message::PublishMessage,
        stream::{LastRawMessageErrorKind, Stream},
    },
};
use percent_encoding::percent_decode_str;
use plantstore_store::{Event, Lease, Store, StoredMessage, StreamTarget};
use reqwest::Url;
use tokio::sync::Mutex;

use super::attempt::{Attempt, body, webhook_id};
use crate::telemetry::one_line;

/// The event type of a message, beside `Nats-Msg-Id` and `Content-Type`.
const EVENT_TYPE_HEADER: &str = "Plantstore-Event-Type";
/// How many times one attempt publishes: again with the sequence the store recorded for the
/// plant, and again after finding the subject emptied (by the stream's limits or a purge);
/// beyond that, something else keeps publishing there.
const REPUBLISH: usize = 4;

/// A stream destination's broker, stream and subjects, connected on first use, and again
/// after a connection that could not be made or a publish that got no acknowledgement in
/// time: the client reconnects by itself when the broker closes or resets, but a path gone
/// silent looks alive to it until its ping (a minute) finds out.
pub(super) struct StreamPublisher {
    server: Server,
    target: StreamTarget,
    timeout: Duration,
    connection: Mutex<Option<Arc<Connection>>>,
    /// Where the destination's recorded messages are read, when a plant's is needed.
    store: Arc<dyn Store>,
    endpoint_id: i64,
}

/// A client of the destination's broker, and its stream.
struct Connection {
    client: async_nats::Client,
    context: jetstream::Context,
    stream: Stream<()>,
    /// What the client last reported going wrong, while it reconnects by itself.
    trouble: Trouble,
}

/// The client's last problem with the broker, as the operator should read it; cleared when
/// it connects again. The client's own log lines are left out (telemetry), so this is
/// where the cause is told, with the destination.
type Trouble = Arc<SyncMutex<Option<String>>>;

impl Connection {
    /// Why a publish cannot be sent now: the client is not connected, and why not.
    fn unusable(&self) -> Option<String> {
        if self.client.connection_state() == State::Connected {
            return None;
        }
        let trouble = self.trouble.lock().ok().and_then(|held| held.clone());
        Some(format!(
            "not connected to the NATS server: {}",
            trouble.unwrap_or_else(|| "the connection was lost; reconnecting".into())
        ))
    }
}

/// A NATS URL taken apart: the address, and the credentials that leave it for the CONNECT.
struct Server {
    address: String,
    user: Option<String>,
    password: Option<String>,
}

impl Server {
    /// The error says what is wrong without the URL (it may hold credentials).
    fn parse(text: &str) -> Result<Self, String> {
        let mut url = Url::parse(text.trim())
            .map_err(|err| format!("not a URL such as nats://user:pass@host:4222 ({err})"))?;
        if !matches!(url.scheme(), "nats" | "tls") || url.host_str().is_none() {
            return Err(format!(
                "a stream destination's URL must be nats:// or tls:// with a host, not '{}'",
                url.scheme()
            ));
        }
        let decoded = |text: &str| percent_decode_str(text).decode_utf8_lossy().into_owned();
        let user = Some(url.username())
            .filter(|user| !user.is_empty())
            .map(decoded);
        let password = url.password().map(decoded);
        let _ = url.set_username("");
        let _ = url.set_password(None);
        Ok(Self {
            address: url.to_string(),
            user,
            password,
        })
    }

    async fn connect(
        &self,
        timeout: Duration,
        trouble: &Trouble,
    ) -> Result<async_nats::Client, String> {
        let options = match (&self.user, &self.password) {
            (Some(user), Some(password)) => {
                ConnectOptions::with_user_and_password(user.clone(), password.clone())
            }
            (Some(token), None) => ConnectOptions::with_token(token.clone()),
            _ => ConnectOptions::new(),
        };
        let seen = Arc::clone(trouble);
        options
            .name("plantstore")
            .connection_timeout(timeout)
            .event_callback(move |event| {
                if let Some(what) = trouble_in(event)
                    && let Ok(mut held) = seen.lock()
                {
                    *held = what;
                }
                std::future::ready(())
            })
            .connect(self.address.as_str())
            .await
            .map_err(|err| format!("cannot connect to the NATS server: {}", one_line(&err)))
    }
}

impl StreamPublisher {
    pub(super) fn new(
        lease: &Lease,
        target: StreamTarget,
        timeout: Duration,
        store: &Arc<dyn Store>,
    ) -> Result<Self, String> {
        Ok(Self {
            server: Server::parse(&lease.url)
                .map_err(|err| format!("the destination's stored URL cannot be used: {err}"))?,
            target,
            timeout,
            connection: Mutex::new(None),
            store: Arc::clone(store),
            endpoint_id: lease.endpoint_id,
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

    /// Drops `connection`, unless another attempt has replaced it already: the next
    /// attempt connects anew. The client closes once the attempts still using it end.
    async fn forget(&self, connection: &Arc<Connection>) {
        let mut held = self.connection.lock().await;
        if held
            .as_ref()
            .is_some_and(|current| Arc::ptr_eq(current, connection))
        {
            *held = None;
        }
    }

    /// Publishes `event` after `last`, the plant's message this delivery stored and has not
    /// saved yet, if any. Without one, the subject is expected empty: nearly every plant's
    /// first message, published without a read of the store. When that is refused, the
    /// store's record of the plant's last message (saved before, or by another instance) is
    /// read, and the event published after it. `Attempt::Stored` carries the plant's last
    /// message then, whether this event's was published now or found stored already.
    pub(super) async fn publish(&self, event: &Event, last: Option<StoredMessage>) -> Attempt {
        let plant = event.entry.plant_id;
        if let Some(last) = last.filter(|last| last.position >= event.position) {
            return Attempt::Stored(last);
        }
        let connection = match self.connection().await {
            Ok(connection) => connection,
            Err(error) => return Attempt::failed(error),
        };
        if let Some(error) = connection.unusable() {
            return Attempt::failed(error);
        }
        let Connection {
            context, stream, ..
        } = connection.as_ref();
        let subject = format!("{}.{}", self.target.subject_prefix, plant);
        let id = webhook_id(event);
        let stored = |stream_seq: u64| {
            Attempt::Stored(StoredMessage {
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
                    return Attempt::failed(format!(
                        "{subject} is captured by the stream {}, not {}",
                        ack.stream, self.target.stream
                    ));
                }
                Ok(ack) if ack.duplicate => {
                    return match self.repeat(stream, &id, ack.sequence).await {
                        Ok(()) => stored(ack.sequence),
                        Err(error) => Attempt::failed(error),
                    };
                }
                Ok(ack) => return stored(ack.sequence),
                Err(err) => err,
            };
            if err.kind() == PublishErrorKind::TimedOut {
                self.forget(&connection).await;
                if let Some(error) = connection.unusable() {
                    return Attempt::failed(error);
                }
            }
            if err.kind() == PublishErrorKind::StreamNotFound
                && let Some(error) = jetstream_missing(context).await
            {
                return Attempt::failed(error);
            }
            if err.kind() != PublishErrorKind::WrongLastSequence {
                return Attempt::failed(describe_publish(&err, &self.target));
            }
            if !store_read {
                store_read = true;
                match self.store.stored_message(self.endpoint_id, plant).await {
                    Ok(recorded) => match recorded {
                        Some(recorded) if recorded.position >= event.position => {
                            return Attempt::Stored(recorded);
                        }
                        Some(recorded) => {
                            expected = recorded.stream_seq.unsigned_abs();
                            continue;
                        }
                        None => {}
                    },
                    Err(err) => {
                        return Attempt::failed(format!(
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
                    return Attempt::failed(format!(
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
                    return Attempt::failed(format!(
                        "cannot read {subject} back: {}",
                        one_line(&err)
                    ));
                }
            }
            // Nothing after the recorded message: it left the stream (its limits, a purge),
            // so this one goes after whatever is last there now.
            expected = match stream.get_last_raw_message_by_subject(&subject).await {
                Ok(last) => last.sequence,
                Err(err) if err.kind() == LastRawMessageErrorKind::NoMessageFound => 0,
                Err(err) => {
                    return Attempt::failed(format!(
                        "cannot read {subject} back: {}",
                        one_line(&err)
                    ));
                }
            };
        }
        Attempt::failed(format!(
            "another publisher keeps adding messages to {subject}"
        ))
    }

    /// JetStream took the message for a repeat of the one at `sequence` (same
    /// `Nats-Msg-Id`, within the duplicate window): stored, if that one is still there. One
    /// purged or removed since is not, and this message is stored only once the window has
    /// passed, so it is tried again until then.
    async fn repeat(&self, stream: &Stream<()>, id: &str, sequence: u64) -> Result<(), String> {
        match stream.get_raw_message(sequence).await {
            Ok(found) if found.headers.get("Nats-Msg-Id").map(|v| v.as_str()) == Some(id) => Ok(()),
            _ => Err(format!(
                "JetStream dropped {id} as a repeat of a message no longer in the stream; it is stored once the stream's duplicate window has passed"
            )),
        }
    }
}

/// What a client event says about the connection: `Some(None)` when it is fine again,
/// `Some(Some(cause))` when it is not, `None` when it says nothing about it.
fn trouble_in(event: async_nats::Event) -> Option<Option<String>> {
    use async_nats::{ClientError, ConnectErrorKind, Event};
    const REFUSED: &str = "the server refused the credentials (authorization violation)";
    let cause = match event {
        Event::Connected => return Some(None),
        Event::Disconnected => "the connection was lost; reconnecting".to_owned(),
        Event::ServerError(ServerError::AuthorizationViolation) => REFUSED.to_owned(),
        Event::ServerError(err) => format!("the server said: {err}"),
        // A failed reconnect carries only its kind, as text.
        Event::ClientError(ClientError::Other(kind)) => {
            let is = |known: ConnectErrorKind| kind == known.to_string();
            if is(ConnectErrorKind::AuthorizationViolation) || is(ConnectErrorKind::Authentication)
            {
                REFUSED.to_owned()
            } else if is(ConnectErrorKind::Io) || is(ConnectErrorKind::Dns) {
                "cannot reach the server; reconnecting".to_owned()
            } else if is(ConnectErrorKind::Tls) {
                "the TLS handshake failed (is the server's certificate trusted?)".to_owned()
            } else if is(ConnectErrorKind::TimedOut) {
                "connecting timed out; reconnecting".to_owned()
            } else {
                format!("reconnecting failed: {kind}")
            }
        }
        Event::ClientError(err) => err.to_string(),
        _ => return None,
    };
    Some(Some(cause))
}

/// Why nothing answers for a stream when it is JetStream itself that is missing, not the
/// stream: the server runs without it, or this account has none.
async fn jetstream_missing(context: &jetstream::Context) -> Option<String> {
    match context.query_account().await {
        Err(err) if err.kind() == AccountErrorKind::JetStreamUnavailable => Some(
            "JetStream is not enabled on this NATS server, or not for this account (nats-server -js)"
                .into(),
        ),
        _ => None,
    }
}

/// A refused or unanswered publish in a line an operator can act on.
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

/// The URL as a destination stores it: usable (as `Server::parse` checks), less what means
/// nothing to a NATS server (a path, such as a trailing `/`, a query, a fragment), so that
/// one server is written one way and a second destination for the same stream and prefix
/// on it is found a duplicate.
pub(crate) fn stored_url(text: &str) -> Result<String, String> {
    Server::parse(text)?;
    let mut url = Url::parse(text.trim()).map_err(|err| err.to_string())?;
    url.set_path("");
    url.set_query(None);
    url.set_fragment(None);
    Ok(url.to_string())
}

/// What a stream destination's command is about to do with the stream.
pub(crate) enum TargetUse {
    /// Publish from the start (`add`; `replay`, which keeps its prefix): the stream must
    /// hold no message under the prefix, as one would stand where this destination expects
    /// none.
    Add,
    Replay,
    /// Go on publishing after the messages there (`set-url`).
    Moved,
}

/// What the stream commands make sure of before a destination delivers: the server answers
/// with these credentials, JetStream and the stream exist, and the stream captures
/// `<prefix>.>`; unless the destination moved, it holds no message there yet.
pub(crate) async fn check_target(
    url: &str,
    target: &StreamTarget,
    future: TargetUse,
) -> Result<(), String> {
    const CHECK_TIMEOUT: Duration = Duration::from_secs(10);
    let server = Server::parse(url)?;
    let client = server.connect(CHECK_TIMEOUT, &Trouble::default()).await?;
    let mut context = jetstream::new(client);
    context.set_timeout(CHECK_TIMEOUT);
    let mut stream = match context.get_stream(&target.stream).await {
        Ok(stream) => stream,
        Err(err) => {
            if let Some(missing) = jetstream_missing(&context).await {
                return Err(missing);
            }
            return Err(format!(
                "cannot use the stream {}: {} (the service does not create it: see docs/deletion-events.md)",
                target.stream,
                one_line(&err)
            ));
        }
    };
    let wanted = format!("{}.>", target.subject_prefix);
    let info = stream
        .info()
        .await
        .map_err(|err| format!("cannot read the stream: {}", one_line(&err)))?;
    if !info
        .config
        .subjects
        .iter()
        .any(|subject| captures(subject, &wanted))
    {
        return Err(format!(
            "the stream {} does not capture {wanted} (its subjects: {})",
            target.stream,
            info.config.subjects.join(", ")
        ));
    }
    if matches!(future, TargetUse::Moved) {
        return Ok(());
    }
    match stream.get_first_raw_message_by_subject(&wanted, 1).await {
        Err(err) if err.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(()),
        Err(err) => Err(format!("cannot read the stream: {}", one_line(&err))),
        Ok(found) => Err(format!(
            "the stream {} already holds messages on {wanted} (the first at sequence {}): purge them (nats stream purge {} --subject '{wanted}'){}",
            target.stream,
            found.sequence,
            target.stream,
            match future {
                TargetUse::Add => " or choose another --subject-prefix",
                _ => "",
            }
        )),
    }
}

/// Whether a stream's subject filter takes every subject `wanted` matches.
fn captures(filter: &str, wanted: &str) -> bool {
    let mut filter = filter.split('.');
    let mut wanted = wanted.split('.');
    loop {
        match (filter.next(), wanted.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(token)) if token != ">" => {}
            (Some(f), Some(w)) if f == w && w != ">" => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// The messages this delivery stored and has not saved yet, by plant: the next message of
/// such a plant is published after it, and the next report saves them with the cursor.
/// Once saved they are forgotten here (a plant's next event is rare, and reads the store).
#[derive(Default)]
pub(super) struct StreamSubjects {
    unsaved: HashMap<i64, StoredMessage>,
}

impl StreamSubjects {
    /// The plant's message stored and not yet saved.
    pub(super) fn last(&self, plant: i64) -> Option<StoredMessage> {
        self.unsaved.get(&plant).copied()
    }

    /// The plant's last message is `message` now, unless a later one is known already.
    pub(super) fn stored(&mut self, message: StoredMessage) {
        let last = self.unsaved.entry(message.plant_id).or_insert(message);
        if last.position < message.position {
            *last = message;
        }
    }

    pub(super) fn has_unsaved(&self) -> bool {
        !self.unsaved.is_empty()
    }

    /// What is stored but not yet saved, for the next report.
    pub(super) fn unsaved(&self) -> Vec<StoredMessage> {
        self.unsaved.values().copied().collect()
    }

    /// The report carrying `saved` was saved.
    pub(super) fn saved(&mut self, saved: &[StoredMessage]) {
        for message in saved {
            if self.unsaved.get(&message.plant_id) == Some(message) {
                self.unsaved.remove(&message.plant_id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_captures_what_its_wildcards_cover() {
        let wanted = "plantstore.plants.>";
        for filter in ["plantstore.plants.>", "plantstore.>", ">", "*.plants.>"] {
            assert!(captures(filter, wanted), "{filter}");
        }
        for filter in [
            "plantstore.plants.*",
            "plantstore.plants",
            "plantstore.plants.7",
            "other.>",
            "plantstore.*",
        ] {
            assert!(!captures(filter, wanted), "{filter}");
        }
    }

    #[test]
    fn one_server_is_stored_one_way() {
        for text in [
            "nats://u:p@broker:4222",
            "nats://u:p@broker:4222/",
            " nats://u:p@broker:4222/x?y#z ",
        ] {
            assert_eq!(
                stored_url(text).as_deref(),
                Ok("nats://u:p@broker:4222"),
                "{text}"
            );
        }
    }

    #[test]
    fn credentials_leave_the_address() {
        let server = Server::parse("nats://us%40er:p%3Ass@broker:4222").expect("a NATS URL");
        assert_eq!(server.address, "nats://broker:4222");
        assert_eq!(server.user.as_deref(), Some("us@er"));
        assert_eq!(server.password.as_deref(), Some("p:ss"));
        let err = Server::parse("http://user:secret@broker")
            .err()
            .expect("refused");
        assert!(!err.contains("secret"), "{err}");
    }
}
