//! The reference cannot drift from the binary: every setting the binary reads (its clap
//! `env` names) is in docs/configuration.md and .env.example and nothing else is; every
//! variable docker-compose.yml reads is in .env.example, and every setting it passes the
//! service is one the binary reads; every command and flag `--help` shows is in docs/.

use std::collections::BTreeSet;

use clap::CommandFactory;
use plantstore::cli::Cli;

/// Variables only `docker compose` reads, for itself and the database container.
const COMPOSE_ONLY: [&str; 3] = [
    "POSTGRES_PASSWORD",
    "PLANTSTORE_PORT",
    "PLANTSTORE_ADMIN_PORT",
];

fn read(path: &str) -> String {
    let path = format!("{}/{path}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{path}: {err}"))
}

/// The environment variables the binary reads, in every command.
fn binary_settings() -> BTreeSet<String> {
    fn walk(command: &clap::Command, out: &mut BTreeSet<String>) {
        for arg in command.get_arguments() {
            if let Some(env) = arg.get_env() {
                out.insert(env.to_string_lossy().into_owned());
            }
        }
        for sub in command.get_subcommands() {
            walk(sub, out);
        }
    }
    let mut out = BTreeSet::new();
    walk(&Cli::command(), &mut out);
    out
}

/// Names like `PLANTSTORE_LISTEN` in `text`.
fn upper_names(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| {
            word.len() > 3
                && word.contains('_')
                && word.starts_with(|c: char| c.is_ascii_uppercase())
                && word
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        })
        .map(str::to_owned)
}

/// The variables the settings table of docs/configuration.md names (its first column).
fn documented_settings() -> BTreeSet<String> {
    read("docs/configuration.md")
        .lines()
        .filter(|line| line.starts_with("| `"))
        .flat_map(|line| {
            let first = line.split('|').nth(1).unwrap_or_default().to_owned();
            upper_names(&first).collect::<Vec<_>>()
        })
        .collect()
}

/// The variables .env.example sets or shows commented out (`NAME=` or `# NAME=`).
fn example_settings() -> BTreeSet<String> {
    read(".env.example")
        .lines()
        .filter_map(|line| {
            let line = line.trim_start_matches('#').trim_start();
            let (name, _) = line.split_once('=')?;
            upper_names(name).next().filter(|found| found == name)
        })
        .collect()
}

/// The `${NAME…}` variables docker-compose.yml reads, and the settings it passes the
/// service (its `environment:` keys).
fn compose_variables() -> (BTreeSet<String>, BTreeSet<String>) {
    let compose = read("docker-compose.yml");
    let read_vars = compose
        .split("${")
        .skip(1)
        .filter_map(|rest| upper_names(rest).next())
        .collect();
    let passed = compose
        .lines()
        .filter_map(|line| {
            let (key, _) = line.trim().split_once(':')?;
            upper_names(key).next().filter(|name| name == key)
        })
        .collect();
    (read_vars, passed)
}

/// Fails with `what` and the names of `wanted` that `within` lacks.
fn assert_within(wanted: &BTreeSet<String>, within: &BTreeSet<String>, what: &str) {
    let missing: Vec<&String> = wanted.difference(within).collect();
    assert!(missing.is_empty(), "{what}: {missing:?}");
}

#[test]
fn every_setting_the_binary_reads_is_documented_and_nothing_else() {
    let binary = binary_settings();
    assert!(binary.contains("DATABASE_URL"), "{binary:?}");
    let documented = documented_settings();
    assert_within(
        &binary,
        &documented,
        "read by the binary, missing from docs/configuration.md's table",
    );
    assert_within(
        &documented,
        &binary,
        "in docs/configuration.md's table, but the binary reads no such variable",
    );
}

#[test]
fn env_example_names_every_setting_and_only_settings() {
    let binary = binary_settings();
    let example = example_settings();
    assert_within(
        &binary,
        &example,
        "read by the binary, missing from .env.example",
    );
    let known: BTreeSet<String> = binary
        .iter()
        .cloned()
        .chain(COMPOSE_ONLY.map(String::from))
        .collect();
    assert_within(
        &example,
        &known,
        "in .env.example, but neither the binary nor docker compose reads it",
    );
}

#[test]
fn the_compose_files_variables_are_documented_and_read() {
    let (read_vars, passed) = compose_variables();
    let example = example_settings();
    assert_within(
        &read_vars,
        &example,
        "docker-compose.yml reads these, .env.example does not show them",
    );
    let binary = binary_settings();
    let to_service: BTreeSet<String> = passed
        .into_iter()
        .filter(|name| !name.starts_with("POSTGRES_"))
        .collect();
    assert_within(
        &to_service,
        &binary,
        "docker-compose.yml passes these to the service, which reads no such variable",
    );
}

/// Whether `text` has `flag` as a whole word (`--log`, not only `--log-format`).
fn mentions(text: &str, flag: &str) -> bool {
    text.match_indices(flag).any(|(at, _)| {
        !text[at + flag.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-')
    })
}

#[test]
fn every_command_and_flag_in_help_is_in_the_docs() {
    fn walk(command: &clap::Command, path: &str, out: &mut Vec<(String, String)>) {
        for arg in command.get_arguments() {
            if let Some(long) = arg.get_long().filter(|l| !matches!(*l, "help" | "version")) {
                out.push((path.to_owned(), format!("--{long}")));
            }
        }
        for sub in command.get_subcommands() {
            let path = format!("{path} {}", sub.get_name());
            out.push((path.clone(), String::new()));
            walk(sub, &path, out);
        }
    }
    let mut found = Vec::new();
    walk(&Cli::command(), "plantstore", &mut found);
    let commands = read("docs/commands.md");
    let docs = ["docs/commands.md", "docs/configuration.md"]
        .map(read)
        .join("\n");
    let mut missing = Vec::new();
    for (path, flag) in &found {
        let documented = if flag.is_empty() {
            path == "plantstore" || path.ends_with(" help") || commands.contains(path.as_str())
        } else {
            mentions(&docs, flag)
        };
        if !documented {
            missing.push(format!("{path} {flag}"));
        }
    }
    assert!(found.len() > 20, "{found:?}");
    assert_eq!(
        missing,
        Vec::<String>::new(),
        "in --help, missing from docs/commands.md (commands) or docs/configuration.md (flags)"
    );
}
