//! The `plantstore` binary: read settings, set up logging, run the chosen command.

use std::process::ExitCode;

use clap::error::ErrorKind;
use plantstore::{cli, telemetry};

#[tokio::main]
async fn main() -> ExitCode {
    if let Err(err) = dotenvy::dotenv()
        && !err.not_found()
    {
        return fail(&dotenv_problem(&err));
    }
    let cli = match cli::Cli::try_parse_args(std::env::args_os()) {
        Ok(cli) => cli,
        Err(err) if !err.use_stderr() => {
            // --help and --version: print as usual and succeed.
            let _ = err.print();
            return ExitCode::SUCCESS;
        }
        Err(err) if err.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            // `plantstore token` alone: the help of that command is the clearest answer.
            let _ = err.print();
            return ExitCode::FAILURE;
        }
        Err(err) => return fail(&one_line_usage_error(&err)),
    };
    let telemetry = match telemetry::init(
        &cli.config.log_filter,
        cli.config.log_format,
        cli.otlp_endpoint(),
    ) {
        Ok(telemetry) => telemetry,
        Err(message) => return fail(&message),
    };
    let outcome = cli.run().await;
    // Every span and log line is out before the last word on stderr.
    tokio::task::block_in_place(|| telemetry.shutdown());
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => fail(&telemetry::one_line(err.as_ref())),
    }
}

fn fail(message: &str) -> ExitCode {
    eprintln!("plantstore: {message}");
    ExitCode::FAILURE
}

/// Clap's message without its usage and tips, on one line.
fn one_line_usage_error(err: &clap::Error) -> String {
    let rendered = err.render().to_string();
    let message: Vec<&str> = rendered
        .lines()
        .take_while(|line| !line.is_empty() && !line.starts_with("Usage:"))
        .map(str::trim)
        .collect();
    message.join(" ").trim_start_matches("error: ").to_owned()
}

/// What is wrong with `.env`, without echoing a line that may hold a password.
fn dotenv_problem(err: &dotenvy::Error) -> String {
    match err {
        dotenvy::Error::LineParse(line, at) => {
            let key = line.split('=').next().unwrap_or_default().trim();
            format!("cannot read .env: the line setting {key} is malformed at character {at}")
        }
        other => format!("cannot read .env: {other}"),
    }
}
