//! `plantstore webhooks add | list | remove | enable | replay`: the endpoints deletion
//! events are delivered to.

use anyhow::{Context, bail};
use chrono::{DateTime, SecondsFormat, Utc};
use clap::Subcommand;
use plantstore_store::{EndpointRecord, EventKind, ReplayOutcome, Store, StoreError};

use super::output::out;
use crate::webhooks::signature::new_secret;

const EVENT_KINDS: [EventKind; 2] = [EventKind::Deleted, EventKind::Restored];

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
    /// Deliver again, from a deletion log entry on, with the same webhook-ids
    Replay {
        id: i64,
        /// The deletion log id to start from (the first column of `deletions list`)
        #[arg(long = "from", value_name = "DELETION_ID")]
        from: i64,
    },
}

/// Runs one command against an open store; the caller closes it.
pub(super) async fn run(store: &dyn Store, command: WebhooksCommand) -> anyhow::Result<()> {
    match command {
        WebhooksCommand::Add { url, events } => {
            let url = endpoint_url(&url)?;
            let events = event_list(&events)?;
            let secret = new_secret();
            let id = match store.add_endpoint(&url, &events, &secret).await {
                Err(StoreError::Duplicate) => {
                    bail!("an endpoint with the URL {url} exists already")
                }
                added => added?,
            };
            out!(
                "added webhook endpoint {id} for {events}; its signing secret, shown only this once:"
            );
            out!("{secret}");
        }
        WebhooksCommand::List { json } => {
            let endpoints = store.list_endpoints().await?;
            if json {
                out!("{}", as_json(&endpoints)?);
            } else {
                print_table(&endpoints);
            }
        }
        WebhooksCommand::Remove { id } => {
            store
                .remove_endpoint(id)
                .await
                .map_err(|err| no_such(err, id))?;
            out!("removed webhook endpoint {id}");
        }
        WebhooksCommand::Enable { id } => {
            store
                .enable_endpoint(id)
                .await
                .map_err(|err| no_such(err, id))?;
            out!("enabled webhook endpoint {id}");
        }
        WebhooksCommand::Replay { id, from } => match store.replay_endpoint(id, from).await? {
            ReplayOutcome::Done => {
                out!("webhook endpoint {id} gets the events from deletion {from} on again");
            }
            ReplayOutcome::NoEndpoint => bail!("no webhook endpoint has id {id}"),
            ReplayOutcome::NoEntry => bail!(
                "no deletion log entry has id {from} (or, on PostgreSQL, it was logged before deletion events existed)"
            ),
        },
    }
    Ok(())
}

fn no_such(err: StoreError, id: i64) -> anyhow::Error {
    match err {
        StoreError::NotFound => anyhow::anyhow!("no webhook endpoint has id {id}"),
        other => other.into(),
    }
}

/// The URL as given, once it is an absolute http(s) URL with a host.
fn endpoint_url(text: &str) -> anyhow::Result<String> {
    let url = reqwest::Url::parse(text.trim())
        .with_context(|| format!("'{text}' is not a URL such as https://example.com/hooks"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        bail!(
            "a webhook URL must be http:// or https:// with a host, not '{}'",
            url.scheme()
        );
    }
    Ok(url.to_string())
}

/// The event types named, each once, in the order of `EVENT_KINDS`.
fn event_list(text: &str) -> anyhow::Result<String> {
    let asked: Vec<&str> = text
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    if let Some(unknown) = asked
        .iter()
        .find(|name| !EVENT_KINDS.iter().any(|kind| kind.name() == **name))
    {
        bail!(
            "unknown event type '{unknown}': use plant.deleted, plant.restored or both, comma-separated"
        );
    }
    let chosen: Vec<&str> = EVENT_KINDS
        .iter()
        .map(|kind| kind.name())
        .filter(|name| asked.contains(name))
        .collect();
    if chosen.is_empty() {
        bail!("--events names no event type: use plant.deleted, plant.restored or both");
    }
    Ok(chosen.join(","))
}

fn time(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

#[derive(serde::Serialize)]
struct JsonEndpoint<'a> {
    id: i64,
    url: &'a str,
    events: Vec<&'a str>,
    state: &'a str,
    delivered_through: Option<i64>,
    pending: i64,
    last_error: Option<&'a str>,
    next_attempt_at: Option<String>,
    created_at: String,
}

fn as_json(endpoints: &[EndpointRecord]) -> serde_json::Result<String> {
    let endpoints: Vec<JsonEndpoint<'_>> = endpoints
        .iter()
        .map(|e| JsonEndpoint {
            id: e.id,
            url: &e.url,
            events: e.events.split(',').collect(),
            state: &e.state,
            delivered_through: e.delivered_through,
            pending: e.pending,
            last_error: e.last_error.as_deref(),
            next_attempt_at: e.next_attempt_at.map(time),
            created_at: time(e.created_at),
        })
        .collect();
    serde_json::to_string(&endpoints)
}

fn print_table(endpoints: &[EndpointRecord]) {
    out!(
        "{:<6} {:<9} {:<10} {:<8} {:<20} {:<40} LAST ERROR",
        "ID",
        "STATE",
        "DELIVERED",
        "PENDING",
        "NEXT ATTEMPT",
        "URL"
    );
    for e in endpoints {
        out!(
            "{:<6} {:<9} {:<10} {:<8} {:<20} {:<40} {}",
            e.id,
            e.state,
            e.delivered_through
                .map_or("-".to_owned(), |id| id.to_string()),
            e.pending,
            e.next_attempt_at.map_or("-".to_owned(), time),
            e.url,
            e.last_error.as_deref().unwrap_or("-"),
        );
    }
}
