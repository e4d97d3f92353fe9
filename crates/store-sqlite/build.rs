//! Rebuilds this crate when a migration is added or changed: `sqlx::migrate!` embeds the
//! folder's files, but cargo watches only the files it included, not the folder.
fn main() {
    println!("cargo:rerun-if-changed=../../migrations/sqlite");
}
