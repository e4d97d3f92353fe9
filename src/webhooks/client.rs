//! The HTTP/1.1 keep-alive connections delivery posts over: opened, reused and driven
//! inside the endpoint's own task, so that one event costs no task of its own and no
//! wake-up of another thread (a pooled client's connection tasks were a sixth of the
//! service's CPU under load).

use std::{future::Future, pin::Pin, sync::Arc, time::Duration};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::{body::Incoming, client::conn::http1};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpStream,
    time::Instant,
};
use tokio_rustls::TlsConnector;

use crate::telemetry::one_line;

/// How long a connection may sit unused and still be reused: under the keep-alive limits
/// receivers commonly set (Node's 5 s, nginx's 75 s), so a reused connection is rarely one
/// the receiver is closing at that moment.
const IDLE: Duration = Duration::from_secs(2);
/// The most of a response's body read; past it the connection is not reused.
const BODY_LIMIT: usize = 64 * 1024;

/// Where one endpoint's events go, taken apart once from its stored URL.
pub(super) struct Address {
    /// `host:port`, for the socket.
    connect_to: String,
    /// For TLS; `None` for `http`.
    server_name: Option<ServerName<'static>>,
    host: HeaderValue,
    /// The path and query, all a request line carries.
    path: Uri,
    /// From credentials in the URL, as browsers and curl send them.
    authorization: Option<HeaderValue>,
}

impl Address {
    /// Why the URL cannot be posted to, without the URL (it may hold credentials).
    pub(super) fn parse(text: &str) -> Result<Self, String> {
        let url = reqwest::Url::parse(text)
            .map_err(|err| format!("the endpoint's stored URL cannot be used: {err}"))?;
        let unusable = |what: &str| format!("the endpoint's stored URL cannot be used: {what}");
        let tls = match url.scheme() {
            "https" => true,
            "http" => false,
            _ => return Err(unusable("not http or https")),
        };
        let host = url.host_str().ok_or_else(|| unusable("no host"))?;
        let port = url
            .port_or_known_default()
            .ok_or_else(|| unusable("no port"))?;
        let server_name = if tls {
            let bare = host.trim_start_matches('[').trim_end_matches(']');
            let name = ServerName::try_from(bare.to_owned())
                .map_err(|_| unusable("the host is not a name TLS can check"))?;
            Some(name)
        } else {
            None
        };
        let authority = match url.port() {
            Some(port) => format!("{host}:{port}"),
            None => host.to_owned(),
        };
        let path = match url.query() {
            Some(query) => format!("{}?{query}", url.path()),
            None => url.path().to_owned(),
        };
        Ok(Self {
            connect_to: format!("{host}:{port}"),
            server_name,
            host: HeaderValue::try_from(authority).map_err(|_| unusable("the host"))?,
            path: Uri::try_from(path).map_err(|_| unusable("the path"))?,
            authorization: basic_authorization(&url),
        })
    }
}

fn basic_authorization(url: &reqwest::Url) -> Option<HeaderValue> {
    use base64::Engine as _;
    let decode = |text: &str| {
        percent_encoding::percent_decode_str(text)
            .decode_utf8_lossy()
            .into_owned()
    };
    if url.username().is_empty() && url.password().is_none() {
        return None;
    }
    let pair = format!(
        "{}:{}",
        decode(url.username()),
        decode(url.password().unwrap_or_default())
    );
    let encoded = base64::engine::general_purpose::STANDARD.encode(pair);
    let mut value = HeaderValue::try_from(format!("Basic {encoded}")).ok()?;
    value.set_sensitive(true);
    Some(value)
}

/// A stream a connection runs over: TCP, or TLS over TCP.
trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Stream for T {}

type Driver = http1::Connection<TokioIo<Box<dyn Stream>>, Full<Bytes>>;

/// One open connection: its request half, and the future that moves its bytes, polled
/// beside whatever waits on it (`None` once it ended).
pub(super) struct Connection {
    sender: http1::SendRequest<Full<Bytes>>,
    driver: Option<Pin<Box<Driver>>>,
    idle_since: Instant,
}

/// An endpoint's connections not in use, as many as it may have in flight at most.
pub(super) struct Idle {
    connections: Vec<Connection>,
    keep: usize,
}

impl Idle {
    pub(super) fn keeping(keep: usize) -> Self {
        Self {
            connections: Vec::with_capacity(keep),
            keep,
        }
    }

    /// The most recently used connection still young enough to reuse.
    pub(super) fn take(&mut self) -> Option<Connection> {
        while let Some(connection) = self.connections.pop() {
            if connection.idle_since.elapsed() < IDLE && connection.driver.is_some() {
                return Some(connection);
            }
        }
        None
    }

    pub(super) fn put(&mut self, mut connection: Connection) {
        if connection.driver.is_some() && self.connections.len() < self.keep {
            connection.idle_since = Instant::now();
            self.connections.push(connection);
        }
    }
}

/// The status and headers a receiver answered with.
pub(super) struct Answer {
    pub(super) status: StatusCode,
    pub(super) headers: HeaderMap,
}

/// Opens connections: one TLS configuration for every endpoint.
#[derive(Clone)]
pub(super) struct Connector {
    tls: Result<TlsConnector, String>,
}

impl Connector {
    pub(super) fn new() -> Self {
        let tls = tls_config().map(|config| TlsConnector::from(Arc::new(config)));
        if let Err(err) = &tls {
            tracing::error!(error = %err, "webhook deliveries to https will fail until this is fixed");
        }
        Self { tls }
    }

    /// POSTs `body` with `headers` over `reused`, or a new connection; the connection back
    /// when it can be used again. A reused connection the receiver closed before it took
    /// the request is replaced once, at once: the request never left.
    pub(super) async fn post(
        &self,
        address: &Address,
        reused: Option<Connection>,
        headers: HeaderMap,
        body: Bytes,
    ) -> (Result<Answer, String>, Option<Connection>) {
        let request = match request(address, headers, body) {
            Ok(request) => request,
            Err(err) => return (Err(err), reused),
        };
        let request = match reused {
            Some(mut connection) => match exchange(&mut connection, request).await {
                Err(Unsent(request)) => *request,
                Ok(answer) => return finish(connection, answer).await,
                Err(Failed(err)) => return (Err(err), None),
            },
            None => request,
        };
        let mut connection = match self.connect(address).await {
            Ok(connection) => connection,
            Err(err) => return (Err(err), None),
        };
        match exchange(&mut connection, request).await {
            Ok(answer) => finish(connection, answer).await,
            Err(Unsent(_)) => (
                Err("the connection closed before the request went".into()),
                None,
            ),
            Err(Failed(err)) => (Err(err), None),
        }
    }

    async fn connect(&self, address: &Address) -> Result<Connection, String> {
        let tcp = TcpStream::connect(address.connect_to.as_str())
            .await
            .map_err(|err| format!("cannot connect: {err}"))?;
        // Requests are written whole; waiting to fill a segment only delays them.
        tcp.set_nodelay(true)
            .map_err(|err| format!("cannot connect: {err}"))?;
        let stream: Box<dyn Stream> = match &address.server_name {
            None => Box::new(tcp),
            Some(name) => {
                let tls = self.tls.as_ref().map_err(Clone::clone)?;
                Box::new(
                    tls.connect(name.clone(), tcp)
                        .await
                        .map_err(|err| format!("TLS: {err}"))?,
                )
            }
        };
        let (sender, driver) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|err| one_line(&err))?;
        Ok(Connection {
            sender,
            driver: Some(Box::pin(driver)),
            idle_since: Instant::now(),
        })
    }
}

/// The POST a connection carries: the endpoint's path, its Host and credentials.
fn request(
    address: &Address,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Request<Full<Bytes>>, String> {
    let mut request = Request::post(address.path.clone())
        .body(Full::new(body))
        .map_err(|err| format!("cannot make the request: {err}"))?;
    *request.headers_mut() = headers;
    let headers = request.headers_mut();
    headers.insert(header::HOST, address.host.clone());
    if let Some(authorization) = &address.authorization {
        headers.insert(header::AUTHORIZATION, authorization.clone());
    }
    Ok(request)
}

/// The platform's trusted roots, as `reqwest` would use them; HTTP/1.1 only.
fn tls_config() -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let verifier = rustls_platform_verifier::Verifier::new(Arc::clone(&provider))
        .map_err(|err| format!("cannot load the trusted certificates: {err}"))?;
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|err| format!("TLS: {err}"))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

enum Exchanged {
    /// The connection could not take the request; here it is, never sent.
    Unsent(Box<Request<Full<Bytes>>>),
    Failed(String),
}
use Exchanged::{Failed, Unsent};

async fn exchange(
    connection: &mut Connection,
    request: Request<Full<Bytes>>,
) -> Result<(Answer, Incoming), Exchanged> {
    if drive(&mut connection.driver, connection.sender.ready())
        .await
        .is_err()
    {
        return Err(Unsent(Box::new(request)));
    }
    let response = drive(
        &mut connection.driver,
        connection.sender.try_send_request(request),
    )
    .await;
    match response {
        Ok(response) => {
            let (parts, body) = response.into_parts();
            let answer = Answer {
                status: parts.status,
                headers: parts.headers,
            };
            Ok((answer, body))
        }
        Err(mut err) => match err.take_message() {
            Some(request) => Err(Unsent(Box::new(request))),
            None => Err(Failed(one_line(err.error()))),
        },
    }
}

/// Reads the answer's body to its end, so the connection can carry the next request; a
/// body too long or cut short costs the connection, not the answer.
async fn finish(
    mut connection: Connection,
    (answer, body): (Answer, Incoming),
) -> (Result<Answer, String>, Option<Connection>) {
    let read = drive(
        &mut connection.driver,
        Limited::new(body, BODY_LIMIT).collect(),
    )
    .await;
    let reusable = read.is_ok() && connection.driver.is_some();
    (Ok(answer), reusable.then_some(connection))
}

/// Awaits `task` while moving the connection's bytes; marks the connection ended when its
/// driver finishes (the receiver closed it, or it failed).
async fn drive<F: Future>(driver: &mut Option<Pin<Box<Driver>>>, task: F) -> F::Output {
    tokio::pin!(task);
    let Some(running) = driver.as_mut() else {
        return task.await;
    };
    // The driver first: the bytes it reads are what `task` waits for.
    let done = tokio::select! {
        biased;
        _ended = running.as_mut() => None,
        output = &mut task => Some(output),
    };
    match done {
        Some(output) => output,
        None => {
            *driver = None;
            task.await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_keeps_what_a_request_needs_and_no_more() {
        let address = Address::parse("https://user:p%40ss@hooks.example:8443/in?x=1#frag")
            .expect("a usable URL");
        assert_eq!(address.connect_to, "hooks.example:8443");
        assert_eq!(address.host, "hooks.example:8443");
        assert_eq!(address.path, "/in?x=1");
        assert!(address.server_name.is_some());
        // base64 of "user:p@ss"
        assert_eq!(
            address.authorization.expect("credentials"),
            "Basic dXNlcjpwQHNz"
        );

        let address = Address::parse("http://[::1]/hooks").expect("a usable URL");
        assert_eq!(address.connect_to, "[::1]:80");
        assert_eq!(address.host, "[::1]");
        assert!(address.server_name.is_none() && address.authorization.is_none());
    }

    #[test]
    fn an_unusable_address_is_explained_without_the_url() {
        let err = Address::parse("ftp://secret@example.com/x")
            .err()
            .expect("ftp refused");
        assert!(
            err.contains("not http or https") && !err.contains("secret"),
            "{err}"
        );
    }
}
