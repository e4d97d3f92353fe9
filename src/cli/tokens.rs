//! `plantstore token create | list | revoke`: the service's own API tokens.

use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::Subcommand;
use plantstore_store::{Store, TokenRecord};

use super::output::{self, out};
use crate::{auth::tokens as auth_tokens, config::parse_duration};

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token and print it once, alone on the last line
    Create {
        /// The token's name, shown in lists and in the audit row of each deletion: 1 to 64
        /// letters, digits, '.', '_' or '-'
        #[arg(long)]
        name: String,
        /// Lifetime such as 90d, 12h or 5s (default: never expires)
        #[arg(long, value_parser = parse_duration)]
        expires_in: Option<Duration>,
    },
    /// Show every token's name, creation, expiry and revocation (never the secret)
    List {
        /// One JSON array instead of a table, times in RFC 3339 and null when unset
        #[arg(long)]
        json: bool,
    },
    /// Make a token fail from now on
    Revoke {
        /// The name the token was created with
        name: String,
    },
}

pub(super) async fn run(store: &dyn Store, command: TokenCommand) -> anyhow::Result<()> {
    match command {
        TokenCommand::Create { name, expires_in } => {
            let token = auth_tokens::create(store, &name, expires_in).await?;
            out!("Created token '{name}'. It is shown only this once:");
            out!("{token}");
        }
        TokenCommand::List { json } => print_tokens(&store.list_tokens().await?, json),
        TokenCommand::Revoke { name } => {
            auth_tokens::revoke(store, &name).await?;
            out!("revoked token '{name}'");
        }
    }
    Ok(())
}

fn print_tokens(list: &[TokenRecord], json: bool) {
    let time = |at: Option<DateTime<Utc>>| at.map(output::time);
    if json {
        let rows: Vec<serde_json::Value> = list
            .iter()
            .map(|token| {
                serde_json::json!({
                    "name": token.name,
                    "created_at": time(Some(token.created_at)),
                    "expires_at": time(token.expires_at),
                    "revoked_at": time(token.revoked_at),
                })
            })
            .collect();
        out!("{}", serde_json::Value::Array(rows));
        return;
    }
    let shown = |at| time(at).unwrap_or_else(|| "-".to_owned());
    out!(
        "{:<24} {:<20} {:<20} {:<20}",
        "NAME",
        "CREATED",
        "EXPIRES",
        "REVOKED"
    );
    for token in list {
        out!(
            "{:<24} {:<20} {:<20} {:<20}",
            token.name,
            shown(Some(token.created_at)),
            shown(token.expires_at),
            shown(token.revoked_at)
        );
    }
}
