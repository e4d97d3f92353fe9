//! The deletion log's admin commands: `plantstore deletions list | restore | prune`.

use std::time::Duration;

use anyhow::{Context, bail};
use chrono::{DateTime, Utc};
use clap::Subcommand;
use plantstore_store::{DeletionFilter, DeletionRecord, Store, time::before_now};

use super::output::{out, time};
use crate::{config::parse_duration, delivery::EntryJson, retention};

#[derive(Debug, Subcommand)]
pub enum DeletionsCommand {
    /// Show the deletion log, newest first: who deleted which plant when, with the
    /// request id and the Idempotency-Key
    List {
        /// Only the deletions of this plant id
        #[arg(long = "plant", value_name = "ID")]
        plant_id: Option<i64>,
        /// Only this caller's: a token name, or jwt:<subject>
        #[arg(long, value_name = "NAME")]
        caller: Option<String>,
        /// Only those of the last DURATION, such as 2h or 7d
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        since: Option<Duration>,
        /// At most this many entries
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(1..))]
        limit: i64,
        /// One JSON array instead of a table, with each deleted row's snapshot
        #[arg(long)]
        json: bool,
    },
    /// Put a deleted plant back from the log's snapshot of it, and mark the entry restored
    Restore {
        /// The log entry's id (the first column of `deletions list`)
        deletion_id: i64,
        /// Who restores it, kept in the log entry [default: the name of the user running
        /// this command, looked up from its uid as `id -un` does]
        #[arg(long, value_name = "NAME")]
        by: Option<String>,
    },
    /// Remove log entries older than DURATION; their Idempotency-Keys stop replaying
    Prune {
        /// Such as 90d or 12h
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        older_than: Duration,
    },
}

pub(super) async fn run(store: &dyn Store, command: DeletionsCommand) -> anyhow::Result<()> {
    match command {
        DeletionsCommand::List {
            plant_id,
            caller,
            since,
            limit,
            json,
        } => {
            let filter = DeletionFilter {
                plant_id,
                caller,
                since: since.map(ago).transpose()?,
                limit,
            };
            let entries = store.list_deletions(&filter).await?;
            if json {
                out!("{}", as_json(&entries)?);
            } else {
                print_table(&entries);
            }
        }
        DeletionsCommand::Restore { deletion_id, by } => {
            let by = by.unwrap_or_else(current_user);
            let by = by.trim();
            if by.is_empty() || by.len() > 128 {
                bail!("--by must name who restores, in 1 to 128 characters");
            }
            let plant_id = store
                .restore_deletion(deletion_id, by)
                .await
                .with_context(|| format!("cannot restore deletion {deletion_id}"))?;
            out!("restored plant {plant_id} from deletion {deletion_id}, by '{by}'");
        }
        DeletionsCommand::Prune { older_than } => {
            let pruned = retention::prune(store, ago(older_than)?, || async { Ok(true) }).await?;
            out!(
                "pruned {pruned} deletion log entries older than {}",
                humantime::format_duration(older_than)
            );
        }
    }
    Ok(())
}

/// The name of the user this process runs as, from its uid rather than `$USER`, which a
/// container (`docker compose exec`) or a cron job may not set; `uid N` if it has no name.
fn current_user() -> String {
    let uid = nix::unistd::getuid();
    match nix::unistd::User::from_uid(uid) {
        Ok(Some(user)) => user.name,
        _ => format!("uid {uid}"),
    }
}

fn ago(duration: Duration) -> anyhow::Result<DateTime<Utc>> {
    before_now(duration).context("the duration reaches back before any date the log can hold")
}

/// One entry of `list --json`, the snapshot as the database stored it.
#[derive(serde::Serialize)]
struct JsonEntry<'a> {
    id: i64,
    #[serde(flatten)]
    entry: EntryJson<'a>,
    restored_at: Option<String>,
    restored_by: Option<&'a str>,
}

fn as_json(entries: &[DeletionRecord]) -> serde_json::Result<String> {
    let entries: Vec<JsonEntry<'_>> = entries
        .iter()
        .map(|entry| JsonEntry {
            id: entry.id,
            entry: EntryJson::new(entry, time),
            restored_at: entry.restored_at.map(time),
            restored_by: entry.restored_by.as_deref(),
        })
        .collect();
    serde_json::to_string(&entries)
}

fn print_table(entries: &[DeletionRecord]) {
    out!(
        "{:<8} {:<20} {:<12} {:<20} {:<36} {:<24} RESTORED",
        "ID",
        "DELETED",
        "PLANT",
        "CALLER",
        "REQUEST ID",
        "IDEMPOTENCY KEY"
    );
    for entry in entries {
        let restored = match (&entry.restored_at, &entry.restored_by) {
            (Some(at), Some(by)) => format!("{} by {by}", time(*at)),
            (Some(at), None) => time(*at),
            _ if entry.snapshot.is_none() => "- (no snapshot)".to_owned(),
            _ => "-".to_owned(),
        };
        out!(
            "{:<8} {:<20} {:<12} {:<20} {:<36} {:<24} {restored}",
            entry.id,
            time(entry.deleted_at),
            entry.plant_id,
            entry.caller,
            entry.request_id,
            entry.idempotency_key.as_deref().unwrap_or("-"),
        );
    }
}
