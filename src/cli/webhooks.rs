//! `plantstore webhooks add | list | remove | enable | replay | rotate-secret`: the
//! endpoints deletion events are delivered to.

use anyhow::{Context, bail};
use chrono::{DateTime, Utc};
use clap::Subcommand;
use plantstore_store::{
    EndpointRecord, EventKind, EventKinds, NewEndpoint, ReplayOutcome, Store, StoreError,
    time::storable_after,
};

use super::output::{out, redacted, time};
use crate::webhooks::signature::new_secret;

#[derive(Debug, Subcommand)]
pub enum WebhooksCommand {
    /// Register an endpoint for the events committed from now on; prints its id, and its
    /// signing secret once, alone on the last line
    Add {
        /// Where events are POSTed: an http:// or https:// URL
        url: String,
        /// A comma list of plant.deleted and plant.restored
        #[arg(long, default_value = "plant.deleted,plant.restored")]
        events: String,
        /// Speak HTTP/2 from the first byte to a plain-http receiver that serves it (https
        /// receivers are asked by ALPN, without this)
        #[arg(long)]
        http2: bool,
    },
    /// Show each endpoint: state, the last deletion log id delivered, pending events, the
    /// last error and the next attempt
    List {
        /// One JSON array instead of a table, times in RFC 3339 and null when unset
        #[arg(long)]
        json: bool,
    },
    /// Stop delivering to an endpoint and forget it
    Remove {
        /// The endpoint's id (the first column of `webhooks list`)
        id: i64,
    },
    /// Take a disabled endpoint back: it gets what it missed, from where it stopped
    Enable { id: i64 },
    /// Give an endpoint a new URL (the receiver moved, or its credentials changed); it
    /// goes on from where it got to, with the same signing secret
    SetUrl {
        id: i64,
        /// Where events are POSTed from now on: an http:// or https:// URL
        url: String,
    },
    /// Deliver again, from a deletion log entry on, with the same webhook-ids
    Replay {
        id: i64,
        /// The deletion log id to start from (the first column of `deletions list`)
        #[arg(long = "from", value_name = "DELETION_ID")]
        from: i64,
    },
    /// Give an endpoint a new signing secret, printed once, alone on the last line; during
    /// the overlap each request is signed with the old secret too
    RotateSecret {
        id: i64,
        /// How long the old secret still signs, such as 24h or 30m; 0s ends it at once
        #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
        overlap: std::time::Duration,
    },
}

pub(super) async fn run(store: &dyn Store, command: WebhooksCommand) -> anyhow::Result<()> {
    match command {
        WebhooksCommand::Add { url, events, http2 } => {
            let endpoint = NewEndpoint {
                url: endpoint_url(&url)?,
                stream: None,
                events: event_kinds(&events)?,
                secret: new_secret(),
                http2,
            };
            let id = match store.add_endpoint(&endpoint).await {
                Err(StoreError::Duplicate) => {
                    bail!(
                        "an endpoint with the URL {} exists already",
                        redacted(&endpoint.url)
                    )
                }
                added => added?,
            };
            out!(
                "added webhook endpoint {id} for {}; its signing secret, shown only this once:",
                names(&endpoint.events).join(",")
            );
            out!("{}", endpoint.secret);
        }
        WebhooksCommand::List { json } => {
            let endpoints: Vec<EndpointRecord> = store
                .list_endpoints()
                .await?
                .into_iter()
                .filter(|endpoint| endpoint.stream.is_none())
                .collect();
            if json {
                out!("{}", as_json(&endpoints));
            } else {
                print_table(&endpoints);
            }
        }
        WebhooksCommand::Remove { id } => {
            find_destination(store, id, false).await?;
            endpoint_found(id, store.remove_endpoint(id).await)?;
            out!("removed webhook endpoint {id}");
        }
        WebhooksCommand::Enable { id } => {
            find_destination(store, id, false).await?;
            endpoint_found(id, store.enable_endpoint(id).await)?;
            out!("enabled webhook endpoint {id}");
        }
        WebhooksCommand::SetUrl { id, url } => {
            let url = endpoint_url(&url)?;
            find_destination(store, id, false).await?;
            match store.change_url(id, &url).await {
                Err(StoreError::Duplicate) => {
                    bail!("an endpoint with the URL {} exists already", redacted(&url))
                }
                changed => endpoint_found(id, changed)?,
            }
            out!(
                "webhook endpoint {id} gets its events at {} from now on, from where it got to",
                redacted(&url)
            );
        }
        WebhooksCommand::Replay { id, from } => {
            find_destination(store, id, false).await?;
            match store.replay_endpoint(id, from).await? {
                ReplayOutcome::Done => {
                    out!("webhook endpoint {id} gets the events from deletion {from} on again");
                }
                ReplayOutcome::NoEndpoint => bail!("no webhook endpoint has id {id}"),
                ReplayOutcome::NoEntry => bail!(
                    "no deletion log entry has id {from} (or, on PostgreSQL, it was logged before deletion events existed)"
                ),
            }
        }
        WebhooksCommand::RotateSecret { id, overlap } => {
            if storable_after(Utc::now(), overlap).is_none() {
                bail!("the overlap is too long: it would end after the year 9999");
            }
            find_destination(store, id, false).await?;
            let secret = new_secret();
            let until = endpoint_found(id, store.rotate_secret(id, &secret, overlap).await)?;
            if overlap.is_zero() {
                out!("webhook endpoint {id} signs with its new secret alone from now on:");
            } else {
                out!(
                    "webhook endpoint {id} signs with its new and its old secret until {}; the new secret, shown only this once:",
                    time(until)
                );
            }
            out!("{secret}");
        }
    }
    Ok(())
}

/// What the store did to endpoint `id`, its `NotFound` told as such.
fn endpoint_found<T>(id: i64, done: Result<T, StoreError>) -> anyhow::Result<T> {
    match done {
        Err(StoreError::NotFound) => bail!("no webhook endpoint has id {id}"),
        done => Ok(done?),
    }
}

/// The destination with `id`, when it is a stream destination (`stream`) or a webhook
/// endpoint (not `stream`), as the command group asking manages.
pub(super) async fn find_destination(
    store: &dyn Store,
    id: i64,
    stream: bool,
) -> anyhow::Result<EndpointRecord> {
    let found = store
        .list_endpoints()
        .await?
        .into_iter()
        .find(|destination| destination.id == id && destination.stream.is_some() == stream);
    match found {
        Some(destination) => Ok(destination),
        None if stream => bail!("no stream destination has id {id}"),
        None => bail!("no webhook endpoint has id {id}"),
    }
}

/// The URL as given, once it is an absolute http(s) URL with a host.
fn endpoint_url(text: &str) -> anyhow::Result<String> {
    // The error leaves the text out: it may hold a password.
    let url =
        reqwest::Url::parse(text.trim()).context("not a URL such as https://example.com/hooks")?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        bail!(
            "a webhook URL must be http:// or https:// with a host, not '{}'",
            url.scheme()
        );
    }
    Ok(url.to_string())
}

/// The event types a comma list names.
pub(super) fn event_kinds(text: &str) -> anyhow::Result<EventKinds> {
    let chosen = text
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|name| {
            EventKind::from_name(name).with_context(|| {
                format!("unknown event type '{name}': use plant.deleted, plant.restored or both, comma-separated")
            })
        })
        .collect::<anyhow::Result<EventKinds>>()?;
    if chosen.is_empty() {
        bail!("--events names no event type: use plant.deleted, plant.restored or both");
    }
    Ok(chosen)
}

pub(super) fn names(kinds: &EventKinds) -> Vec<&'static str> {
    kinds.iter().map(|kind| kind.name()).collect()
}

/// When the old secret stops signing, while it still does.
fn overlap_ends(endpoint: &EndpointRecord) -> Option<DateTime<Utc>> {
    endpoint
        .previous_secret_until
        .filter(|until| *until > Utc::now())
}

fn as_json(endpoints: &[EndpointRecord]) -> serde_json::Value {
    endpoints
        .iter()
        .map(|e| {
            serde_json::json!({
                "id": e.id,
                "url": redacted(&e.url),
                "events": names(&e.events),
                "state": e.state.as_str(),
                "http2": e.http2,
                "previous_secret_until": overlap_ends(e).map(time),
                "delivered_through": e.delivered_through,
                "pending": e.pending,
                "last_error": e.last_error,
                "next_attempt_at": e.next_attempt_at.map(time),
                "created_at": time(e.created_at),
            })
        })
        .collect()
}

fn print_table(endpoints: &[EndpointRecord]) {
    out!(
        "{:<6} {:<9} {:<10} {:<8} {:<20} {:<20} {:<40} LAST ERROR",
        "ID",
        "STATE",
        "DELIVERED",
        "PENDING",
        "NEXT ATTEMPT",
        "OLD SECRET UNTIL",
        "URL"
    );
    for e in endpoints {
        let url = format!(
            "{}{}",
            redacted(&e.url),
            if e.http2 { " (HTTP/2)" } else { "" }
        );
        out!(
            "{:<6} {:<9} {:<10} {:<8} {:<20} {:<20} {:<40} {}",
            e.id,
            e.state.as_str(),
            e.delivered_through
                .map_or("-".to_owned(), |id| id.to_string()),
            e.pending,
            e.next_attempt_at.map_or("-".to_owned(), time),
            overlap_ends(e).map_or("-".to_owned(), time),
            url,
            e.last_error.as_deref().unwrap_or("-"),
        );
    }
}
