//! Where an endpoint's events go, taken from its stored URL, and the bytes of a POST there.

use http::{HeaderValue, Uri};
use rustls::pki_types::ServerName;

/// Where one endpoint's events go, taken apart once from its stored URL.
pub(in crate::webhooks) struct Address {
    /// `host:port`, for the socket.
    pub(super) connect_to: String,
    /// For TLS; `None` for `http`.
    pub(super) server_name: Option<ServerName<'static>>,
    host: HeaderValue,
    /// The path and query, all a request line carries.
    path: String,
    /// From credentials in the URL, as browsers and curl send them.
    authorization: Option<HeaderValue>,
}

impl Address {
    /// Why the URL cannot be posted to, without the URL (it may hold credentials).
    pub(in crate::webhooks) fn parse(text: &str) -> Result<Self, String> {
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
            path: Uri::try_from(path.as_str())
                .map(|_| path)
                .map_err(|_| unusable("the path"))?,
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

/// The bytes of one POST to `address`: its path, Host and credentials, then `headers` and
/// `body`. A header value that could break the request's framing is refused.
pub(in crate::webhooks) fn request(
    address: &Address,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<bytes::Bytes, String> {
    let mut request = Vec::with_capacity(256 + body.len());
    request.extend_from_slice(b"POST ");
    request.extend_from_slice(address.path.as_bytes());
    request.extend_from_slice(b" HTTP/1.1\r\n");
    let mut line = |name: &str, value: &[u8]| {
        request.extend_from_slice(name.as_bytes());
        request.extend_from_slice(b": ");
        request.extend_from_slice(value);
        request.extend_from_slice(b"\r\n");
    };
    line("host", address.host.as_bytes());
    if let Some(authorization) = &address.authorization {
        line("authorization", authorization.as_bytes());
    }
    for (name, value) in headers {
        if HeaderValue::from_str(value).is_err() {
            return Err(format!("cannot make the {name} header"));
        }
        line(name, value.as_bytes());
    }
    line("content-length", body.len().to_string().as_bytes());
    request.extend_from_slice(b"\r\n");
    request.extend_from_slice(body);
    Ok(request.into())
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
