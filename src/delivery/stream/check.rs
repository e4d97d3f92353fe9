//! What the stream commands make sure of before a destination publishes: the server, its
//! JetStream and the stream, and that the stream captures the destination's subjects.

use std::time::Duration;

use async_nats::jetstream::{self, stream::LastRawMessageErrorKind};
use plantstore_store::destinations::StreamTarget;

use super::server::{Server, Trouble, jetstream_missing};
use crate::telemetry::one_line;

pub(crate) enum TargetUse {
    /// Publish from the start (`add`; `replay`, which keeps its prefix): the stream must
    /// hold no message under the prefix, where this destination expects none.
    Add,
    Replay,
    /// Go on publishing after the messages there (`set-url`).
    Moved,
}

/// Fails unless the server takes these credentials and its stream captures `<prefix>.>`.
pub(crate) async fn check_target(target: &StreamTarget, future: TargetUse) -> Result<(), String> {
    const CHECK_TIMEOUT: Duration = Duration::from_secs(10);
    let server = Server::parse(&target.url)?;
    let client = server.connect(CHECK_TIMEOUT, &Trouble::default()).await?;
    let mut context = jetstream::new(client);
    context.set_timeout(CHECK_TIMEOUT);
    let mut stream = match context.get_stream(&target.stream).await {
        Ok(stream) => stream,
        Err(err) => {
            if let Some(missing) = jetstream_missing(&context).await {
                return Err(missing);
            }
            return Err(format!(
                "cannot use the stream {}: {} (the service does not create it: see docs/deletion-events.md)",
                target.stream,
                one_line(&err)
            ));
        }
    };
    let wanted = format!("{}.>", target.subject_prefix);
    let info = stream
        .info()
        .await
        .map_err(|err| format!("cannot read the stream: {}", one_line(&err)))?;
    if !info
        .config
        .subjects
        .iter()
        .any(|subject| captures(subject, &wanted))
    {
        return Err(format!(
            "the stream {} does not capture {wanted} (its subjects: {})",
            target.stream,
            info.config.subjects.join(", ")
        ));
    }
    if matches!(future, TargetUse::Moved) {
        return Ok(());
    }
    match stream.get_first_raw_message_by_subject(&wanted, 1).await {
        Err(err) if err.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(()),
        Err(err) => Err(format!("cannot read the stream: {}", one_line(&err))),
        Ok(found) => Err(format!(
            "the stream {} already holds messages on {wanted} (the first at sequence {}): purge them (nats stream purge {} --subject '{wanted}'){}",
            target.stream,
            found.sequence,
            target.stream,
            match future {
                TargetUse::Add => " or choose another --subject-prefix",
                _ => "",
            }
        )),
    }
}

/// Whether a stream's subject filter takes every subject `wanted` matches.
fn captures(filter: &str, wanted: &str) -> bool {
    let mut filter = filter.split('.');
    let mut wanted = wanted.split('.');
    loop {
        match (filter.next(), wanted.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(token)) if token != ">" => {}
            (Some(f), Some(w)) if f == w && w != ">" => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_captures_what_its_wildcards_cover() {
        let wanted = "plantstore.plants.>";
        for filter in ["plantstore.plants.>", "plantstore.>", ">", "*.plants.>"] {
            assert!(captures(filter, wanted), "{filter}");
        }
        for filter in [
            "plantstore.plants.*",
            "plantstore.plants",
            "plantstore.plants.7",
            "other.>",
            "plantstore.*",
        ] {
            assert!(!captures(filter, wanted), "{filter}");
        }
    }
}
