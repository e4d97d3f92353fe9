//! The published operation, `DELETE /plants/{id}`, and the OpenAPI document around it.

use std::sync::Arc;

use bytes::Bytes;
use plantstore_store::{Deleted, Deletion, StoreError};
use poem::{
    Endpoint, IntoResponse, Request, Response, Route, get,
    http::Method,
    web::{Data, Redirect},
};
use poem_openapi::{
    ApiResponse, LicenseObject, OpenApi, OpenApiService,
    param::{Header, Path},
};
use serde_json::{Value, json};

use crate::{
    auth::BearerAuth,
    error::ApiError,
    idempotency,
    request_id::{self, RequestId},
    state::AppState,
};

pub struct PlantsApi;

#[derive(Debug, ApiResponse)]
pub enum PlantDeleted {
    /// Plant deleted: now, or by an earlier request with the same Idempotency-Key
    #[oai(status = 204)]
    Deleted(
        /// `true` when an earlier request with this Idempotency-Key from the same caller
        /// deleted the plant and this answer repeats its 204; absent otherwise
        #[oai(header = "Idempotent-Replayed")]
        Option<bool>,
    ),
}

#[OpenApi]
impl PlantsApi {
    /// Delete a plant
    ///
    /// Deletes a single plant based on the ID supplied
    // The bearer parameter comes first: an anonymous request must get 401 before its id
    // is even parsed.
    #[oai(path = "/plants/:id", method = "delete", operation_id = "deletePlant")]
    #[tracing::instrument(name = "delete_plant", level = "debug", skip_all, fields(id = id.0, token = %auth.0.token_name, idempotency_key = idempotency_key.0.as_deref()))]
    async fn delete_plant(
        &self,
        auth: BearerAuth,
        /// ID of plant to delete
        id: Path<i64>,
        /// Makes a retry safe: a retry with the same key from the same caller (token or JWT
        /// subject) within PLANTSTORE_IDEMPOTENCY_TTL (default 24 hours) of a delete it made
        /// answers 204 again with `Idempotent-Replayed: true`; used for another plant id, 422.
        /// A first try that answered 404, 409 or 503 did nothing and is simply tried again.
        /// 1 to 255 printable ASCII characters, bare or as a quoted string ("key").
        #[oai(name = "Idempotency-Key")]
        idempotency_key: Header<Option<String>>,
        state: Data<&AppState>,
        request_id: Data<&RequestId>,
        request: &Request,
    ) -> Result<PlantDeleted, ApiError> {
        // Read from the headers themselves: poem-openapi takes a value that is not text as
        // no header at all, and the first of several.
        let idempotency_key = idempotency::from_headers(request.headers())?;
        let deletion = Deletion {
            plant_id: id.0,
            caller: Arc::clone(&auth.0.token_name),
            request_id: request_id.as_str().to_owned(),
            idempotency_key,
        };
        match state.store.delete_plant(deletion).await {
            Ok(Deleted::Now) => {
                state.metrics.deleted();
                Ok(PlantDeleted::Deleted(None))
            }
            Ok(Deleted::Replayed) => Ok(PlantDeleted::Deleted(Some(true))),
            Err(StoreError::NotFound) => Err(ApiError::PlantNotFound(id.0)),
            Err(StoreError::Referenced) => Err(ApiError::PlantReferenced(id.0)),
            Err(StoreError::KeyReused { plant_id }) => Err(ApiError::IdempotencyKeyReused {
                earlier: plant_id,
                plant: id.0,
            }),
            Err(err) => Err(err.into()),
        }
    }
}

/// The operation with the document's title, version and license, as the contract has them.
pub fn service() -> OpenApiService<PlantsApi, ()> {
    OpenApiService::new(PlantsApi, "Plant Store", "1.0.0")
        .description(
            "A plant store service over HTTP with JSON error bodies. Plants are addressed by an \
             integer identifier. This is the published contract: the one operation it shows is \
             deleting a plant.",
        )
        .license(LicenseObject::new("MIT"))
}

/// The OpenAPI document as served (`/openapi.json`, `/openapi.yaml`, `/docs`) and printed
/// (`plantstore openapi`): poem-openapi's, plus what its response metadata cannot carry,
/// an example `Error` body for each error status and `x-request-id` on every response.
pub fn document() -> Value {
    completed(&service().spec())
}

/// poem-openapi's document `spec`, with the examples and headers it cannot carry.
fn completed(spec: &str) -> Value {
    let mut document: Value = serde_json::from_str(spec).expect("poem-openapi writes JSON");
    let operations = document["paths"]
        .as_object_mut()
        .into_iter()
        .flat_map(|paths| paths.values_mut())
        .filter_map(Value::as_object_mut)
        .flat_map(|methods| methods.values_mut());
    for operation in operations {
        // poem-openapi would check these itself, with its own error; the handler does. No
        // example: Swagger UI would fill it in, and every Try it out would share one key.
        let parameters = operation["parameters"].as_array_mut().into_iter().flatten();
        for parameter in parameters.filter(|p| p["name"] == idempotency::HEADER) {
            parameter["schema"] = json!({
                "type": "string",
                "minLength": 1,
                "maxLength": 2 * idempotency::MAX_LEN + 2,
                "pattern": idempotency::PATTERN,
            });
        }
        let responses = operation["responses"].as_object_mut().into_iter().flatten();
        for (status, response) in responses {
            // poem-openapi writes a response header's name in capitals; the draft's spelling.
            if let Some(headers) = response["headers"].as_object_mut()
                && let Some(replayed) = headers.remove("IDEMPOTENT-REPLAYED")
            {
                headers.insert(idempotency::REPLAYED_HEADER.to_owned(), replayed);
            }
            response["headers"][request_id::HEADER] = json!({
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
    document
}

/// The document's renderings, made once at start: `/openapi.json`, `/openapi.yaml`, and
/// Swagger UI on `/docs` (poem-openapi's page, carrying this document instead of its own).
/// Each is kept as `Bytes`, so an answer shares it rather than copying it (the page is
/// over a megabyte).
pub fn document_routes() -> Route {
    let service = service();
    let spec = service.spec();
    let document = completed(&spec);
    let json = document.to_string();
    let yaml = serde_yaml::to_string(&document).unwrap_or_default();
    let ui = service.swagger_ui_html().replace(&spec, &json);
    let serve = |content_type: &'static str, body: String| {
        let body = Bytes::from(body);
        get(poem::endpoint::make_sync(move |_| {
            Response::builder()
                .content_type(content_type)
                .body(body.clone())
        }))
    };
    Route::new()
        .at(
            "/openapi.json",
            serve("application/json; charset=utf-8", json),
        )
        .at(
            "/openapi.yaml",
            serve("application/yaml; charset=utf-8", yaml),
        )
        .at("/docs", serve("text/html; charset=utf-8", ui))
}

/// `/` leads a browser to Swagger UI. In front of the router, because the operations
/// nested at `/` own that path there.
pub async fn root_to_docs<E: Endpoint>(next: Arc<E>, req: Request) -> poem::Result<Response> {
    if req.uri().path() != "/" {
        return next.call(req).await.map(IntoResponse::into_response);
    }
    match *req.method() {
        Method::GET | Method::HEAD => Ok(Redirect::see_other("/docs").into_response()),
        _ => Err(ApiError::MethodNotAllowed { allow: "GET" }.into()),
    }
}
