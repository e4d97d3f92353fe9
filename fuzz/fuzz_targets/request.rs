//! `DELETE /plants/{id}` through the very app the binary serves (middleware, router, the
//! path's id parser, the `Authorization` parser, the request-id check, `Idempotency-Key`),
//! on a SQLite file in memory-backed /dev/shm: every answer is the one the README's table
//! gives, in the `Error` shape, with a request id; never a 500 or a panic.
#![no_main]

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, LazyLock, Mutex},
};

use clap::Parser;
use libfuzzer_sys::fuzz_target;
use plantstore::{
    auth::tokens,
    cli::Cli,
    database,
    http::{self, Documents, idempotency_key},
    state::AppState,
    telemetry::Metrics,
};
use poem::{
    Endpoint, EndpointExt, Request, Response,
    endpoint::BoxEndpoint,
    http::{Method, StatusCode, header},
};

/// Plants 1 to this many exist when fuzzing starts.
const SEEDED: i64 = 1000;

struct Service {
    runtime: tokio::runtime::Runtime,
    app: BoxEndpoint<'static, Response>,
    token: String,
    deleted: Mutex<HashSet<i64>>,
    /// Each idempotency key that deleted a plant, and that plant.
    keys: Mutex<HashMap<String, i64>>,
}

static SERVICE: LazyLock<Service> = LazyLock::new(|| {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let dir = format!("/dev/shm/plantstore-fuzz-{}", std::process::id());
    std::fs::create_dir_all(&dir).expect("a folder in /dev/shm");
    let url = format!("sqlite://{dir}/fuzz.db?mode=rwc");
    let cli = Cli::try_parse_from(["plantstore", "--database-url", &url]).expect("settings");
    let (app, token) = runtime.block_on(async {
        let store = database::open(&cli.config, None)
            .await
            .expect("the store opens");
        store.seed_plants(SEEDED).await.expect("seed");
        let token = tokens::create(store.as_ref(), "fuzz", None)
            .await
            .expect("a token");
        let metrics = Arc::new(Metrics::new().expect("metrics"));
        let state = AppState::new(store, &cli.config.serve, metrics, None);
        let documents = Documents::render().expect("the document renders");
        (
            http::build(state, &documents, &cli.config.serve).boxed(),
            token,
        )
    });
    Service {
        runtime,
        app,
        token,
        deleted: Mutex::new(HashSet::new()),
        keys: Mutex::new(HashMap::new()),
    }
});

#[derive(Debug, arbitrary::Arbitrary)]
enum Auth {
    Valid,
    Absent,
    Raw(Vec<u8>),
    Bearer(String),
}

#[derive(Debug, arbitrary::Arbitrary)]
struct Input {
    /// The id as the server should decode it; sent percent-encoded byte by byte.
    id: Vec<u8>,
    auth: Auth,
    request_id: Option<Vec<u8>>,
    idempotency_key: Option<Vec<u8>>,
}

fuzz_target!(|input: Input| {
    let service = &*SERVICE;
    let path: String = input.id.iter().map(|b| format!("%{b:02X}")).collect();
    let mut request = Request::builder().method(Method::DELETE).uri(
        format!("/plants/{path}")
            .parse()
            .expect("a percent-encoded path is a URI"),
    );
    match &input.auth {
        Auth::Valid => {
            request = request.header(header::AUTHORIZATION, format!("Bearer {}", service.token))
        }
        Auth::Absent => {}
        Auth::Raw(raw) => request = request.header(header::AUTHORIZATION, raw.as_slice()),
        Auth::Bearer(text) => {
            request = request.header(header::AUTHORIZATION, format!("Bearer {text}"))
        }
    }
    if let Some(id) = &input.request_id {
        request = request.header("x-request-id", id.as_slice());
    }
    if let Some(key) = &input.idempotency_key {
        request = request.header(idempotency_key::HEADER, key.as_slice());
    }
    let request = request.finish();
    let sent_key = request
        .headers()
        .get(idempotency_key::HEADER)
        .map(|v| v.as_bytes().to_vec());
    if input.idempotency_key.is_some() && sent_key.is_none() {
        return;
    }
    // The key as the README defines it: `Err` for one the service must refuse.
    let key = sent_key.map(|raw| {
        std::str::from_utf8(&raw)
            .ok()
            .and_then(|text| idempotency_key::parse(text).ok())
            .map(|key| key.to_string())
            .ok_or(())
    });
    // A header value the HTTP crate refuses never reaches the server.
    let sent_auth = request.headers().contains_key(header::AUTHORIZATION);
    if matches!(input.auth, Auth::Raw(_) | Auth::Bearer(_)) && !sent_auth {
        return;
    }
    let sent_request_id = request
        .headers()
        .get("x-request-id")
        .map(|v| v.as_bytes().to_vec());

    let response = service
        .runtime
        .block_on(service.app.call(request))
        .expect("the app answers");
    let status = response.status();

    let mut expect_replayed = false;
    let expected = match (&input.auth, std::str::from_utf8(&input.id)) {
        _ if input.id.is_empty() => vec![StatusCode::NOT_FOUND],
        (Auth::Valid, Ok(text)) => match text.parse::<i64>() {
            Err(_) => vec![StatusCode::BAD_REQUEST],
            Ok(id) => match &key {
                Some(Err(())) => vec![StatusCode::BAD_REQUEST],
                Some(Ok(key)) => {
                    let mut keys = service.keys.lock().expect("not poisoned");
                    match keys.get(key) {
                        Some(&earlier) if earlier == id => {
                            expect_replayed = true;
                            vec![StatusCode::NO_CONTENT]
                        }
                        Some(_) => vec![StatusCode::UNPROCESSABLE_ENTITY],
                        None if delete_live(service, id) => {
                            keys.insert(key.clone(), id);
                            vec![StatusCode::NO_CONTENT]
                        }
                        None => vec![StatusCode::NOT_FOUND],
                    }
                }
                None if delete_live(service, id) => vec![StatusCode::NO_CONTENT],
                None => vec![StatusCode::NOT_FOUND],
            },
        },
        (Auth::Valid, Err(_)) => vec![StatusCode::BAD_REQUEST],
        _ => vec![StatusCode::UNAUTHORIZED],
    };
    assert!(
        expected.contains(&status),
        "{status} for {input:?}, expected {expected:?}"
    );

    let request_id = response
        .headers()
        .get("x-request-id")
        .expect("x-request-id")
        .as_bytes()
        .to_vec();
    match sent_request_id.filter(|id| sane(id)) {
        Some(sent) => assert_eq!(request_id, sent, "a sane request id is echoed"),
        None => assert_eq!(request_id.len(), 36, "a new UUID"),
    }
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .map(|v| v.as_bytes());
    let expected_header = expect_replayed.then_some(&b"true"[..]);
    assert_eq!(replayed, expected_header, "Idempotent-Replayed for {input:?}");
    if status == StatusCode::UNAUTHORIZED {
        assert!(response.headers().contains_key(header::WWW_AUTHENTICATE));
    }
    if status != StatusCode::NO_CONTENT {
        assert_eq!(
            response
                .headers()
                .get(header::CONTENT_TYPE)
                .map(|v| v.as_bytes()),
            Some(&b"application/json"[..])
        );
        let body = service
            .runtime
            .block_on(response.into_body().into_bytes())
            .expect("a body");
        let body: serde_json::Value = serde_json::from_slice(&body).expect("a JSON body");
        assert_eq!(body["error"], status.as_u16());
        assert!(body["message"].as_str().is_some_and(|m| m.ends_with('.')));
        assert_eq!(body.as_object().map(|o| o.len()), Some(2));
    }
});

/// Whether plant `id` is there to delete now (and, by the caller, will be gone after).
fn delete_live(service: &Service, id: i64) -> bool {
    (1..=SEEDED).contains(&id) && service.deleted.lock().expect("not poisoned").insert(id)
}

/// The README's rule for a request id the service keeps: 1 to 128 of `A-Z a-z 0-9 - _ . :`.
fn sane(id: &[u8]) -> bool {
    (1..=128).contains(&id.len())
        && id
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(b))
}
