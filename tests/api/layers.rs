//! The service's modules form layers: no module reaches, directly or around a circle,
//! one that reaches back, and identity and storage know nothing of HTTP or metrics.
//!
//! Read from the source as text: every `use` of `crate::`, `super::` or a child module,
//! and every inline `crate::` path, outside `#[cfg(test)]` code, names the module it
//! reaches (the longest path prefix that is a module file).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The modules the bottom layers (`config`, and `connection_limits` below HTTP) must never
/// reach: every other one.
const EVERY_MODULE_BUT_CONFIG: &[&str] = &[
    "auth",
    "cli",
    "database",
    "http",
    "startup",
    "state",
    "telemetry",
    "delivery",
];

/// Which top-level modules each layer must never reach.
const FORBIDDEN: &[(&str, &[&str])] = &[
    ("config", EVERY_MODULE_BUT_CONFIG),
    (
        "database",
        &[
            "auth",
            "cli",
            "http",
            "startup",
            "state",
            "telemetry",
            "delivery",
        ],
    ),
    (
        "auth",
        &["cli", "http", "startup", "state", "telemetry", "delivery"],
    ),
    ("connection_limits", EVERY_MODULE_BUT_CONFIG),
    (
        "telemetry",
        &["auth", "cli", "http", "startup", "state", "delivery"],
    ),
    ("delivery", &["auth", "cli", "http", "startup", "state"]),
    ("state", &["cli", "http", "startup"]),
    ("http", &["cli", "startup"]),
];

#[test]
fn the_modules_form_no_circle() {
    let graph = module_graph();
    assert!(graph.len() > 20, "the check sees the modules: {graph:?}");
    assert!(
        graph["http"].contains("http::error") && graph["auth::tokens"].contains("auth"),
        "the check sees the uses: {graph:?}"
    );
    if let Some(circle) = find_circle(&graph) {
        panic!(
            "modules reach each other in a circle: {}",
            circle.join(" -> ")
        );
    }
}

#[test]
fn identity_storage_and_telemetry_stay_below_http() {
    let graph = module_graph();
    let mut breaches = Vec::new();
    for (module, uses) in &graph {
        let top = module.split("::").next().unwrap_or_default();
        let Some((_, forbidden)) = FORBIDDEN.iter().find(|(layer, _)| *layer == top) else {
            continue;
        };
        for used in uses {
            let used_top = used.split("::").next().unwrap_or_default();
            if forbidden.contains(&used_top) {
                breaches.push(format!("{module} uses {used}"));
            }
        }
    }
    assert!(
        breaches.is_empty(),
        "a lower layer reaches up: {breaches:?}"
    );
}

#[test]
fn the_storage_crates_depend_on_no_http_or_metrics_crate() {
    for krate in ["store", "group-commit", "store-sqlite", "store-postgres"] {
        let manifest = std::fs::read_to_string(
            Path::new(ROOT)
                .join("crates")
                .join(krate)
                .join("Cargo.toml"),
        )
        .expect("a storage crate's manifest");
        let dependencies: Vec<&str> = manifest
            .lines()
            .filter_map(|line| line.split(['=', '.', ' ']).next())
            .collect();
        for banned in [
            "metrics",
            "poem",
            "poem-openapi",
            "metrics-exporter-prometheus",
        ] {
            assert!(
                !dependencies.contains(&banned),
                "crates/{krate} depends on {banned}"
            );
        }
    }
}

/// Each module of `src/` (`a::b`) and the other modules it uses.
/// docs/development.md's map names every source file of the service and its crates, and
/// nothing that is not there: a newcomer finds each file, and each line of the map.
#[test]
fn the_module_map_names_every_file_and_only_files_that_exist() {
    let root = Path::new(ROOT);
    let mut files = Vec::new();
    collect_rs(&root.join("src"), &mut files);
    let crates = std::fs::read_dir(root.join("crates")).expect("the crates folder");
    for krate in crates.flatten() {
        collect_rs(&krate.path().join("src"), &mut files);
    }
    let in_tree: BTreeSet<String> = files
        .iter()
        .filter_map(|file| file.strip_prefix(root).ok())
        .map(|file| file.display().to_string())
        .collect();
    let doc = std::fs::read_to_string(root.join("docs/development.md")).expect("the doc");
    let map = doc
        .split("```text\n")
        .find(|block| block.starts_with("src/main.rs"))
        .and_then(|block| block.split("```").next())
        .expect("the layout's map");
    let in_map: BTreeSet<String> = map
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|path| path.ends_with(".rs"))
        .map(str::to_owned)
        .collect();
    let unmapped: Vec<&String> = in_tree.difference(&in_map).collect();
    let missing: Vec<&String> = in_map.difference(&in_tree).collect();
    assert!(
        unmapped.is_empty() && missing.is_empty(),
        "not in docs/development.md's map: {unmapped:?}; in the map, not in the tree: {missing:?}"
    );
}

fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(ROOT).join("src");
    let mut files = Vec::new();
    collect_rs(&src, &mut files);
    let modules: BTreeMap<String, String> = files
        .iter()
        .filter_map(|file| {
            let relative = file.strip_prefix(&src).ok()?.to_str()?.to_owned();
            let name = module_name(&relative)?;
            Some((name, std::fs::read_to_string(file).ok()?))
        })
        .collect();
    let known: BTreeSet<String> = modules.keys().cloned().collect();
    modules
        .iter()
        .map(|(module, source)| {
            let uses = references(source, module, &known)
                .into_iter()
                .filter_map(|path| longest_module(&path, &known))
                .filter(|used| used != module && !used.is_empty())
                .collect();
            (module.clone(), uses)
        })
        .collect()
}

fn collect_rs(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src is readable").flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect_rs(&path, files);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
}

/// `http/mod.rs` is `http`, `http/error.rs` is `http::error`, `lib.rs` the root (""); the
/// binary's `main.rs` is no module of the library.
fn module_name(relative: &str) -> Option<String> {
    if relative == "main.rs" {
        return None;
    }
    let stem = relative.strip_suffix(".rs")?;
    let stem = stem
        .strip_suffix("/mod")
        .unwrap_or(if stem == "lib" { "" } else { stem });
    Some(stem.replace('/', "::"))
}

/// Every path into the crate that `source` (the module `module`) names, as absolute
/// segments.
fn references(source: &str, module: &str, known: &BTreeSet<String>) -> Vec<Vec<String>> {
    let code: String = source
        .lines()
        .take_while(|line| line.trim() != "#[cfg(test)]")
        .filter(|line| !line.trim_start().starts_with("//"))
        .map(|line| format!("{line}\n"))
        .collect();
    let mut paths = Vec::new();
    for statement in code.split(';') {
        let trimmed = statement.trim_start();
        // A `use` starts a line; "…; use a new key" inside a string does not.
        let starts_a_line = statement[..statement.len() - trimmed.len()].contains('\n');
        let tree = ["use ", "pub use ", "pub(crate) use ", "pub(super) use "]
            .iter()
            .filter(|_| starts_a_line)
            .find_map(|prefix| trimmed.strip_prefix(prefix));
        match tree {
            Some(tree) => {
                let tree: String = without_renames(tree).split_whitespace().collect();
                expand(&tree, &mut Vec::new(), &mut paths);
            }
            None => paths.extend(inline_paths(statement)),
        }
    }
    paths
        .into_iter()
        .filter_map(|path| absolute(&path, module, known))
        .collect()
}

/// `a as b` becomes `a`.
fn without_renames(tree: &str) -> String {
    let words: Vec<&str> = tree.split_whitespace().collect();
    let mut kept = Vec::new();
    let mut skip = 0;
    for (i, word) in words.iter().enumerate() {
        if skip > 0 {
            skip -= 1;
            continue;
        }
        if *word == "as" && i + 1 < words.len() {
            // The new name, and what stuck to it (`,` or `}`), which is kept.
            let rest = words[i + 1].trim_start_matches(|c: char| c.is_alphanumeric() || c == '_');
            kept.push(rest.to_owned());
            skip = 1;
            continue;
        }
        kept.push((*word).to_owned());
    }
    kept.join(" ")
}

/// `a::{b, c::{d, self}}` into `a::b`, `a::c::d`, `a::c`.
fn expand(tree: &str, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let Some(open) = tree.find('{') else {
        let mut path = prefix.clone();
        for segment in tree.split("::").filter(|s| !s.is_empty()) {
            if segment != "self" {
                path.push(segment.to_owned());
            }
        }
        out.push(path);
        return;
    };
    let head: Vec<String> = tree[..open]
        .split("::")
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    let close = tree
        .rfind('}')
        .filter(|close| *close > open)
        .unwrap_or(tree.len());
    let inner = tree.get(open + 1..close).unwrap_or_default();
    let depth_before = prefix.len();
    prefix.extend(head);
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                expand(&inner[start..i], prefix, out);
                start = i + 1;
            }
            _ => {}
        }
    }
    if !inner[start..].is_empty() {
        expand(&inner[start..], prefix, out);
    }
    prefix.truncate(depth_before);
}

/// `crate::a::b` and `super::c` paths written in code rather than imported (visibility
/// restrictions aside).
fn inline_paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for anchor in ["crate::", "super::"] {
        let mut rest = code;
        while let Some(at) = rest.find(anchor) {
            let before = rest[..at].chars().last();
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(tail.len());
            // `pub(in crate::a)` says who may see an item, not what it uses.
            let visibility = rest[..at].ends_with("pub(in ");
            if !visibility && !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                out.push(
                    tail[..end]
                        .split("::")
                        .filter(|s| !s.is_empty())
                        .map(str::to_owned)
                        .collect(),
                );
            }
            rest = &tail[end.max(anchor.len())..];
        }
    }
    out
}

/// A path as segments from the crate root, or `None` for another crate's.
fn absolute(path: &[String], module: &str, known: &BTreeSet<String>) -> Option<Vec<String>> {
    let here: Vec<String> = module
        .split("::")
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    let first = path.first()?;
    let mut resolved = match first.as_str() {
        "crate" => Vec::new(),
        "self" => here.clone(),
        "super" => {
            let ups = path.iter().take_while(|s| *s == "super").count();
            let mut base = here.clone();
            base.truncate(here.len().checked_sub(ups)?);
            base.extend(path[ups..].iter().cloned());
            return Some(base);
        }
        child => {
            let mut candidate = here.clone();
            candidate.push(child.to_owned());
            if !known.contains(&candidate.join("::")) {
                return None;
            }
            here.clone()
        }
    };
    let skip = usize::from(matches!(first.as_str(), "crate" | "self"));
    resolved.extend(path[skip..].iter().cloned());
    Some(resolved)
}

fn longest_module(path: &[String], known: &BTreeSet<String>) -> Option<String> {
    (0..=path.len())
        .rev()
        .map(|n| path[..n].join("::"))
        .find(|candidate| known.contains(candidate))
}

/// A circle of uses, if there is one, as the modules along it.
fn find_circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        done: &mut BTreeSet<String>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|n| n == node) {
            let mut circle = path[start..].to_vec();
            circle.push(node.to_owned());
            return Some(circle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(circle) = visit(next, graph, done, path) {
                return Some(circle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut done, &mut Vec::new()))
}
