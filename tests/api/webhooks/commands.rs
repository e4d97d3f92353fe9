//! The endpoint commands as delivery feels them: enable after a 410, replay, prune,
//! remove, rotate-secret, and each refusal.

use super::*;
use crate::on_both_backends;

on_both_backends!(
    a_410_disables_the_endpoint_until_it_is_enabled,
    replay_sends_again_from_an_entry_with_the_same_ids,
    prune_keeps_what_an_endpoint_has_not_received,
    each_refused_command_is_one_clear_line,
    a_removed_endpoint_gets_nothing_more_and_its_id_is_never_reused,
    a_rotated_secret_signs_beside_the_old_one_until_the_overlap_ends,
    set_url_moves_delivery_on_from_where_it_got_and_no_password_is_printed,
);

async fn a_410_disables_the_endpoint_until_it_is_enabled(backend: Backend) {
    let receiver = Receiver::start(&[], Reply::Status(410)).await;
    let app = spawn(backend).await;
    let id = add_endpoint(&app, &receiver, &[]);
    app.add_plants(&[1, 2]).await;
    delete_all(&app, [1]).await;
    receiver
        .wait_for(WITHIN, "one 410", |got| !got.is_empty())
        .await;
    let endpoint = wait_for_endpoint(&app, "the endpoint disabled", |endpoint| {
        endpoint["state"] == "disabled"
    })
    .await;
    assert!(
        endpoint["last_error"]
            .as_str()
            .unwrap_or_default()
            .contains("410"),
        "{endpoint}"
    );

    delete_all(&app, [2]).await;
    nothing_happens_within(Duration::from_secs(2)).await;
    assert_eq!(
        receiver.received().len(),
        1,
        "a disabled endpoint gets nothing"
    );

    receiver.set_default(Reply::Status(204));
    succeeded(&plantstore(&app, &["webhooks", "enable", &id.to_string()]));
    let expected = logged_ids(&app).await;
    receiver
        .wait_for(WITHIN, "both deletes after enable", |got| {
            let accepted: HashSet<String> = got
                .iter()
                .filter(|r| r.accepted)
                .map(|r| r.id.clone())
                .collect();
            accepted == expected
        })
        .await;
    assert_eq!(wait_until_nothing_pending(&app).await["state"], "active");
}

async fn replay_sends_again_from_an_entry_with_the_same_ids(backend: Backend) {
    let receiver = Receiver::start(&[], Reply::Status(204)).await;
    let app = spawn(backend).await;
    let id = add_endpoint(&app, &receiver, &[]);
    app.add_plants(&[1, 2, 3]).await;
    for plant in [1, 2, 3] {
        delete_all(&app, [plant]).await;
    }
    receiver
        .wait_for(WITHIN, "three deletes", |got| got.len() == 3)
        .await;
    wait_until_nothing_pending(&app).await;
    let first_round = receiver.accepted();

    // Refused for a while, so the list can be read before the replay delivers anything.
    receiver.set_default(Reply::Status(503));
    let entries = app.db.deletion_ids().await;
    succeeded(&plantstore(
        &app,
        &[
            "webhooks",
            "replay",
            &id.to_string(),
            "--from",
            &entries[1].to_string(),
        ],
    ));
    let replaying = wait_for_endpoint(&app, "the replay failing", |endpoint| {
        endpoint["last_error"].is_string()
    })
    .await;
    assert!(
        replaying["delivered_through"].is_null(),
        "a replay starts delivered_through again: {replaying}"
    );
    receiver.set_default(Reply::Status(204));
    receiver
        .wait_for(WITHIN, "two replayed", |got| {
            got.iter().filter(|r| r.accepted).count() >= 5
        })
        .await;
    wait_until_nothing_pending(&app).await;
    let got = receiver.accepted();
    assert_eq!(got.len(), 5, "{got:#?}");
    // Different plants may arrive in either order; each repeat is the same event.
    let mut replayed: Vec<&str> = got[3..].iter().map(|r| r.id.as_str()).collect();
    replayed.sort_unstable();
    let from_second: Vec<String> = entries[1..]
        .iter()
        .map(|id| format!("deletion_{id}"))
        .collect();
    assert_eq!(replayed, from_second);
    for again in &got[3..] {
        let before = first_round
            .iter()
            .find(|r| r.id == again.id)
            .expect("sent before");
        assert_eq!(again.body, before.body);
    }
}

async fn prune_keeps_what_an_endpoint_has_not_received(backend: Backend) {
    let receiver = Receiver::start(&[], Reply::Status(500)).await;
    let app = spawn(backend).await;
    add_endpoint(&app, &receiver, &[]);
    app.add_plants(&[1, 2, 3]).await;
    delete_all(&app, [1, 2, 3]).await;
    receiver
        .wait_for(WITHIN, "a failed attempt", |got| !got.is_empty())
        .await;
    wait_for_endpoint(&app, "the failure saved", |endpoint| {
        endpoint["last_error"].is_string()
    })
    .await;

    let pruned = succeeded(&plantstore(
        &app,
        &["deletions", "prune", "--older-than", "0s"],
    ));
    assert!(pruned.starts_with("pruned 0 "), "{pruned}");
    assert_eq!(app.db.deletion_ids().await.len(), 3);

    receiver.set_default(Reply::Status(204));
    wait_until_nothing_pending(&app).await;
    succeeded(&plantstore(
        &app,
        &["deletions", "prune", "--older-than", "0s"],
    ));
    // SQLite keeps its newest entry, so ids never go back behind an endpoint's cursor.
    let left = app.db.deletion_ids().await.len();
    let kept = if backend == Backend::Sqlite { 1 } else { 0 };
    assert_eq!(left, kept);
}

async fn each_refused_command_is_one_clear_line(backend: Backend) {
    let receiver = Receiver::start(&[], Reply::Status(204)).await;
    let app = spawn(backend).await;
    let id = add_endpoint(&app, &receiver, &[]).to_string();
    let refusals = [
        (
            vec!["webhooks", "add", "ftp://example.com/x"],
            "a webhook URL must be http:// or https://",
        ),
        (vec!["webhooks", "add", "not a url"], "not a URL such as"),
        (
            vec!["webhooks", "set-url", "999", "https://example.com/x"],
            "no webhook endpoint has id 999",
        ),
        (
            vec!["webhooks", "set-url", &id, "ftp://example.com/x"],
            "a webhook URL must be http:// or https://",
        ),
        (
            vec!["webhooks", "add", receiver.url.as_str()],
            "exists already",
        ),
        (
            vec![
                "webhooks",
                "add",
                "https://example.com/x",
                "--events",
                "plant.eaten",
            ],
            "unknown event type 'plant.eaten'",
        ),
        (
            vec!["webhooks", "remove", "999"],
            "no webhook endpoint has id 999",
        ),
        (
            vec!["webhooks", "enable", "999"],
            "no webhook endpoint has id 999",
        ),
        (
            vec!["webhooks", "replay", &id, "--from", "999"],
            "no deletion log entry has id 999",
        ),
        (
            vec!["webhooks", "rotate-secret", "999"],
            "no webhook endpoint has id 999",
        ),
        (
            vec![
                "webhooks",
                "rotate-secret",
                &id,
                "--overlap",
                "1000000years",
            ],
            "the overlap is too long",
        ),
        // Past 9999, SQLite's times as text (`+10027-…`) would sort before today's.
        (
            vec!["webhooks", "rotate-secret", &id, "--overlap", "8000years"],
            "the overlap is too long",
        ),
    ];
    for (args, says) in refusals {
        let line = refused(&plantstore(&app, &args));
        assert!(line.contains(says), "{args:?}: {line}");
    }
    assert_eq!(endpoints(&app).len(), 1);
    succeeded(&plantstore(&app, &["webhooks", "remove", &id]));
    assert!(endpoints(&app).is_empty());
}

/// Removing an endpoint stops its delivery; an endpoint added after it gets a new id (on
/// SQLite too, where the removed one's id was handed out again) and its own events, none
/// of which go to the removed URL.
async fn a_removed_endpoint_gets_nothing_more_and_its_id_is_never_reused(backend: Backend) {
    let (removed, added) = (
        Receiver::start(&[], Reply::Status(204)).await,
        Receiver::start(&[], Reply::Status(204)).await,
    );
    let app = spawn(backend).await;
    let first = add_endpoint(&app, &removed, &[]);
    app.add_plants(&(1..=41).collect::<Vec<_>>()).await;
    delete_all(&app, 1..=5).await;
    removed
        .wait_for(WITHIN, "the first endpoint's events", |got| got.len() >= 5)
        .await;

    succeeded(&plantstore(
        &app,
        &["webhooks", "remove", &first.to_string()],
    ));
    let second = add_endpoint(&app, &added, &[]);
    assert!(second > first, "ids {first} then {second}");
    // The round of lease claims that starts the new endpoint's delivery has stopped the
    // removed one's: once a delete reaches the new endpoint, the removed URL is done.
    delete_all(&app, [41]).await;
    added
        .wait_for(WITHIN, "the new endpoint's first event", |got| {
            !got.is_empty()
        })
        .await;
    let before = removed.received().len();
    delete_all(&app, 6..=40).await;
    added
        .wait_for(WITHIN, "the new endpoint's events", |got| {
            got.iter().filter(|r| r.accepted).count() >= 36
        })
        .await;
    wait_until_nothing_pending(&app).await;
    assert_eq!(removed.received().len(), before, "the removed URL got more");
    assert!(added.received().iter().all(|r| r.verified));
}

/// `rotate-secret` prints the new secret alone on its last line; until the overlap ends
/// every request carries a signature by each secret, so a receiver verifies with either;
/// `--overlap 0s` ends the old one at once. `webhooks list` shows when the overlap ends.
async fn a_rotated_secret_signs_beside_the_old_one_until_the_overlap_ends(backend: Backend) {
    let receiver = Receiver::start(&[], Reply::Status(204)).await;
    let app = spawn(backend).await;
    let id = add_endpoint(&app, &receiver, &[]).to_string();
    let first_secret = receiver_secret(&receiver);
    assert!(endpoints(&app)[0]["previous_secret_until"].is_null());
    app.add_plants(&(1..=80).collect::<Vec<_>>()).await;
    let mut probes = 21..=80;

    let rotate = |overlap: &str| {
        let out = succeeded(&plantstore(
            &app,
            &["webhooks", "rotate-secret", &id, "--overlap", overlap],
        ));
        let secret = out.lines().last().expect("a secret line").to_owned();
        assert!(secret.starts_with("whsec_"), "{out}");
        (out, secret)
    };
    // Deletes `plants` once the instance took up the rotation; the requests for them.
    let delivered_after_rotation = |plants: std::ops::RangeInclusive<i64>| {
        let (app, receiver) = (&app, &receiver);
        async move {
            let before = receiver.received().len();
            let count = plants.clone().count();
            delete_all(app, plants).await;
            receiver
                .wait_for(WITHIN, "the events after the rotation", |got| {
                    got.len() >= before + count
                })
                .await;
            receiver.received().split_off(before)
        }
    };

    let (said, second_secret) = rotate("1h");
    assert!(said.contains("until"), "{said}");
    assert!(endpoints(&app)[0]["previous_secret_until"].is_string());
    until_delivery_follows(&app, &receiver, &mut probes, |request| {
        request.signed_with(&second_secret)
    })
    .await;
    for request in delivered_after_rotation(1..=10).await {
        assert_eq!(request.signature.split(' ').count(), 2, "{request:?}");
        assert!(request.signed_with(&first_secret), "{request:?}");
        assert!(request.signed_with(&second_secret), "{request:?}");
    }

    let (_, third_secret) = rotate("0s");
    assert!(endpoints(&app)[0]["previous_secret_until"].is_null());
    until_delivery_follows(&app, &receiver, &mut probes, |request| {
        request.signed_with(&third_secret) && !request.signed_with(&second_secret)
    })
    .await;
    for request in delivered_after_rotation(11..=20).await {
        assert_eq!(request.signature.split(' ').count(), 1, "{request:?}");
        assert!(request.signed_with(&third_secret), "{request:?}");
        assert!(!request.signed_with(&second_secret), "{request:?}");
    }
}

/// Deletes plants from `probes`, one at a time, until the request for one is `taken_up`:
/// a running delivery follows a change to its endpoint at its next round of lease claims,
/// and no state shows when but the requests themselves.
async fn until_delivery_follows(
    app: &TestApp,
    receiver: &Receiver,
    probes: &mut std::ops::RangeInclusive<i64>,
    taken_up: impl Fn(&Received) -> bool,
) {
    let probes = std::cell::RefCell::new(probes);
    eventually(WITHIN, "the delivery following the change", || async {
        let probe = probes.borrow_mut().next().expect("a probe plant left");
        let before = receiver.received().len();
        delete_all(app, [probe]).await;
        receiver
            .wait_for(WITHIN, "a probe's event", |got| got.len() > before)
            .await;
        receiver
            .received()
            .last()
            .is_some_and(&taken_up)
            .then_some(())
    })
    .await;
}

/// A receiver that moved: `set-url` sends the events from where the endpoint got to, to
/// the new URL only, signed with the same secret. A password in a URL is never printed:
/// not by `add`, `list` or `set-url`, nor in a refusal.
async fn set_url_moves_delivery_on_from_where_it_got_and_no_password_is_printed(backend: Backend) {
    let old = Receiver::start(&[], Reply::Status(204)).await;
    let moved = Receiver::start(&[], Reply::Status(204)).await;
    let app = spawn(backend).await;
    let id = add_endpoint(&app, &old, &[]).to_string();
    moved.verify_with(&receiver_secret(&old));
    delete_and_await_delivery(&app, &old, 5).await;
    wait_until_nothing_pending(&app).await;
    let before = logged_ids(&app).await;

    let with_password = |url: &str| url.replacen("http://", "http://ops:pa55word@", 1);
    let out = succeeded(&plantstore(
        &app,
        &["webhooks", "set-url", &id, &with_password(&moved.url)],
    ));
    assert!(out.contains(&id) && !out.contains("pa55word"), "{out}");
    // The delivery follows the change at its next round of lease claims: until then a
    // probe's event may still go to the old URL.
    let probes: Vec<i64> = (100..=140).collect();
    app.add_plants(&probes).await;
    let mut probes = probes.into_iter();
    eventually(WITHIN, "the delivery following the new URL", || {
        let probe = probes.next().expect("a probe plant left");
        let (at_old, at_moved) = (old.received().len(), moved.received().len());
        let (old, moved, app) = (&old, &moved, &app);
        async move {
            delete_all(app, [probe]).await;
            eventually(WITHIN, "the probe's event", || async {
                let (now_old, now_moved) = (old.received().len(), moved.received().len());
                (now_old + now_moved > at_old + at_moved).then_some(now_moved > at_moved)
            })
            .await
            .then_some(())
        }
    })
    .await;
    let old_had = old.received().len();
    let probed = logged_ids(&app).await;
    app.add_plants(&[6, 7, 8]).await;
    delete_all(&app, [6, 7, 8]).await;
    let after: HashSet<String> = logged_ids(&app)
        .await
        .difference(&probed)
        .cloned()
        .collect();
    wait_until_accepted(&moved, &after).await;
    let endpoint = wait_until_nothing_pending(&app).await;
    assert_eq!(old.received().len(), old_had, "nothing more at the old URL");
    let everywhere: HashSet<String> = accepted_ids(&old)
        .into_iter()
        .chain(accepted_ids(&moved))
        .collect();
    assert!(
        logged_ids(&app).await.is_subset(&everywhere),
        "every event delivered, at one URL or the other"
    );
    let at_moved: HashSet<String> = accepted_ids(&moved).into_iter().collect();
    assert!(
        at_moved.is_disjoint(&before),
        "nothing from before the move is sent again"
    );
    assert!(moved.received().iter().all(|r| r.verified));
    assert!(
        moved
            .received()
            .iter()
            .all(|r| r.authorization.starts_with("Basic ")),
        "the URL's credentials go as HTTP Basic"
    );

    let listed = [
        endpoint.to_string(),
        succeeded(&plantstore(&app, &["webhooks", "list"])),
    ];
    let added = plantstore(
        &app,
        &[
            "webhooks",
            "add",
            "https://user:pw-added@example.com:8443/hook",
        ],
    );
    let refused_add = plantstore(
        &app,
        &[
            "webhooks",
            "add",
            "https://user:pw-refused@example.com:99999/hook",
        ],
    );
    let refused_line = refused(&refused_add);
    for shown in listed.iter().chain([
        &succeeded(&added),
        &succeeded(&plantstore(&app, &["webhooks", "list", "--json"])),
        &refused_line,
    ]) {
        for password in ["pa55word", "pw-added", "pw-refused"] {
            assert!(!shown.contains(password), "{password} printed: {shown}");
        }
    }
}
