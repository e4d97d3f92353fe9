//! The Docker image's build stage gets every file the workspace needs: a new workspace
//! member, or a `.dockerignore` line too wide, fails here rather than in
//! `docker compose up --build` on a user's machine.

use std::path::{Path, PathBuf};

use serde_json::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

#[test]
fn the_build_stage_gets_every_file_the_workspace_needs() {
    let root = Path::new(ROOT);
    let ignored = dockerignore(root);
    let copied = copied_into_build_stages(root);
    let needed = needed_files(root);
    assert!(
        needed
            .iter()
            .any(|file| file == "bench/sqlite-raw/Cargo.toml")
            && needed
                .iter()
                .any(|file| file == "migrations/sqlite/0001_plants.sql")
            && needed.len() > 20,
        "the guard sees the workspace: {needed:?}"
    );

    let missing: Vec<&String> = needed
        .iter()
        .filter(|file| {
            ignored.iter().any(|pattern| excludes(pattern, file))
                || !copied.iter().any(|source| is_within(file, source))
        })
        .collect();

    assert!(
        missing.is_empty(),
        "the Dockerfile's build stage would miss {missing:?} (COPY sources {copied:?}, \
         .dockerignore {ignored:?})"
    );
}

#[test]
fn the_guard_reads_dockerignore_as_docker_does() {
    assert!(excludes("target", "target/debug/plantstore"));
    assert!(excludes("*.db", "plantstore.db"));
    assert!(
        !excludes("*.db", "data/plantstore.db"),
        "anchored at the root"
    );
    assert!(excludes("bench/*.py", "bench/run.py"));
    assert!(excludes("bench/harness", "bench/harness/main.py"));
    assert!(!excludes("bench/*.py", "bench/sqlite-raw/src/main.rs"));
    assert!(excludes("bench/sqlite-raw", "bench/sqlite-raw/Cargo.toml"));
    assert!(!excludes("src", "crates/store/src/lib.rs"));
}

/// `.dockerignore`'s patterns, limited to the forms this guard reads exactly.
fn dockerignore(root: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(root.join(".dockerignore")).unwrap_or_default();
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            assert!(
                !line.starts_with('!') && !line.contains("**") && !line.contains(['[', '\\']),
                ".dockerignore line {line:?}: keep to paths and single-segment * and ? \
                 patterns, which this guard reads exactly"
            );
            line.trim_start_matches("./")
                .trim_start_matches('/')
                .trim_end_matches('/')
                .to_owned()
        })
        .collect()
}

/// The sources of the Dockerfile's `COPY` lines that take from the build context.
fn copied_into_build_stages(root: &Path) -> Vec<String> {
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).expect("a Dockerfile");
    dockerfile
        .lines()
        .filter_map(|line| line.trim().strip_prefix("COPY "))
        .filter(|args| !args.contains("--from="))
        .flat_map(|args| {
            let words: Vec<&str> = args.split_whitespace().collect();
            let sources = &words[..words.len().saturating_sub(1)];
            sources
                .iter()
                .filter(|word| !word.starts_with("--"))
                .map(|word| {
                    word.trim_start_matches("./")
                        .trim_end_matches('/')
                        .to_owned()
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Every file `cargo build --release --bin plantstore` reads from the checkout: the root
/// manifest and lock, the root package's `src`, each other member's folder, and the
/// migrations each member's `sqlx.toml` points at.
fn needed_files(root: &Path) -> Vec<String> {
    let mut folders = vec![root.join("src")];
    let mut files = vec!["Cargo.toml".to_owned(), "Cargo.lock".to_owned()];
    for member in workspace_member_dirs(root) {
        if member == root {
            continue;
        }
        if let Some(dir) = migrations_dir(&member) {
            folders.push(dir);
        }
        folders.push(member);
    }
    for folder in folders {
        files.extend(files_below(&folder).iter().map(|file| relative(root, file)));
    }
    files.sort();
    files.dedup();
    files
}

fn workspace_member_dirs(root: &Path) -> Vec<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = std::process::Command::new(cargo)
        .args([
            "metadata",
            "--no-deps",
            "--offline",
            "--format-version",
            "1",
        ])
        .current_dir(root)
        .output()
        .expect("run cargo metadata");
    assert!(output.status.success(), "{output:?}");
    let metadata: Value = serde_json::from_slice(&output.stdout).expect("metadata JSON");
    metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .filter_map(|package| package["manifest_path"].as_str())
        .filter_map(|manifest| Path::new(manifest).parent().map(Path::to_path_buf))
        .collect()
}

/// The `migrations-dir` of a member's `sqlx.toml`, which `sqlx::migrate!()` reads.
fn migrations_dir(member: &Path) -> Option<PathBuf> {
    let config = std::fs::read_to_string(member.join("sqlx.toml")).ok()?;
    let line = config
        .lines()
        .find(|line| line.trim_start().starts_with("migrations-dir"))?;
    let value = line.split_once('=')?.1.trim().trim_matches('"');
    let dir = member.join(value);
    Some(dir.canonicalize().unwrap_or(dir))
}

fn files_below(folder: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return Vec::new();
    };
    let mut files = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.file_name().is_some_and(|name| name == "target") {
            continue;
        }
        if path.is_dir() {
            files.extend(files_below(&path));
        } else {
            files.push(path);
        }
    }
    files
}

fn relative(root: &Path, file: &Path) -> String {
    let root = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    let file = file.canonicalize().unwrap_or_else(|_| file.to_path_buf());
    file.strip_prefix(&root)
        .expect("a file of the checkout")
        .to_string_lossy()
        .replace('\\', "/")
}

fn is_within(file: &str, source: &str) -> bool {
    source == "." || file == source || file.starts_with(&format!("{source}/"))
}

/// Docker's rule: a pattern matched against a path from the context's root, or against
/// any folder above the file, excludes the file.
fn excludes(pattern: &str, file: &str) -> bool {
    let wanted: Vec<&str> = pattern.split('/').collect();
    let parts: Vec<&str> = file.split('/').collect();
    parts.len() >= wanted.len()
        && wanted
            .iter()
            .zip(&parts)
            .all(|(want, part)| segment_matches(want.as_bytes(), part.as_bytes()))
}

/// `*` and `?` within one path segment.
fn segment_matches(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) => (0..=text.len()).any(|skip| segment_matches(rest, &text[skip..])),
        Some((b'?', rest)) => !text.is_empty() && segment_matches(rest, &text[1..]),
        Some((c, rest)) => text.first() == Some(c) && segment_matches(rest, &text[1..]),
    }
}
