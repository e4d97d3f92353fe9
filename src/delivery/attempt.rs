//! What came of one attempt to send an event, whatever the destination's kind.

use std::time::Duration;

#[derive(Debug)]
pub(super) enum Attempt {
    /// A 2xx within the timeout, or the message stored by the broker.
    Delivered,
    /// 410: the receiver wants no more events.
    Gone,
    /// Anything else: to be tried again, not sooner than `retry_after` if the receiver said.
    Failed {
        error: String,
        retry_after: Option<Duration>,
    },
}

impl Attempt {
    /// A failure the receiver gave no advice on.
    pub(super) fn failed(error: impl Into<String>) -> Self {
        Attempt::Failed {
            error: error.into(),
            retry_after: None,
        }
    }
}
