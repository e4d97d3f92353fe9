//! `plantstore streams add | set-url`, and the commands every kind shares
//! (`destinations.rs`): the NATS JetStream streams deletion events are published to.

use anyhow::bail;
use clap::Subcommand;
use plantstore_store::{
    Store, StoreError,
    destinations::{DestinationKind, NewEndpoint, StreamTarget},
};

use super::{
    destinations::{self, Kind, SharedCommand, names},
    output::{out, redacted},
    webhooks::event_kinds,
};
use crate::delivery::{TargetUse, check_target, stored_url};

const KIND: Kind = Kind::Stream;

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
    /// Give a stream destination a new server URL or credentials; it goes on from where it
    /// got to, after the messages it published (the stream must exist and capture PREFIX.>)
    SetUrl {
        id: i64,
        /// The NATS server, as for `add`
        url: String,
    },
    #[command(flatten)]
    Shared(SharedCommand),
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
                url: stored_url(&url).map_err(anyhow::Error::msg)?,
                stream,
                subject_prefix,
            };
            if let Err(err) = check_target(&target, TargetUse::Add).await {
                bail!("{err}");
            }
            let destination = NewEndpoint {
                kind: DestinationKind::Stream(target.clone()),
                events: event_kinds(&events)?,
            };
            let id = match store.add_endpoint(&destination).await {
                Err(StoreError::Duplicate) => bail!("{}", duplicate(&target)),
                added => added?,
            };
            out!(
                "added stream destination {id} for {}",
                names(&destination.events).join(",")
            );
        }
        StreamsCommand::SetUrl { id, url } => {
            let DestinationKind::Stream(old) = destinations::find(store, KIND, id).await?.kind
            else {
                bail!("no stream destination has id {id}");
            };
            let target = StreamTarget {
                url: stored_url(&url).map_err(anyhow::Error::msg)?,
                ..old
            };
            if let Err(err) = check_target(&target, TargetUse::Moved).await {
                bail!("{err}");
            }
            match store.change_url(id, &target.url).await {
                Err(StoreError::Duplicate) => bail!("{}", duplicate(&target)),
                changed => changed?,
            }
            out!(
                "stream destination {id} publishes to {} from now on, from where it got to",
                redacted(&target.url)
            );
        }
        StreamsCommand::Shared(command) => destinations::run(store, KIND, command).await?,
    }
    Ok(())
}

/// Why a destination is refused as a duplicate.
fn duplicate(target: &StreamTarget) -> String {
    format!(
        "a destination publishes to the stream {} under {}.> at {} already",
        target.stream,
        target.subject_prefix,
        redacted(&target.url)
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
