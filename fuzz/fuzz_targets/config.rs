//! Every setting's parser, and the whole command line: any text is either accepted or
//! refused with a message, never a panic; a database URL's password never shows in its
//! redacted form, whatever characters it holds.
#![no_main]

use std::str::FromStr;

use clap::Parser;
use libfuzzer_sys::fuzz_target;
use plantstore::{
    cli::Cli,
    config::{DatabaseUrl, RateLimit, parse_duration},
};

#[derive(Debug, arbitrary::Arbitrary)]
struct Input {
    args: Vec<String>,
    /// Parts of `postgres://USER:PASSWORD@HOST/DATABASE?QUERY`.
    user: String,
    password: String,
    host: String,
    query: Option<String>,
}

fuzz_target!(|input: Input| {
    for arg in &input.args {
        let _ = parse_duration(arg);
        let _ = RateLimit::from_str(arg);
        check_url(arg);
    }
    let secret = &input.password;
    let mut url = format!("postgres://{}:{secret}@{}/plants", input.user, input.host);
    if let Some(query) = &input.query {
        url = format!("{url}?{query}");
    }
    let redacted = check_url(&url);
    // Long enough not to turn up by chance, and not a part of the rest of the URL.
    let elsewhere = url.replacen(&format!(":{secret}@"), ":@", 1);
    // (A secret with `*` could be spelled by the mask and what follows it.)
    if secret.len() >= 4 && !elsewhere.contains(secret.as_str()) && !secret.contains('*') {
        assert!(
            !redacted.contains(secret.as_str()),
            "{redacted:?} shows the password of {url:?}"
        );
    }
    let argv = std::iter::once("plantstore".to_owned()).chain(input.args);
    let _ = Cli::try_parse_from(argv);
});

fn check_url(text: &str) -> String {
    let url = DatabaseUrl::from(text.to_owned());
    let _ = url.backend();
    let redacted = url.redacted();
    assert_eq!(format!("{url:?}"), format!("DatabaseUrl({redacted:?})"));
    assert_eq!(url.to_string(), redacted);
    redacted
}
