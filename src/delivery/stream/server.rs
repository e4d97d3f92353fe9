//! A stream destination's NATS server: its URL (credentials taken out of the address), a
//! client whose troubles are kept for the operator, and the URL as a destination stores it.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use async_nats::{
    ConnectOptions, ServerError,
    connection::State,
    jetstream::{self, context::AccountErrorKind, stream::Stream},
};
use percent_encoding::percent_decode_str;
use reqwest::Url;

use crate::telemetry::one_line;

pub(super) struct Connection {
    pub(super) client: async_nats::Client,
    pub(super) context: jetstream::Context,
    pub(super) stream: Stream<()>,
    pub(super) trouble: Trouble,
}

/// The client's last problem, cleared on reconnecting; told here, as its own logs are off.
pub(super) type Trouble = Arc<Mutex<Option<String>>>;

impl Connection {
    /// Why a publish cannot be sent now: the client is not connected, and why not.
    pub(super) fn unusable(&self) -> Option<String> {
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
pub(super) struct Server {
    address: String,
    user: Option<String>,
    password: Option<String>,
}

impl Server {
    /// The error says what is wrong without the URL (it may hold credentials).
    pub(super) fn parse(text: &str) -> Result<Self, String> {
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

    pub(super) async fn connect(
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
pub(super) async fn jetstream_missing(context: &jetstream::Context) -> Option<String> {
    match context.query_account().await {
        Err(err) if err.kind() == AccountErrorKind::JetStreamUnavailable => Some(
            "JetStream is not enabled on this NATS server, or not for this account (nats-server -js)"
                .into(),
        ),
        _ => None,
    }
}

/// The URL as a destination stores it: usable (as `Server::parse` checks), less what means
/// nothing to a NATS server (a path or trailing `/`, a query, a fragment), so one server is
/// written one way and a second destination for its stream and prefix is found a duplicate.
pub(crate) fn stored_url(text: &str) -> Result<String, String> {
    Server::parse(text)?;
    let mut url = Url::parse(text.trim()).map_err(|err| err.to_string())?;
    url.set_path("");
    url.set_query(None);
    url.set_fragment(None);
    Ok(url.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

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
