//! The served OpenAPI document means what the published contract means.

use serde_json::{Value, json};

use crate::helpers::{Backend, spawn_app};

/// A copy of `shared/contract/openapi.json`; CI checks the copy is current.
const CONTRACT: &str = include_str!("../contract/openapi.json");

/// The statuses SPEC.md adds to the contract's 204 and 400 (and 422, with Idempotency-Key), each
/// with the Error schema.
const EXTRA_ERROR_STATUSES: [&str; 8] = ["401", "403", "404", "405", "409", "422", "500", "503"];

#[tokio::test]
async fn the_served_document_means_what_the_contract_says() {
    let app = spawn_app(Backend::Sqlite).await;
    let served: Value = app.get("/openapi.json").await.json().await.expect("JSON");
    let contract: Value = serde_json::from_str(CONTRACT).expect("the contract is JSON");

    for field in ["title", "version"] {
        assert_eq!(
            served["info"][field], contract["info"][field],
            "info.{field}"
        );
    }
    assert_eq!(
        served["info"]["license"]["name"],
        contract["info"]["license"]["name"]
    );
    assert_eq!(keys(&served["paths"]), keys(&contract["paths"]));
    // First the server Swagger UI's Try it out calls: relative, so the address the page
    // was loaded from. Then each of the contract's, its variables' defaults kept.
    let servers = served["servers"].as_array().expect("servers");
    assert_eq!(servers[0]["url"], "/");
    for expected in contract["servers"]
        .as_array()
        .expect("the contract's servers")
    {
        let same = |server: &&Value| {
            server["url"] == expected["url"]
                && keys(&server["variables"]) == keys(&expected["variables"])
                && keys(&expected["variables"]).iter().all(|name| {
                    server["variables"][name]["default"] == expected["variables"][name]["default"]
                })
        };
        assert!(
            servers.iter().any(|s| same(&s)),
            "{expected} in {servers:?}"
        );
    }
    // Every field of the contract's scheme; the served one may add a description.
    let served_scheme = &served["components"]["securitySchemes"]["bearerAuth"];
    for (field, expected) in [("type", "http"), ("scheme", "bearer")] {
        assert_eq!(served_scheme[field], expected, "bearerAuth.{field}");
    }

    for (path, methods) in contract["paths"].as_object().expect("paths") {
        assert_eq!(
            keys(methods),
            keys(&served["paths"][path]),
            "methods of {path}"
        );
        for (method, expected) in methods.as_object().expect("operations") {
            let actual = &served["paths"][path][method];
            let at = format!("{method} {path}");
            // The contract's parameters unchanged; what is added is only optional headers
            // (Idempotency-Key), so every request the contract allows is still valid.
            let published = parameters(expected);
            let (contract_params, added): (Vec<Value>, Vec<Value>) = parameters(actual)
                .into_iter()
                .partition(|p| published.contains(p));
            assert_eq!(contract_params, published, "{at} parameters");
            for param in added {
                assert_eq!(
                    (&param[1], &param[2]),
                    (&json!("header"), &json!(false)),
                    "{at}: {param}"
                );
            }
            assert_eq!(
                security(&served, actual),
                security(&contract, expected),
                "{at} security"
            );
            for (status, response) in expected["responses"].as_object().expect("responses") {
                assert_eq!(
                    body_schema(&served, &actual["responses"][status]),
                    body_schema(&contract, response),
                    "{at} {status}"
                );
            }
            let error = body_schema(&contract, &expected["responses"]["400"]);
            for status in EXTRA_ERROR_STATUSES {
                assert_eq!(
                    body_schema(&served, &actual["responses"][status]),
                    error,
                    "{at} {status}"
                );
            }
        }
    }
}

#[tokio::test]
async fn the_openapi_command_prints_the_served_document() {
    let app = spawn_app(Backend::Sqlite).await;
    let served: Value = app.get("/openapi.json").await.json().await.expect("JSON");
    let served_yaml: Value = serde_yaml::from_str(
        &app.get("/openapi.yaml")
            .await
            .text()
            .await
            .expect("a YAML body"),
    )
    .expect("YAML");

    let printed = |args: &[&str]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_plantstore"))
            .args(args)
            .env_clear()
            .current_dir(tempfile::tempdir().expect("dir").path())
            .output()
            .expect("run plantstore openapi");
        assert!(output.status.success());
        String::from_utf8(output.stdout).expect("UTF-8")
    };

    let json: Value = serde_json::from_str(&printed(&["openapi"])).expect("JSON on stdout");
    assert_eq!(json, served);
    let yaml: Value =
        serde_yaml::from_str(&printed(&["openapi", "--format", "yaml"])).expect("YAML on stdout");
    assert_eq!(yaml, served);
    assert_eq!(served_yaml, served, "/openapi.yaml is /openapi.json");
}

/// Each error status's example is what the service really answers in that case, and every
/// response declares `x-request-id`, as a client generator reads them.
#[tokio::test]
async fn the_examples_are_real_answers_and_every_header_is_declared() {
    let app = spawn_app(Backend::Sqlite).await;
    let served: Value = app.get("/openapi.json").await.json().await.expect("JSON");
    let responses = &served["paths"]["/plants/{id}"]["delete"]["responses"];
    let example =
        |status: &str| responses[status]["content"]["application/json"]["example"].clone();

    let real = |response: reqwest::Response| async move {
        response.json::<Value>().await.expect("a JSON body")
    };
    assert_eq!(example("400"), real(app.delete("abc").await).await);
    assert_eq!(
        example("401"),
        real(app.delete_with("1", Some("pst_unknown")).await).await
    );
    assert_eq!(example("404"), real(app.delete("42").await).await);
    for (status, response) in responses.as_object().expect("responses") {
        assert!(
            response["headers"]["x-request-id"]["schema"]["type"] == "string",
            "{status} declares x-request-id"
        );
        if status != "204" {
            assert_eq!(
                example(status)["error"],
                status.parse::<u16>().expect("a status")
            );
        }
    }
    let declared = |status: &str, header: &str| !responses[status]["headers"][header].is_null();
    assert!(declared("401", "WWW-Authenticate"));
    assert!(declared("405", "Allow"));
    assert!(declared("503", "Retry-After"));
}

/// Swagger UI shows the served document (examples included), and `/` leads a browser to it.
#[tokio::test]
async fn swagger_ui_carries_the_document_and_the_root_leads_to_it() {
    let app = spawn_app(Backend::Sqlite).await;
    let page = app.get("/docs").await.text().await.expect("HTML");
    assert!(page.contains("No plant with id 42 exists."));

    let no_redirects = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("a client");
    let root = no_redirects
        .get(format!("{}/", app.address))
        .send()
        .await
        .expect("answer");
    assert_eq!(root.status(), reqwest::StatusCode::SEE_OTHER);
    assert_eq!(root.headers()["location"], "/docs");
    let delete_root = app
        .client
        .delete(format!("{}/", app.address))
        .send()
        .await
        .expect("answer");
    assert_eq!(delete_root.headers()["allow"], "GET");
    crate::helpers::assert_error(delete_root, reqwest::StatusCode::METHOD_NOT_ALLOWED).await;
}

fn keys(value: &Value) -> Vec<String> {
    let mut keys: Vec<String> = value
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    keys.sort();
    keys
}

/// (name, in, required, type, format) of each parameter.
fn parameters(operation: &Value) -> Vec<Value> {
    let mut params: Vec<Value> = operation["parameters"]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|p| {
                    json!([
                        p["name"],
                        p["in"],
                        p["required"],
                        p["schema"]["type"],
                        p["schema"]["format"]
                    ])
                })
                .collect()
        })
        .unwrap_or_default();
    params.sort_by_key(Value::to_string);
    params
}

/// The operation's own security, else the document's.
fn security<'a>(document: &'a Value, operation: &'a Value) -> &'a Value {
    if operation["security"].is_null() {
        &document["security"]
    } else {
        &operation["security"]
    }
}

/// The JSON body schema of a response, with references resolved and descriptions dropped,
/// or `null` when the response has no body. A missing response is `"missing"`.
fn body_schema(document: &Value, response: &Value) -> Value {
    if response.is_null() {
        return json!("missing");
    }
    let content = &response["content"];
    if content.is_null() {
        return Value::Null;
    }
    assert_eq!(
        keys(content),
        ["application/json"],
        "errors are application/json only"
    );
    normalize(document, &content["application/json"]["schema"])
}

fn normalize(document: &Value, schema: &Value) -> Value {
    if let Some(reference) = schema["$ref"].as_str() {
        let pointer = reference.trim_start_matches('#');
        return normalize(
            document,
            document.pointer(pointer).expect("the reference resolves"),
        );
    }
    let mut required: Vec<String> = schema["required"]
        .as_array()
        .map(|r| {
            r.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    required.sort();
    let properties: serde_json::Map<String, Value> = schema["properties"]
        .as_object()
        .map(|props| {
            props
                .iter()
                .map(|(name, prop)| (name.clone(), normalize(document, prop)))
                .collect()
        })
        .unwrap_or_default();
    json!({ "type": schema["type"], "format": schema["format"], "required": required, "properties": properties })
}

#[tokio::test]
async fn the_idempotency_key_and_its_answers_are_declared() {
    let app = spawn_app(Backend::Sqlite).await;
    let served: Value = app.get("/openapi.json").await.json().await.expect("JSON");
    let operation = &served["paths"]["/plants/{id}"]["delete"];

    let key = operation["parameters"]
        .as_array()
        .and_then(|list| list.iter().find(|p| p["name"] == "Idempotency-Key"))
        .expect("Idempotency-Key is declared");
    assert_eq!(
        (&key["in"], &key["required"]),
        (&json!("header"), &json!(false))
    );
    assert_eq!(key["schema"]["minLength"], 1);
    assert_eq!(key["schema"]["maxLength"], 512);
    assert!(key["schema"]["pattern"].is_string());
    let replayed = &operation["responses"]["204"]["headers"]["Idempotent-Replayed"];
    assert_eq!(replayed["schema"]["type"], "boolean");
    let reused = &operation["responses"]["422"]["content"]["application/json"]["example"];
    assert_eq!(reused["error"], 422);
}

/// The connection limits (`src/connection_limits.rs`, `head`) take the bytes after a head as
/// its body only until the server starts answering; an operation that read a body would let
/// hyper write `100 Continue` mid-body, and the rest of the body would be scanned as the
/// next head. An operation that gains a body fails here: the scanner must learn bodies first.
#[tokio::test]
async fn no_operation_reads_a_request_body() {
    let app = spawn_app(Backend::Sqlite).await;
    let served: Value = app.get("/openapi.json").await.json().await.expect("JSON");
    let operations: Vec<(&String, &Value)> = served["paths"]
        .as_object()
        .expect("paths")
        .values()
        .flat_map(|methods| methods.as_object().expect("methods"))
        .collect();
    assert!(!operations.is_empty(), "the check sees the operations");
    for (method, operation) in operations {
        assert!(
            operation.get("requestBody").is_none(),
            "{method} {} reads a body",
            operation["operationId"]
        );
    }
}
