//! `plantstore streams add | list | remove | enable | replay`: the NATS JetStream streams
//! deletion events are published to, managed as `webhooks` manages endpoints.

use anyhow::bail;
use clap::Subcommand;
use plantstore_store::{
    EndpointRecord, NewEndpoint, ReplayOutcome, Store, StoreError, StreamTarget,
};

use super::{
    output::{out, redacted, time},
    webhooks::{event_kinds, find_destination, names},
};
use crate::webhooks::{TargetUse, check_target, stored_url};

#[derive(Debug, Subcommand)]
pub enum StreamsCommand {
    /// Register a stream for the events committed from now on; prints its id. The stream
    /// must exist, capture PREFIX.> and hold no message there yet
    Add {
        /// The NATS server: nats://user:password@host:4222 (tls:// for TLS; a token as
        /// nats://token@host:4222)
        url: String,
        /// The JetStream stream the messages go to
        #[arg(long)]
        stream: String,
        /// Each message goes on subject PREFIX.<plant id>
        #[arg(long, default_value = "plantstore.plants")]
        subject_prefix: String,
        /// A comma list of plant.deleted and plant.restored
        #[arg(long, default_value = "plant.deleted,plant.restored")]
        events: String,
    },
    /// Show each stream destination: state, the last deletion log id published, pending
    /// events, the last error and the next attempt (credentials hidden)
    List {
        /// One JSON array instead of a table, times in RFC 3339 and null when unset
        #[arg(long)]
        json: bool,
    },
    /// Stop publishing to a stream and forget it
    Remove {
        /// The destination's id (the first column of `streams list`)
        id: i64,
    },
    /// Take a stream destination back: it publishes what it missed, from where it stopped
    Enable { id: i64 },
    /// Give a stream destination a new server URL or credentials; it goes on from where it
    /// got to, after the messages it published (the stream must exist and capture PREFIX.>)
    SetUrl {
        id: i64,
        /// The NATS server, as for `add`
        url: String,
    },
    /// Publish again from a deletion log entry on, into a stream that lost those messages
    /// (it must hold none under the prefix, as at `add`)
    Replay {
        id: i64,
        /// The deletion log id to start from (the first column of `deletions list`)
        #[arg(long = "from", value_name = "DELETION_ID")]
        from: i64,
    },
}

pub(super) async fn run(store: &dyn Store, command: StreamsCommand) -> anyhow::Result<()> {
    match command {
        StreamsCommand::Add {
            url,
            stream,
            subject_prefix,
            events,
        } => {
            check_prefix(&subject_prefix)?;
            let target = StreamTarget {
                stream,
                subject_prefix,
            };
            let url = stored_url(&url).map_err(anyhow::Error::msg)?;
            if let Err(err) = check_target(&url, &target, TargetUse::Add).await {
                bail!("{err}");
            }
            let destination = NewEndpoint {
                url,
                stream: Some(target.clone()),
                events: event_kinds(&events)?,
                secret: String::new(),
                http2: false,
            };
            let id = match store.add_endpoint(&destination).await {
                Err(StoreError::Duplicate) => bail!("{}", duplicate(&destination.url, &target)),
                added => added?,
            };
            out!(
                "added stream destination {id} for {}",
                names(&destination.events).join(",")
            );
        }
        StreamsCommand::List { json } => {
            let destinations: Vec<EndpointRecord> = store
                .list_endpoints()
                .await?
                .into_iter()
                .filter(|destination| destination.stream.is_some())
                .collect();
            if json {
                out!("{}", as_json(&destinations));
            } else {
                print_table(&destinations);
            }
        }
        StreamsCommand::Remove { id } => {
            find_destination(store, id, true).await?;
            store.remove_endpoint(id).await?;
            out!("removed stream destination {id}");
        }
        StreamsCommand::Enable { id } => {
            find_destination(store, id, true).await?;
            store.enable_endpoint(id).await?;
            out!("enabled stream destination {id}");
        }
        StreamsCommand::SetUrl { id, url } => {
            let destination = find_destination(store, id, true).await?;
            let url = stored_url(&url).map_err(anyhow::Error::msg)?;
            let Some(target) = &destination.stream else {
                bail!("no stream destination has id {id}");
            };
            if let Err(err) = check_target(&url, target, TargetUse::Moved).await {
                bail!("{err}");
            }
            match store.change_url(id, &url).await {
                Err(StoreError::Duplicate) => bail!("{}", duplicate(&url, target)),
                changed => changed?,
            }
            out!(
                "stream destination {id} publishes to {} from now on, from where it got to",
                redacted(&url)
            );
        }
        StreamsCommand::Replay { id, from } => {
            let destination = find_destination(store, id, true).await?;
            if let Some(target) = &destination.stream
                && let Err(err) = check_target(&destination.url, target, TargetUse::Replay).await
            {
                bail!("{err}");
            }
            match store.replay_endpoint(id, from).await? {
                ReplayOutcome::Done => {
                    out!(
                        "stream destination {id} publishes the events from deletion {from} on again"
                    );
                }
                ReplayOutcome::NoEndpoint => bail!("no stream destination has id {id}"),
                ReplayOutcome::NoEntry => bail!(
                    "no deletion log entry has id {from} (or, on PostgreSQL, it was logged before deletion events existed)"
                ),
            }
        }
    }
    Ok(())
}

/// Why a destination is refused as a duplicate.
fn duplicate(url: &str, target: &StreamTarget) -> String {
    format!(
        "a destination publishes to the stream {} under {}.> at {} already",
        target.stream,
        target.subject_prefix,
        redacted(url)
    )
}

/// A subject prefix is one or more dot-separated tokens, without wildcards or spaces.
fn check_prefix(prefix: &str) -> anyhow::Result<()> {
    let usable = |token: &str| {
        !token.is_empty()
            && !token
                .chars()
                .any(|c| c == '*' || c == '>' || c.is_whitespace())
    };
    if !prefix.split('.').all(usable) {
        bail!(
            "'{prefix}' is not a subject prefix such as plantstore.plants: dot-separated tokens, without * > or spaces"
        );
    }
    Ok(())
}

fn as_json(destinations: &[EndpointRecord]) -> serde_json::Value {
    destinations
        .iter()
        .map(|d| {
            let target = d.stream.as_ref();
            serde_json::json!({
                "id": d.id,
                "url": redacted(&d.url),
                "stream": target.map(|t| &t.stream),
                "subject_prefix": target.map(|t| &t.subject_prefix),
                "events": names(&d.events),
                "state": d.state.as_str(),
                "delivered_through": d.delivered_through,
                "pending": d.pending,
                "last_error": d.last_error,
                "next_attempt_at": d.next_attempt_at.map(time),
                "created_at": time(d.created_at),
            })
        })
        .collect()
}

fn print_table(destinations: &[EndpointRecord]) {
    out!(
        "{:<6} {:<9} {:<10} {:<8} {:<20} {:<16} {:<20} {:<32} LAST ERROR",
        "ID",
        "STATE",
        "DELIVERED",
        "PENDING",
        "NEXT ATTEMPT",
        "STREAM",
        "SUBJECTS",
        "URL"
    );
    for d in destinations {
        let Some(target) = &d.stream else { continue };
        out!(
            "{:<6} {:<9} {:<10} {:<8} {:<20} {:<16} {:<20} {:<32} {}",
            d.id,
            d.state.as_str(),
            d.delivered_through
                .map_or("-".to_owned(), |id| id.to_string()),
            d.pending,
            d.next_attempt_at.map_or("-".to_owned(), time),
            target.stream,
            format!("{}.>", target.subject_prefix),
            redacted(&d.url),
            d.last_error.as_deref().unwrap_or("-"),
        );
    }
}
