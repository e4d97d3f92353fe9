//! The `plantstore` binary: read settings, set up logging, run the chosen command.

use std::process::ExitCode;

use clap::Parser;
use plantstore::{cli, telemetry};

#[tokio::main]
async fn main() -> ExitCode {
    if let Err(err) = dotenvy::dotenv()
        && !err.not_found()
    {
        return fail(&format!("cannot read .env: {err}"));
    }
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) if !err.use_stderr() => {
            // --help and --version: print as usual and succeed.
            let _ = err.print();
            return ExitCode::SUCCESS;
        }
        Err(err) => {
            let rendered = err.render().to_string();
            let first = rendered.lines().next().unwrap_or("invalid arguments");
            return fail(first.trim_start_matches("error: "));
        }
    };
    if let Err(message) = telemetry::init(&cli.config.log_filter, cli.config.log_format) {
        return fail(&message);
    }
    match cli.run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => fail(&cli::one_line(&err)),
    }
}

fn fail(message: &str) -> ExitCode {
    eprintln!("plantstore: {message}");
    ExitCode::FAILURE
}
