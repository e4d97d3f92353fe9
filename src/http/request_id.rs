//! The request id each request and answer carry: the caller's when sane, else a new one.

use std::fmt;

use poem::http::HeaderMap;

pub(super) const REQUEST_ID_HEADER: &str = "x-request-id";
const REQUEST_ID_MAX_LEN: usize = 128;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RequestId(String);

impl RequestId {
    /// Keeps the caller's id only if short and plain: safe to echo, log and audit.
    pub(super) fn from_headers(headers: &HeaderMap) -> Self {
        headers
            .get(REQUEST_ID_HEADER)
            .and_then(|value| value.to_str().ok())
            .filter(|id| is_sane_request_id(id))
            .map(|id| Self(id.to_owned()))
            .unwrap_or_else(Self::generate)
    }

    pub(super) fn generate() -> Self {
        Self(uuid::Uuid::new_v4().to_string())
    }

    pub(super) fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn is_sane_request_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= REQUEST_ID_MAX_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

#[cfg(test)]
mod tests {
    use poem::http::HeaderValue;

    use super::*;

    fn from(value: &str) -> RequestId {
        let mut headers = HeaderMap::new();
        headers.insert(
            REQUEST_ID_HEADER,
            HeaderValue::from_str(value).expect("header value"),
        );
        RequestId::from_headers(&headers)
    }

    #[test]
    fn keeps_a_sane_id_and_replaces_others() {
        assert_eq!(from("abc-123_x.y:z").as_str(), "abc-123_x.y:z");
        assert_ne!(from("has space").as_str(), "has space");
        assert_ne!(
            from(&"a".repeat(REQUEST_ID_MAX_LEN + 1)).as_str().len(),
            REQUEST_ID_MAX_LEN + 1
        );
        assert_eq!(from("").as_str().len(), 36);
    }
}
