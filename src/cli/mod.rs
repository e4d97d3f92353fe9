//! The `plantstore` command line and its dispatch; each command group has its own file.

mod deletions;
mod destinations;
mod output;
mod serve;
mod streams;
mod tokens;
mod webhooks;

use clap::{
    Args, CommandFactory, FromArgMatches, Parser, Subcommand, error::ErrorKind, parser::ValueSource,
};

use crate::{
    config::{self, Config, ServeConfig},
    database, http,
};
use deletions::DeletionsCommand;
use output::out;
use streams::StreamsCommand;
use tokens::TokenCommand;
use webhooks::WebhooksCommand;

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
    /// Register, list and manage the endpoints deletion events are POSTed to
    #[command(subcommand)]
    Webhooks(WebhooksCommand),
    /// Register, list and manage the NATS JetStream streams deletion events are published to
    #[command(subcommand)]
    Streams(StreamsCommand),
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

impl Cli {
    /// Parses the command line. The server's own flags go alone or after `serve`; before
    /// another command they would be ignored, so they are an error, not a later surprise.
    pub fn try_parse_args(
        args: impl IntoIterator<Item = std::ffi::OsString>,
    ) -> Result<Self, clap::Error> {
        let mut command = Self::command();
        let args: Vec<std::ffi::OsString> = args.into_iter().collect();
        let matches = command
            .try_get_matches_from_mut(args.clone())
            .map_err(|err| config::name_the_variable(err, &mut command, &args))?;
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
        let cli = Self::from_arg_matches(&matches).map_err(|err| err.format(&mut command))?;
        cli.serve_config()
            .check()
            .map_err(|message| command.error(ErrorKind::ValueValidation, message))?;
        Ok(cli)
    }

    /// The server's settings: after `serve`, or standing alone.
    fn serve_config(&self) -> &ServeConfig {
        match &self.command {
            Some(Command::Serve(serve)) => serve.as_ref(),
            _ => &self.config.serve,
        }
    }

    /// Where spans go: only the server exports them.
    pub fn otlp_endpoint(&self) -> Option<&str> {
        if !matches!(self.command, None | Some(Command::Serve(_))) {
            return None;
        }
        self.serve_config()
            .otlp_endpoint
            .as_deref()
            .filter(|url| !url.is_empty())
    }

    pub async fn run(self) -> anyhow::Result<()> {
        let mut config = self.config;
        let command = match self.command {
            None => return serve::run(&config).await,
            Some(Command::Serve(serve_config)) => {
                config.serve = *serve_config;
                return serve::run(&config).await;
            }
            Some(Command::Openapi { format }) => {
                let document = http::document()?;
                match format {
                    DocumentFormat::Json => out!("{document:#}"),
                    DocumentFormat::Yaml => {
                        output::write_out(format_args!("{}", http::yaml(&document)?))
                    }
                }
                return Ok(());
            }
            Some(Command::Completions { shell }) => {
                // Into a buffer first: clap_complete panics on a failed write (`| head`).
                let mut script = Vec::new();
                clap_complete::generate(shell, &mut Cli::command(), "plantstore", &mut script);
                output::write_out(format_args!("{}", String::from_utf8_lossy(&script)));
                return Ok(());
            }
            Some(command) => command,
        };
        config.migrate |= matches!(command, Command::Migrate);
        // Only these may make a SQLite file: others, run elsewhere, would get an empty one.
        if !matches!(command, Command::Migrate | Command::Seed { .. }) {
            database::existing(&config.database_url)?;
        }
        // The rest work on the store, opened (migrated or checked) and closed here.
        let store = database::open(&config, None).await?;
        let outcome = match command {
            Command::Token(command) => tokens::run(store.as_ref(), command).await,
            Command::Deletions(command) => deletions::run(store.as_ref(), command).await,
            Command::Webhooks(command) => webhooks::run(store.as_ref(), command).await,
            Command::Streams(command) => streams::run(store.as_ref(), command).await,
            Command::Seed { count } => store
                .seed_plants(count)
                .await
                .map_err(Into::into)
                .map(|added| out!("added {added} missing demo plants with ids 1..={count}")),
            Command::Migrate => {
                out!("migrations applied");
                Ok(())
            }
            // Answered above, without a store.
            Command::Serve(_) | Command::Openapi { .. } | Command::Completions { .. } => Ok(()),
        };
        store.close().await;
        outcome
    }
}
