//! The OpenAPI document around the operation, as served (`/openapi.json`, `/openapi.yaml`,
//! Swagger UI on `/docs`) and printed (`plantstore openapi`), rendered once at start.

use std::sync::Arc;

use bytes::Bytes;
use poem::{Response, Route, get};
use poem_openapi::{ContactObject, LicenseObject, OpenApiService, ServerObject};
use serde_json::{Value, json};

use super::{
    error::ApiError, idempotency_key, plants::PlantsApi, request_id::REQUEST_ID_HEADER,
    routes::RouteFacts,
};

#[derive(Debug, thiserror::Error)]
pub enum DocumentError {
    #[error("poem-openapi's document is not JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("the OpenAPI document cannot be written as YAML: {0}")]
    Yaml(#[from] serde_yaml::Error),
}

/// The document's renderings, each kept as `Bytes` so an answer shares it rather than
/// copying it (the Swagger UI page is large), and the facts of the routes it declares.
#[derive(Debug, Clone)]
pub struct Documents {
    json: Bytes,
    yaml: Bytes,
    ui: Bytes,
    pub(super) route_facts: Arc<RouteFacts>,
}

impl Documents {
    /// Every rendering; the service refuses to start rather than serve an empty document.
    pub fn render() -> Result<Self, DocumentError> {
        let service = service();
        Self::from_spec(&service.spec(), &service.swagger_ui_html())
    }

    /// The renderings of poem-openapi's document `spec`, with `ui` (poem-openapi's page,
    /// which embeds `spec`) carrying the completed document instead.
    fn from_spec(spec: &str, ui: &str) -> Result<Self, DocumentError> {
        let document = completed(spec)?;
        let json = document.to_string();
        Ok(Self {
            route_facts: Arc::new(RouteFacts::from_document(&document)),
            yaml: yaml(&document)?.into(),
            ui: ui.replace(spec, &json).into(),
            json: json.into(),
        })
    }

    /// `/openapi.json`, `/openapi.yaml` and `/docs`.
    pub fn routes(&self) -> Route {
        let serve = |content_type: &'static str, body: &Bytes| {
            let body = body.clone();
            get(poem::endpoint::make_sync(move |_| {
                Response::builder()
                    .content_type(content_type)
                    .body(body.clone())
            }))
        };
        Route::new()
            .at(
                "/openapi.json",
                serve("application/json; charset=utf-8", &self.json),
            )
            .at(
                "/openapi.yaml",
                serve("application/yaml; charset=utf-8", &self.yaml),
            )
            .at("/docs", serve("text/html; charset=utf-8", &self.ui))
    }
}

/// The operation with the document's title, version, license and servers as the contract
/// has them, and what API linters ask for besides (a contact, the license's URL, a tag).
pub(super) fn service() -> OpenApiService<PlantsApi, ()> {
    OpenApiService::new(PlantsApi, "Plant Store", "1.0.0")
        .description(
            "A plant store service over HTTP with JSON error bodies. Plants are addressed by an \
             integer identifier. This is the published contract: the one operation it shows is \
             deleting a plant.",
        )
        .contact(ContactObject::new().name("Plant Store maintainers"))
        .license(LicenseObject::new("MIT").url("https://opensource.org/license/mit"))
        // First, so Swagger UI's Try it out calls the address its page was loaded from
        // (a relative URL resolves against the document's); then the contract's own.
        .server(
            ServerObject::new("/").description("This service, where this document was loaded from"),
        )
        .server(
            ServerObject::new("{base_url}")
                .description("A Plant Store service at another address")
                .variable(
                    "base_url",
                    "Its scheme, host and port",
                    "http://localhost:8080",
                ),
        )
}

/// The document as `plantstore openapi` prints it, completed as it is served.
pub fn document() -> Result<Value, DocumentError> {
    completed(&service().spec())
}

/// The YAML rendering of `document`, the same for `/openapi.yaml` and the command.
pub fn yaml(document: &Value) -> Result<String, DocumentError> {
    Ok(serde_yaml::to_string(document)?)
}

/// poem-openapi's `spec`, with example `Error` bodies and `x-request-id` on every response.
fn completed(spec: &str) -> Result<Value, DocumentError> {
    let mut document: Value = serde_json::from_str(spec)?;
    let operations = document["paths"]
        .as_object_mut()
        .into_iter()
        .flat_map(|paths| paths.values_mut())
        .filter_map(Value::as_object_mut)
        .flat_map(|methods| methods.values_mut());
    for operation in operations {
        let responses = operation["responses"].as_object_mut().into_iter().flatten();
        for (status, response) in responses {
            // poem-openapi writes a response header's name in capitals; the draft's spelling.
            if let Some(headers) = response["headers"].as_object_mut()
                && let Some(replayed) = headers.remove("IDEMPOTENT-REPLAYED")
            {
                headers.insert(idempotency_key::REPLAYED_HEADER.to_owned(), replayed);
            }
            response["headers"][REQUEST_ID_HEADER] = json!({
                "description": "The request's id: the caller's own when it is 1 to 128 of A-Z a-z 0-9 - _ . : and else a new UUID; the same id is in the log line and the audit row",
                "required": true,
                "schema": {"type": "string"},
            });
            let example = status.parse().ok().and_then(ApiError::example_of);
            if let (Some(example), Some(media)) =
                (example, response.pointer_mut("/content/application~1json"))
            {
                media["example"] = json!(example.body());
            }
        }
    }
    Ok(document)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_document_that_cannot_be_read_is_an_error_not_an_empty_answer() {
        let failed = Documents::from_spec("not JSON", "<html></html>");
        assert!(matches!(failed, Err(DocumentError::Json(_))), "{failed:?}");
    }
}
