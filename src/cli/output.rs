//! What commands print on stdout, and how a reader that went away ends them.

use std::io::{ErrorKind, Write};

use chrono::{DateTime, SecondsFormat, Utc};
use reqwest::Url;

/// Writes to stdout. A reader gone (`… | head -1`) is no failure, where `println!` would
/// panic; any other failed write (a full disk) is one line on stderr and status 1.
pub(crate) fn write_out(text: std::fmt::Arguments<'_>) {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_fmt(text).and_then(|()| stdout.flush()) {
        Err(err) if err.kind() != ErrorKind::BrokenPipe => {
            eprintln!("plantstore: cannot write the output: {err}");
            std::process::exit(1);
        }
        _ => {}
    }
}

/// `println!` for command output, through [`write_out`].
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::output::write_out(format_args!("{}\n", format_args!($($arg)*)))
    };
}
pub(crate) use out;

/// A moment as every command prints it: RFC 3339 in UTC, to the second.
pub(crate) fn time(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// The URL with its password, or its token, hidden.
pub(crate) fn redacted(text: &str) -> String {
    let Ok(mut url) = Url::parse(text) else {
        return "(an unparseable URL)".into();
    };
    if url.password().is_some() {
        let _ = url.set_password(Some("***"));
    } else if !url.username().is_empty() {
        let _ = url.set_username("***");
    }
    url.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_and_tokens_are_hidden() {
        assert_eq!(
            redacted("nats://user:secret@broker:4222"),
            "nats://user:***@broker:4222"
        );
        assert_eq!(
            redacted("nats://s3cret@broker:4222"),
            "nats://***@broker:4222"
        );
        assert_eq!(redacted("nats://broker:4222"), "nats://broker:4222");
        assert_eq!(
            redacted("https://user:pw@example.com:99/hook"),
            "https://user:***@example.com:99/hook"
        );
    }
}
