//! What `webhooks` and `streams` share, written once for every kind of destination: list,
//! remove, enable and replay; each kind's `add` and `set-url` are in its own file.

use anyhow::bail;
use chrono::{DateTime, Utc};
use clap::Subcommand;
use plantstore_store::{
    Store, StoreError,
    destinations::{DestinationKind, EndpointRecord, EventKinds, ReplayOutcome, WebhookTarget},
};

use super::output::{out, redacted, time};
use crate::delivery::{TargetUse, check_target};

#[derive(Debug, Subcommand)]
pub enum SharedCommand {
    /// Show each one: state, the last deletion log id delivered, pending events, the last
    /// error and the next attempt (credentials in URLs hidden)
    List {
        /// One JSON array instead of a table, times in RFC 3339 and null when unset
        #[arg(long)]
        json: bool,
    },
    /// Stop delivering to it and forget it; what it had in flight is cancelled
    Remove {
        /// Its id (the first column of `list`)
        id: i64,
    },
    /// Take it back: it gets what it missed, from where it stopped
    Enable { id: i64 },
    /// Deliver again, from a deletion log entry on, with the same event ids (a stream must
    /// hold no message under its prefix, as at `add`)
    Replay {
        id: i64,
        /// The deletion log id to start from (the first column of `deletions list`)
        #[arg(long = "from", value_name = "DELETION_ID")]
        from: i64,
    },
}

/// Which command group asks, and so which destinations it manages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Webhook,
    Stream,
}

impl Kind {
    pub(super) fn noun(self) -> &'static str {
        match self {
            Kind::Webhook => "webhook endpoint",
            Kind::Stream => "stream destination",
        }
    }

    fn holds(self, destination: &EndpointRecord) -> bool {
        match destination.kind {
            DestinationKind::Webhook(_) => self == Kind::Webhook,
            DestinationKind::Stream(_) => self == Kind::Stream,
        }
    }
}

pub(super) async fn run(
    store: &dyn Store,
    kind: Kind,
    command: SharedCommand,
) -> anyhow::Result<()> {
    let noun = kind.noun();
    match command {
        SharedCommand::List { json } => {
            let destinations: Vec<EndpointRecord> = store
                .list_endpoints()
                .await?
                .into_iter()
                .filter(|destination| kind.holds(destination))
                .collect();
            if json {
                out!("{}", as_json(&destinations));
            } else {
                print_table(kind, &destinations);
            }
        }
        SharedCommand::Remove { id } => {
            find(store, kind, id).await?;
            found(kind, id, store.remove_endpoint(id).await)?;
            out!("removed {noun} {id}");
        }
        SharedCommand::Enable { id } => {
            find(store, kind, id).await?;
            found(kind, id, store.enable_endpoint(id).await)?;
            out!("enabled {noun} {id}");
        }
        SharedCommand::Replay { id, from } => {
            let destination = find(store, kind, id).await?;
            if let DestinationKind::Stream(target) = &destination.kind
                && let Err(err) = check_target(target, TargetUse::Replay).await
            {
                bail!("{err}");
            }
            match store.replay_endpoint(id, from).await? {
                ReplayOutcome::Done => match kind {
                    Kind::Webhook => {
                        out!("{noun} {id} gets the events from deletion {from} on again")
                    }
                    Kind::Stream => {
                        out!("{noun} {id} publishes the events from deletion {from} on again")
                    }
                },
                ReplayOutcome::NoEndpoint => bail!("no {noun} has id {id}"),
                ReplayOutcome::NoEntry => bail!(
                    "no deletion log entry has id {from} (or, on PostgreSQL, it was logged before deletion events existed)"
                ),
            }
        }
    }
    Ok(())
}

/// The destination with `id`, when it is of the kind the command group manages.
pub(super) async fn find(store: &dyn Store, kind: Kind, id: i64) -> anyhow::Result<EndpointRecord> {
    let found = store
        .list_endpoints()
        .await?
        .into_iter()
        .find(|destination| destination.id == id && kind.holds(destination));
    match found {
        Some(destination) => Ok(destination),
        None => bail!("no {} has id {id}", kind.noun()),
    }
}

/// What the store did to destination `id`, its `NotFound` told as such.
pub(super) fn found<T>(kind: Kind, id: i64, done: Result<T, StoreError>) -> anyhow::Result<T> {
    match done {
        Err(StoreError::NotFound) => bail!("no {} has id {id}", kind.noun()),
        done => Ok(done?),
    }
}

pub(super) fn names(kinds: &EventKinds) -> Vec<&'static str> {
    kinds.iter().map(|kind| kind.name()).collect()
}

/// When a webhook endpoint's old secret stops signing, while it still does.
fn overlap_ends(webhook: &WebhookTarget<Option<DateTime<Utc>>>) -> Option<DateTime<Utc>> {
    webhook.secrets.filter(|until| *until > Utc::now())
}

fn as_json(destinations: &[EndpointRecord]) -> serde_json::Value {
    destinations
        .iter()
        .map(|d| {
            let mut row = serde_json::json!({
                "id": d.id,
                "url": redacted(d.kind.url()),
                "events": names(&d.events),
                "state": d.state.as_str(),
                "delivered_through": d.delivered_through,
                "pending": d.pending,
                "last_error": d.last_error,
                "next_attempt_at": d.next_attempt_at.map(time),
                "created_at": time(d.created_at),
            });
            match &d.kind {
                DestinationKind::Stream(target) => {
                    row["stream"] = target.stream.clone().into();
                    row["subject_prefix"] = target.subject_prefix.clone().into();
                }
                DestinationKind::Webhook(webhook) => {
                    row["http2"] = webhook.http2.into();
                    row["previous_secret_until"] = overlap_ends(webhook).map(time).into();
                }
            }
            row
        })
        .collect()
}

fn print_table(kind: Kind, destinations: &[EndpointRecord]) {
    let (own, url_width) = match kind {
        Kind::Webhook => (format!("{:<20}", "OLD SECRET UNTIL"), 40),
        Kind::Stream => (format!("{:<16} {:<20}", "STREAM", "SUBJECTS"), 32),
    };
    out!(
        "{:<6} {:<9} {:<10} {:<8} {:<20} {own} {:<url_width$} LAST ERROR",
        "ID",
        "STATE",
        "DELIVERED",
        "PENDING",
        "NEXT ATTEMPT",
        "URL"
    );
    for d in destinations {
        let (own, url) = match &d.kind {
            DestinationKind::Stream(target) => (
                format!(
                    "{:<16} {:<20}",
                    target.stream,
                    format!("{}.>", target.subject_prefix)
                ),
                redacted(&target.url),
            ),
            DestinationKind::Webhook(webhook) => (
                format!("{:<20}", overlap_ends(webhook).map_or("-".to_owned(), time)),
                format!(
                    "{}{}",
                    redacted(&webhook.url),
                    if webhook.http2 { " (HTTP/2)" } else { "" }
                ),
            ),
        };
        out!(
            "{:<6} {:<9} {:<10} {:<8} {:<20} {own} {:<url_width$} {}",
            d.id,
            d.state.as_str(),
            d.delivered_through
                .map_or("-".to_owned(), |id| id.to_string()),
            d.pending,
            d.next_attempt_at.map_or("-".to_owned(), time),
            url,
            d.last_error.as_deref().unwrap_or("-"),
        );
    }
}
