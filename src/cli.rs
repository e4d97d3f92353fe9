//! The `plantstore` command line: its commands, and what each one does.

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use std::io::Write;

use clap::{
    Args, CommandFactory, FromArgMatches, Parser, Subcommand, error::ErrorKind, parser::ValueSource,
};
use plantstore_store::TokenRecord;

use crate::{
    api,
    config::{Config, ServeConfig, parse_duration},
    deletions::{self, DeletionsCommand},
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
    Serve(Box<ServeConfig>),
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
    /// Read the deletion log, restore a deleted plant, prune old entries
    #[command(subcommand)]
    Deletions(DeletionsCommand),
    /// Insert demo plants 1..=COUNT that are missing
    Seed {
        /// How many demo plants: ids 1 to COUNT
        #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
        count: i64,
    },
    /// Print a completion script for a shell, such as
    /// `plantstore completions bash > /etc/bash_completion.d/plantstore`
    Completions {
        /// The shell to complete in
        shell: clap_complete::Shell,
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

impl Cli {
    /// Parses the command line. The server's own flags stand alone (`plantstore --listen
    /// …`) or after `serve`; given before a command they would be ignored, so that is an
    /// error here rather than a surprise later.
    pub fn try_parse_args(
        args: impl IntoIterator<Item = std::ffi::OsString>,
    ) -> Result<Self, clap::Error> {
        let mut command = Self::command();
        let matches = command.try_get_matches_from_mut(args)?;
        if let Some((name, _)) = matches.subcommand() {
            let serve_only = ServeConfig::augment_args(clap::Command::new("serve"));
            for arg in serve_only.get_arguments() {
                if matches.value_source(arg.get_id().as_str()) == Some(ValueSource::CommandLine) {
                    let flag = arg.get_long().unwrap_or_default();
                    let message = if name == "serve" {
                        format!("--{flag} goes after `serve`: plantstore serve --{flag} …")
                    } else {
                        format!("--{flag} is a setting of the server, not of `{name}`")
                    };
                    return Err(command.error(ErrorKind::ArgumentConflict, message));
                }
            }
        }
        Self::from_arg_matches(&matches).map_err(|err| err.format(&mut command))
    }

    /// Where spans go: only the server exports them.
    pub fn otlp_endpoint(&self) -> Option<&str> {
        let serve = match &self.command {
            None => &self.config.serve,
            Some(Command::Serve(serve)) => serve.as_ref(),
            Some(_) => return None,
        };
        serve.otlp_endpoint.as_deref().filter(|url| !url.is_empty())
    }

    pub async fn run(self) -> anyhow::Result<()> {
        let mut config = self.config;
        let Some(command) = self.command else {
            return serve(&config).await;
        };
        match command {
            Command::Serve(serve_config) => {
                config.serve = *serve_config;
                serve(&config).await
            }
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
            Command::Deletions(command) => {
                let store = startup::open_store(&config).await?;
                let outcome = deletions::run(store.as_ref(), command).await;
                store.close().await;
                outcome
            }
            Command::Completions { shell } => {
                // Into a buffer first: clap_complete panics on a failed write (`| head`).
                let mut script = Vec::new();
                clap_complete::generate(shell, &mut Cli::command(), "plantstore", &mut script);
                std::io::stdout()
                    .write_all(&script)
                    .or_else(ignore_broken_pipe)?;
                Ok(())
            }
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
    if let Some(admin) = app.admin_address() {
        println!("Health checks and metrics on http://{admin}/healthz, /readyz and /metrics");
    }
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
        TokenCommand::List { json } => store
            .list_tokens()
            .await
            .map_err(Into::into)
            .map(|list| print_tokens(&list, json)),
        TokenCommand::Revoke { name } => tokens::revoke(store.as_ref(), &name)
            .await
            .map(|()| println!("revoked token '{name}'")),
    };
    store.close().await;
    Ok(outcome?)
}

fn print_tokens(list: &[TokenRecord], json: bool) {
    let time =
        |at: Option<DateTime<Utc>>| at.map(|at| at.to_rfc3339_opts(SecondsFormat::Secs, true));
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
        println!("{}", serde_json::Value::Array(rows));
        return;
    }
    let shown = |at| time(at).unwrap_or_else(|| "-".to_owned());
    println!(
        "{:<24} {:<20} {:<20} {:<20}",
        "NAME", "CREATED", "EXPIRES", "REVOKED"
    );
    for token in list {
        println!(
            "{:<24} {:<20} {:<20} {:<20}",
            token.name,
            shown(Some(token.created_at)),
            shown(token.expires_at),
            shown(token.revoked_at)
        );
    }
}

fn ignore_broken_pipe(err: std::io::Error) -> std::io::Result<()> {
    match err.kind() {
        std::io::ErrorKind::BrokenPipe => Ok(()),
        _ => Err(err),
    }
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
