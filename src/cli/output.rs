//! What commands print on stdout, and how a reader that went away ends them.

use std::io::{ErrorKind, Write};

use chrono::{DateTime, SecondsFormat, Utc};

/// Writes to stdout. A reader that has read all it wanted (`plantstore deletions list |
/// head -1`) is no failure: the rest goes nowhere and the command ends as it would have,
/// where `println!` would panic. Any other failure to write (a full disk) is one line on
/// stderr and status 1.
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
