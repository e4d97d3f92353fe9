//! Several instances on one database: a revoked token is refused by every one of them
//! within a second, each having used (and so cached) it just before.

use std::time::{Duration, Instant};

use plantstore::auth::tokens;
use reqwest::StatusCode;

use crate::{
    helpers::{Backend, assert_error, eventually, serve_another, spawn_app, test_config},
    on_both_backends,
};

on_both_backends!(a_token_revoked_is_refused_by_every_instance_within_a_second);

const INSTANCES: usize = 3;

async fn a_token_revoked_is_refused_by_every_instance_within_a_second(backend: Backend) {
    let first = spawn_app(backend).await;
    let mut addresses = vec![first.address.clone()];
    for _ in 1..INSTANCES {
        addresses.push(serve_another(&test_config(&first.db.url)).await);
    }
    let store = plantstore::database::open(&test_config(&first.db.url), None)
        .await
        .expect("the store, as `plantstore token` opens it");
    let token = tokens::create(store.as_ref(), "fleet", None)
        .await
        .expect("token created");
    let delete_on = |address: &str| {
        first
            .delete_request_at(address, "99")
            .bearer_auth(&token)
            .send()
    };
    for address in &addresses {
        let answer = delete_on(address).await.expect("answer");
        assert_eq!(
            answer.status(),
            StatusCode::NOT_FOUND,
            "{address} takes the token"
        );
    }

    tokens::revoke(store.as_ref(), "fleet")
        .await
        .expect("revoked");
    let revoked_at = Instant::now();

    let refused_after = futures::future::join_all(addresses.iter().map(|address| async move {
        let what = format!("{address} refusing the revoked token");
        let (answer, after) = eventually(Duration::from_secs(1), &what, || async {
            let answer = delete_on(address).await.expect("answer");
            if answer.status() == StatusCode::UNAUTHORIZED {
                return Some((answer, revoked_at.elapsed()));
            }
            assert_eq!(answer.status(), StatusCode::NOT_FOUND);
            None
        })
        .await;
        assert_error(answer, StatusCode::UNAUTHORIZED).await;
        after
    }))
    .await;
    eprintln!("refused after {refused_after:?}");
    assert!(
        refused_after
            .iter()
            .all(|after| *after < Duration::from_secs(1))
    );
}
