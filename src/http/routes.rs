//! What the router and the document tell of a route: its label in logs and metrics, the
//! methods a 405 names, and a path poem would refuse made routable.

use std::sync::Arc;

use percent_encoding::{NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
use poem::{PathPattern, http::Uri};
use serde_json::Value;

/// The routes the OpenAPI document declares, with their methods; the others answer GET.
#[derive(Debug, Clone)]
pub(super) struct RouteFacts {
    documented: Vec<DocumentedRoute>,
    /// The label when no route matched: fixed, so clients cannot invent metric series.
    unmatched: Arc<str>,
    /// The `Allow` of every route the document does not declare.
    get_only: Arc<str>,
}

/// No documented routes: a route table of a test's own.
impl Default for RouteFacts {
    fn default() -> Self {
        Self::from_document(&Value::Null)
    }
}

#[derive(Debug, Clone)]
struct DocumentedRoute {
    /// As the document spells it: `/plants/{id}`.
    path: Arc<str>,
    /// For a 405's `Allow`: `DELETE`.
    methods: Arc<str>,
}

impl RouteFacts {
    /// Read from the document's `paths`, so a new operation brings its own facts.
    pub(super) fn from_document(document: &Value) -> Self {
        let paths = document["paths"].as_object().into_iter().flatten();
        let documented = paths
            .map(|(path, operations)| {
                let methods: Vec<String> = operations
                    .as_object()
                    .into_iter()
                    .flat_map(|operations| operations.keys())
                    .map(|method| method.to_ascii_uppercase())
                    .collect();
                DocumentedRoute {
                    path: path.as_str().into(),
                    methods: methods.join(", ").into(),
                }
            })
            .collect();
        Self {
            documented,
            unmatched: "other".into(),
            get_only: "GET".into(),
        }
    }

    /// The route's label in logs and `/metrics`: the document's spelling of its routes
    /// (poem-openapi mounts `/plants/{id}` as `/plants/:param0`), else the router's
    /// pattern, or `other` when none matched.
    pub(super) fn label(&self, pattern: Option<&PathPattern>) -> Arc<str> {
        let Some(PathPattern(pattern)) = pattern else {
            return Arc::clone(&self.unmatched);
        };
        match self.documented(pattern) {
            Some(route) => Arc::clone(&route.path),
            None => Arc::clone(pattern),
        }
    }

    /// The methods of the route poem matched, for the `Allow` header of a 405.
    pub(super) fn allowed_methods(&self, pattern: Option<&PathPattern>) -> Arc<str> {
        pattern
            .and_then(|PathPattern(pattern)| self.documented(pattern))
            .map_or(&self.get_only, |route| &route.methods)
            .clone()
    }

    fn documented(&self, pattern: &str) -> Option<&DocumentedRoute> {
        self.documented
            .iter()
            .find(|route| same_route(pattern, &route.path))
    }
}

/// Whether poem's `pattern` and the document's `path` name one route: the same literal
/// segments, and a parameter (`:param0`, `{id}`) wherever the other has one.
fn same_route(pattern: &str, path: &str) -> bool {
    let is_parameter = |segment: &str| segment.starts_with(':') || segment.starts_with('{');
    pattern.split('/').count() == path.split('/').count()
        && pattern
            .split('/')
            .zip(path.split('/'))
            .all(|(ours, theirs)| ours == theirs || (is_parameter(ours) && is_parameter(theirs)))
}

/// The URI with each path segment that does not percent-decode to UTF-8 re-encoded from its
/// lossy decoding; `None` when all decode. poem's router would answer a bare 400 before
/// authentication; this way an anonymous caller still gets 401 and an unknown path 404.
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

    #[test]
    fn a_documented_route_is_labelled_and_answers_as_the_document_says() {
        let facts = RouteFacts::from_document(&serde_json::json!({
            "paths": {"/plants/{id}": {"delete": {}}}
        }));
        let matched = |pattern: &str| PathPattern(pattern.into());
        assert_eq!(
            &*facts.label(Some(&matched("/plants/:param0"))),
            "/plants/{id}"
        );
        assert_eq!(
            &*facts.allowed_methods(Some(&matched("/plants/:param0"))),
            "DELETE"
        );
        assert_eq!(&*facts.label(Some(&matched("/healthz"))), "/healthz");
        assert_eq!(&*facts.allowed_methods(Some(&matched("/healthz"))), "GET");
        assert_eq!(
            &*facts.label(Some(&matched("/plants/:param0/x"))),
            "/plants/:param0/x"
        );
        assert_eq!(&*facts.label(None), "other");
    }

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
