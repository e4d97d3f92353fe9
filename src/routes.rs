//! Facts about the routes that both the app and the error mapping need.

/// The prefix of the published operation's path.
pub const PLANTS_PREFIX: &str = "/plants/";

/// The methods a path answers to, for the `Allow` header of a 405.
pub fn allowed_methods(path: &str) -> &'static str {
    if path.starts_with(PLANTS_PREFIX) {
        "DELETE"
    } else {
        "GET"
    }
}
