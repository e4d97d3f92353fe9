//! `plantstore webhooks add | set-url | rotate-secret`, and the commands every kind
//! shares (`destinations.rs`): the endpoints deletion events are POSTed to.

use anyhow::{Context, bail};
use chrono::Utc;
use clap::Subcommand;
use plantstore_store::{
    Store, StoreError,
    destinations::{DestinationKind, EventKind, EventKinds, NewEndpoint, WebhookTarget},
    time::storable_after,
};

use super::{
    destinations::{self, Kind, SharedCommand, found, names},
    output::{out, redacted, time},
};
use crate::delivery::signature::new_secret;

const KIND: Kind = Kind::Webhook;

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
    /// Give an endpoint a new URL (the receiver moved, or its credentials changed); it
    /// goes on from where it got to, with the same signing secret
    SetUrl {
        id: i64,
        /// Where events are POSTed from now on: an http:// or https:// URL
        url: String,
    },
    /// Give an endpoint a new signing secret, printed once, alone on the last line; during
    /// the overlap each request is signed with the old secret too
    RotateSecret {
        id: i64,
        /// How long the old secret still signs, such as 24h or 30m; 0s ends it at once
        #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
        overlap: std::time::Duration,
    },
    #[command(flatten)]
    Shared(SharedCommand),
}

pub(super) async fn run(store: &dyn Store, command: WebhooksCommand) -> anyhow::Result<()> {
    match command {
        WebhooksCommand::Add { url, events, http2 } => {
            let url = endpoint_url(&url)?;
            let secret = new_secret();
            let endpoint = NewEndpoint {
                kind: DestinationKind::Webhook(WebhookTarget {
                    url: url.clone(),
                    http2,
                    secrets: secret.clone(),
                }),
                events: event_kinds(&events)?,
            };
            let id = match store.add_endpoint(&endpoint).await {
                Err(StoreError::Duplicate) => {
                    bail!("an endpoint with the URL {} exists already", redacted(&url))
                }
                added => added?,
            };
            out!(
                "added webhook endpoint {id} for {}; its signing secret, shown only this once:",
                names(&endpoint.events).join(",")
            );
            out!("{secret}");
        }
        WebhooksCommand::SetUrl { id, url } => {
            let url = endpoint_url(&url)?;
            destinations::find(store, KIND, id).await?;
            match store.change_url(id, &url).await {
                Err(StoreError::Duplicate) => {
                    bail!("an endpoint with the URL {} exists already", redacted(&url))
                }
                changed => found(KIND, id, changed)?,
            }
            out!(
                "webhook endpoint {id} gets its events at {} from now on, from where it got to",
                redacted(&url)
            );
        }
        WebhooksCommand::RotateSecret { id, overlap } => {
            if storable_after(Utc::now(), overlap).is_none() {
                bail!("the overlap is too long: it would end after the year 9999");
            }
            destinations::find(store, KIND, id).await?;
            let secret = new_secret();
            let until = found(KIND, id, store.rotate_secret(id, &secret, overlap).await)?;
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
        WebhooksCommand::Shared(command) => destinations::run(store, KIND, command).await?,
    }
    Ok(())
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
