//! Facts about request paths: which route one belongs to, the methods it answers, and a
//! path poem's router would refuse made routable.

use percent_encoding::{NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
use poem::http::Uri;

/// The prefix of the published operation's path.
pub(super) const PLANTS_PREFIX: &str = "/plants/";

/// The methods a path answers to, for the `Allow` header of a 405.
pub(super) fn allowed_methods(path: &str) -> &'static str {
    if path.starts_with(PLANTS_PREFIX) {
        "DELETE"
    } else {
        "GET"
    }
}

/// The route a path belongs to, as `/metrics` labels it: a fixed set, so a client cannot
/// make new series by inventing paths.
pub(super) fn template(path: &str) -> &'static str {
    match path {
        "/" => "/",
        "/healthz" => "/healthz",
        "/readyz" => "/readyz",
        "/metrics" => "/metrics",
        "/openapi.json" => "/openapi.json",
        "/openapi.yaml" => "/openapi.yaml",
        "/docs" => "/docs",
        _ => match path.strip_prefix(PLANTS_PREFIX) {
            Some(id) if !id.is_empty() && !id.contains('/') => "/plants/{id}",
            _ => "other",
        },
    }
}

/// Whether a route is one that orchestrators and scrapers poll.
pub(super) fn is_probe(route: &str) -> bool {
    matches!(route, "/healthz" | "/readyz" | "/metrics")
}

/// The request's URI with every path segment that does not percent-decode to UTF-8
/// replaced by its lossy decoding, encoded again; `None` when every segment decodes.
/// poem's router answers such a path with a bare 400 before any route, and so before
/// authentication; this way a bad segment reaches the route it was sent to, and an
/// anonymous caller still gets 401 and an unknown path 404.
pub(super) fn with_decodable_path(uri: &Uri) -> Option<Uri> {
    let path = uri.path();
    if !path.contains('%') || decodes(path) {
        return None;
    }
    let fixed: Vec<String> = path
        .split('/')
        .map(|segment| {
            if decodes(segment) {
                segment.to_owned()
            } else {
                let bytes: Vec<u8> = percent_decode_str(segment).collect();
                utf8_percent_encode(&String::from_utf8_lossy(&bytes), NON_ALPHANUMERIC).to_string()
            }
        })
        .collect();
    let mut fixed = fixed.join("/");
    if let Some(query) = uri.query() {
        fixed = format!("{fixed}?{query}");
    }
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(fixed.parse().ok()?);
    Uri::from_parts(parts).ok()
}

fn decodes(text: &str) -> bool {
    percent_decode_str(text).decode_utf8().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixed(uri: &str) -> Option<String> {
        with_decodable_path(&uri.parse().expect("a URI")).map(|uri| uri.to_string())
    }

    #[test]
    fn only_undecodable_segments_change() {
        assert_eq!(fixed("/plants/1"), None);
        assert_eq!(fixed("/plants/%E2%82%AC"), None);
        assert_eq!(
            fixed("/plants/%D7?x=%D7"),
            Some("/plants/%EF%BF%BD?x=%D7".into())
        );
        assert_eq!(fixed("/plants/%2F%D7"), Some("/plants/%2F%EF%BF%BD".into()));
        assert_eq!(fixed("/x%FF/1"), Some("/x%EF%BF%BD/1".into()));
    }
}
