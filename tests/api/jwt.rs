//! JWTs from an identity provider: HS256, RS256 and ES256 keys and a JWKS (keys made at
//! run time with openssl, the JWKS served by a local server), every way a JWT can be
//! wrong, the required scope, and the audit naming the JWT's subject.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use base64::Engine;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use reqwest::{StatusCode, header};
use serde_json::{Value, json};

use crate::{
    fixtures::jwks::JwksServer,
    helpers::{Backend, TestApp, TestDb, assert_error, spawn_app_on},
    on_both_backends,
};

on_both_backends!(an_hs256_jwt_deletes_and_the_audit_names_its_subject);

const ISSUER: &str = "https://id.example.com/";
const AUDIENCE: &str = "plantstore";

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

fn claims(sub: &str) -> Value {
    json!({ "sub": sub, "iss": ISSUER, "aud": AUDIENCE, "exp": now() + 3600, "iat": now() })
}

fn sign(algorithm: Algorithm, key: &EncodingKey, kid: Option<&str>, claims: &Value) -> String {
    let mut header = Header::new(algorithm);
    header.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&header, claims, key).expect("a signed JWT")
}

/// A key pair made by openssl: (private PEM, public PEM path).
struct KeyPair {
    private: Vec<u8>,
    public: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) -> String {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        output.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn key_pair(dir: &Path, name: &str, algorithm: &[&str]) -> KeyPair {
    let private = format!("{name}.pem");
    let public = format!("{name}.pub.pem");
    let mut generate = vec!["genpkey"];
    generate.extend_from_slice(algorithm);
    generate.extend_from_slice(&["-out", &private]);
    openssl(dir, &generate);
    openssl(dir, &["pkey", "-in", &private, "-pubout", "-out", &public]);
    KeyPair {
        private: std::fs::read(dir.join(&private)).expect("the private key"),
        public: dir.join(public),
    }
}

fn rsa(dir: &Path, name: &str) -> KeyPair {
    key_pair(
        dir,
        name,
        &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
    )
}

/// The public JWK of an RSA key pair, from openssl's modulus (the exponent is 65537).
fn rsa_jwk(dir: &Path, name: &str, kid: &str) -> Value {
    let modulus = openssl(
        dir,
        &["rsa", "-in", &format!("{name}.pem"), "-noout", "-modulus"],
    );
    let hex = modulus.trim().trim_start_matches("Modulus=");
    let bytes: Vec<u8> = (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex"))
        .collect();
    let n = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    json!({ "kty": "RSA", "kid": kid, "alg": "RS256", "use": "sig", "n": n, "e": "AQAB" })
}

async fn assert_invalid_token(app: &TestApp, token: &str, case: &str) {
    let answer = app.delete_with("1", Some(token)).await;
    assert_eq!(answer.status(), StatusCode::UNAUTHORIZED, "{case}");
    let challenge = answer.headers()[header::WWW_AUTHENTICATE]
        .to_str()
        .expect("ASCII")
        .to_owned();
    assert!(
        challenge.contains(r#"error="invalid_token""#),
        "{case}: {challenge}"
    );
    assert_error(answer, StatusCode::UNAUTHORIZED).await;
}

async fn an_hs256_jwt_deletes_and_the_audit_names_its_subject(backend: Backend) {
    let app = spawn_app_on(TestDb::new(backend).await, |config| {
        config.serve.jwt.jwt_secret =
            Some("a-long-shared-secret-for-hs256-tests".to_owned().into());
        config.serve.jwt.jwt_issuer = Some(ISSUER.into());
        config.serve.jwt.jwt_audience = Some(AUDIENCE.into());
    })
    .await;
    app.add_plants(&[1, 2]).await;
    let key = EncodingKey::from_secret(b"a-long-shared-secret-for-hs256-tests");
    let token = sign(Algorithm::HS256, &key, None, &claims("alice"));

    assert_eq!(
        app.delete_with("1", Some(&token)).await.status(),
        StatusCode::NO_CONTENT
    );
    // The second use is answered from the cache of verified tokens.
    assert_eq!(
        app.delete_with("2", Some(&token)).await.status(),
        StatusCode::NO_CONTENT
    );
    let audit = app.db.deletions(1).await;
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0].0, "jwt:alice");
    // The service's own tokens still work beside JWTs.
    app.add_plants(&[3]).await;
    assert_eq!(app.delete("3").await.status(), StatusCode::NO_CONTENT);
}

/// A JWT whose `exp` is the largest number it can hold is no crash: the verified-token
/// cache adds its leeway to that claim without overflowing (a debug build panicked there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwt_expiring_at_the_end_of_time_is_served_twice() {
    let app = spawn_app_on(TestDb::new(Backend::Sqlite).await, |config| {
        config.serve.jwt.jwt_secret =
            Some("a-long-shared-secret-for-hs256-tests".to_owned().into());
    })
    .await;
    app.add_plants(&[1, 2]).await;
    let key = EncodingKey::from_secret(b"a-long-shared-secret-for-hs256-tests");
    let token = sign(
        Algorithm::HS256,
        &key,
        None,
        &json!({ "sub": "forever", "exp": u64::MAX }),
    );

    let first = app.delete_with("1", Some(&token)).await.status();
    // Answered from the cache of verified tokens, where the leeway is added.
    let second = app.delete_with("2", Some(&token)).await.status();

    assert_eq!(
        (first, second),
        (StatusCode::NO_CONTENT, StatusCode::NO_CONTENT)
    );
    assert!(!app.db.plant_exists(1).await && !app.db.plant_exists(2).await);
    assert_eq!(app.db.deletions(2).await[0].0, "jwt:forever");
}

/// RS256 with a PEM public key: every way a JWT can be wrong is a 401 `invalid_token`,
/// including `alg: none` and HS256 signed with the public key as the secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_jwts_are_401_invalid_token() {
    let dir = tempfile::tempdir().expect("dir");
    let ours = rsa(dir.path(), "ours");
    let theirs = rsa(dir.path(), "theirs");
    let public = ours.public.clone();
    let app = spawn_app_on(TestDb::new(Backend::Sqlite).await, |config| {
        config.serve.jwt.jwt_public_key = Some(public);
        config.serve.jwt.jwt_issuer = Some(ISSUER.into());
        config.serve.jwt.jwt_audience = Some(AUDIENCE.into());
    })
    .await;
    app.add_plants(&[1]).await;
    let key = EncodingKey::from_rsa_pem(&ours.private).expect("our key");
    let other = EncodingKey::from_rsa_pem(&theirs.private).expect("their key");
    let with = |change: &dyn Fn(&mut Value)| {
        let mut claims = claims("mallory");
        change(&mut claims);
        claims
    };
    let b64 =
        |value: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(value.to_string());
    let public_pem = std::fs::read(&ours.public).expect("public PEM");

    let cases = [
        (
            "another key",
            sign(Algorithm::RS256, &other, None, &claims("mallory")),
        ),
        (
            "alg none",
            format!(
                "{}.{}.",
                b64(&json!({"alg": "none", "typ": "JWT"})),
                b64(&claims("mallory"))
            ),
        ),
        (
            "HS256 with the public key as secret",
            sign(
                Algorithm::HS256,
                &EncodingKey::from_secret(&public_pem),
                None,
                &claims("mallory"),
            ),
        ),
        (
            "expired",
            sign(
                Algorithm::RS256,
                &key,
                None,
                &with(&|c| c["exp"] = json!(now() - 3600)),
            ),
        ),
        (
            "not yet valid",
            sign(
                Algorithm::RS256,
                &key,
                None,
                &with(&|c| c["nbf"] = json!(now() + 3600)),
            ),
        ),
        (
            "wrong issuer",
            sign(
                Algorithm::RS256,
                &key,
                None,
                &with(&|c| c["iss"] = json!("https://evil.example.com/")),
            ),
        ),
        (
            "wrong audience",
            sign(
                Algorithm::RS256,
                &key,
                None,
                &with(&|c| c["aud"] = json!("someone-else")),
            ),
        ),
        (
            "no subject",
            sign(
                Algorithm::RS256,
                &key,
                None,
                &with(&|c| {
                    c.as_object_mut().map(|o| o.remove("sub"));
                }),
            ),
        ),
        ("not a JWT", "not.a.jwt".to_owned()),
    ];
    for (case, token) in &cases {
        assert_invalid_token(&app, token, case).await;
    }
    assert!(app.db.plant_exists(1).await);
    let good = sign(Algorithm::RS256, &key, None, &claims("bob"));
    assert_eq!(
        app.delete_with("1", Some(&good)).await.status(),
        StatusCode::NO_CONTENT
    );
}

/// ES256 with a PEM public key and a required scope: without it 403, with it (in `scp`
/// or `scope`) 204.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwt_without_the_required_scope_is_403() {
    let dir = tempfile::tempdir().expect("dir");
    let pair = key_pair(
        dir.path(),
        "ec",
        &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
    );
    let public = pair.public.clone();
    let app = spawn_app_on(TestDb::new(Backend::Sqlite).await, |config| {
        config.serve.jwt.jwt_public_key = Some(public);
        config.serve.jwt.jwt_required_scope = Some("plants:delete".into());
    })
    .await;
    app.add_plants(&[1, 2]).await;
    let key = EncodingKey::from_ec_pem(&pair.private).expect("EC key");
    let scoped = |scope: Value| {
        let mut claims = claims("carol");
        claims
            .as_object_mut()
            .expect("object")
            .extend(scope.as_object().expect("object").clone());
        sign(Algorithm::ES256, &key, None, &claims)
    };

    let forbidden = app
        .delete_with("1", Some(&scoped(json!({"scope": "plants:read"}))))
        .await;
    assert_error(forbidden, StatusCode::FORBIDDEN).await;
    assert!(app.db.plant_exists(1).await);
    let listed = scoped(json!({"scp": ["plants:read", "plants:delete"]}));
    assert_eq!(
        app.delete_with("1", Some(&listed)).await.status(),
        StatusCode::NO_CONTENT
    );
    let spaced = scoped(json!({"scope": "openid plants:delete"}));
    assert_eq!(
        app.delete_with("2", Some(&spaced)).await.status(),
        StatusCode::NO_CONTENT
    );
}

/// A JWKS served locally: a rotated key works without a restart, a key already known
/// keeps working while the JWKS is down, and an unknown key id does not make the service
/// fetch more than once every 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwks_keys_rotate_without_a_restart_and_survive_an_outage() {
    let dir = tempfile::tempdir().expect("dir");
    let first = rsa(dir.path(), "first");
    let second = rsa(dir.path(), "second");
    let jwks = JwksServer::start(json!({ "keys": [rsa_jwk(dir.path(), "first", "k1")] })).await;
    let url = jwks.url.clone();
    let app = spawn_app_on(TestDb::new(Backend::Sqlite).await, |config| {
        config.serve.jwt.jwks_url = Some(url);
    })
    .await;
    app.add_plants(&[1, 2, 3, 4]).await;
    assert_eq!(jwks.fetches(), 1, "fetched at start");
    let k1 = EncodingKey::from_rsa_pem(&first.private).expect("key 1");
    let k2 = EncodingKey::from_rsa_pem(&second.private).expect("key 2");

    let token = sign(Algorithm::RS256, &k1, Some("k1"), &claims("dave"));
    assert_eq!(
        app.delete_with("1", Some(&token)).await.status(),
        StatusCode::NO_CONTENT
    );

    jwks.serve(json!({ "keys": [rsa_jwk(dir.path(), "first", "k1"), rsa_jwk(dir.path(), "second", "k2")] }));
    let rotated = sign(Algorithm::RS256, &k2, Some("k2"), &claims("erin"));
    assert_eq!(
        app.delete_with("2", Some(&rotated)).await.status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(jwks.fetches(), 2, "fetched again for the new key id");

    jwks.down();
    let during_outage = sign(Algorithm::RS256, &k1, Some("k1"), &claims("frank"));
    assert_eq!(
        app.delete_with("3", Some(&during_outage)).await.status(),
        StatusCode::NO_CONTENT
    );
    let unknown = sign(Algorithm::RS256, &k2, Some("k3"), &claims("grace"));
    assert_invalid_token(&app, &unknown, "unknown key id").await;
    assert_eq!(jwks.fetches(), 2, "no fetch within 10 s of the last");
    assert_eq!(app.db.deletions(2).await[0].0, "jwt:erin");
}
