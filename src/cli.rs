//! The `plantstore` command line: its commands, and what each one does.

use std::time::Duration;

use chrono::SecondsFormat;
use clap::{Parser, Subcommand};

use crate::{
    api,
    config::{Config, parse_duration},
    startup::{self, Application},
    tokens,
};

#[derive(Debug, Parser)]
#[command(
    name = "plantstore",
    version,
    about = "The Plant Store service and its admin commands"
)]
pub struct Cli {
    #[command(flatten)]
    pub config: Config,

    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the service (the default)
    Serve,
    /// Apply migrations and exit
    Migrate,
    /// Print the OpenAPI document the service serves
    Openapi {
        /// json (as /openapi.json) or yaml (as /openapi.yaml)
        #[arg(long, value_enum, default_value_t = DocumentFormat::Json)]
        format: DocumentFormat,
    },
    /// Manage API tokens
    #[command(subcommand)]
    Token(TokenCommand),
    /// Insert demo plants 1..=COUNT that are missing
    Seed {
        #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
        count: i64,
    },
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum DocumentFormat {
    Json,
    Yaml,
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token and print it once, alone on the last line
    Create {
        #[arg(long)]
        name: String,
        /// Lifetime such as 90d, 12h or 5s (default: never expires)
        #[arg(long, value_parser = parse_duration)]
        expires_in: Option<Duration>,
    },
    /// Show every token's name, creation, expiry and revocation (never the secret)
    List,
    /// Make a token fail from now on
    Revoke { name: String },
}

impl Cli {
    pub async fn run(self) -> anyhow::Result<()> {
        let config = self.config;
        match self.command.unwrap_or(Command::Serve) {
            Command::Serve => serve(&config).await,
            Command::Migrate => {
                let mut config = config;
                config.migrate = true;
                startup::open_store(&config).await?.close().await;
                println!("migrations applied");
                Ok(())
            }
            Command::Openapi { format } => {
                let document = api::document();
                match format {
                    DocumentFormat::Json => println!("{document:#}"),
                    DocumentFormat::Yaml => print!("{}", serde_yaml::to_string(&document)?),
                }
                Ok(())
            }
            Command::Token(command) => token(&config, command).await,
            Command::Seed { count } => {
                let store = startup::open_store(&config).await?;
                let added = store.seed_plants(count).await;
                store.close().await;
                println!("added {} missing demo plants with ids 1..={count}", added?);
                Ok(())
            }
        }
    }
}

async fn serve(config: &Config) -> anyhow::Result<()> {
    // Listening for signals from the start: a SIGTERM while connecting or migrating stops
    // cleanly too (as PID 1 in a container, an unhandled one would be ignored).
    let shutdown = startup::shutdown_signal();
    tokio::pin!(shutdown);
    let app = tokio::select! {
        built = Application::build(config) => built?,
        () = &mut shutdown => return Ok(()),
    };
    let address = app.address();
    let shown_host = if address.ip().is_unspecified() {
        "localhost".to_owned()
    } else {
        address.ip().to_string()
    };
    if let Some(token) = app.initial_token() {
        println!(
            "Created the first API token, named 'initial'. It is shown only this once; keep it:"
        );
        println!("{token}");
    }
    println!(
        "Plant Store listening on http://{shown_host}:{}",
        address.port()
    );
    println!("Swagger UI: http://{shown_host}:{}/docs", address.port());
    app.run_until_stopped(shutdown).await?;
    tracing::info!("stopped");
    Ok(())
}

async fn token(config: &Config, command: TokenCommand) -> anyhow::Result<()> {
    let store = startup::open_store(config).await?;
    let outcome = match command {
        TokenCommand::Create { name, expires_in } => {
            tokens::create(store.as_ref(), &name, expires_in)
                .await
                .map(|token| {
                    println!("Created token '{name}'. It is shown only this once:");
                    println!("{token}");
                })
        }
        TokenCommand::List => store.list_tokens().await.map_err(Into::into).map(|list| {
            println!(
                "{:<24} {:<20} {:<20} {:<20}",
                "NAME", "CREATED", "EXPIRES", "REVOKED"
            );
            let time = |at: Option<chrono::DateTime<chrono::Utc>>| {
                at.map_or_else(
                    || "-".to_owned(),
                    |at| at.to_rfc3339_opts(SecondsFormat::Secs, true),
                )
            };
            for token in list {
                println!(
                    "{:<24} {:<20} {:<20} {:<20}",
                    token.name,
                    time(Some(token.created_at)),
                    time(token.expires_at),
                    time(token.revoked_at)
                );
            }
        }),
        TokenCommand::Revoke { name } => tokens::revoke(store.as_ref(), &name)
            .await
            .map(|()| println!("revoked token '{name}'")),
    };
    store.close().await;
    Ok(outcome?)
}

/// An error and its causes on one line, each cause once (drivers often repeat theirs).
pub fn one_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
    }
    line
}
