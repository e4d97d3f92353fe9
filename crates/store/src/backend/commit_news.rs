//! News of commits that wrote to the deletion log, the one way delivery learns there may
//! be events to read.

use std::sync::Arc;

use tokio::sync::watch;

use crate::CommitNewsReceiver;

/// A counter bumped at each commit `Store::commits` tells of.
#[derive(Debug, Clone, Default)]
pub struct CommitNews(Arc<watch::Sender<u64>>);

impl CommitNews {
    pub fn bump(&self) {
        self.0.send_modify(|count| *count = count.wrapping_add(1));
    }

    pub fn subscribe(&self) -> CommitNewsReceiver {
        CommitNewsReceiver(self.0.subscribe())
    }

    /// Resolves once no receiver is left: nobody needs the news from elsewhere any more.
    pub async fn unheard(&self) {
        self.0.closed().await;
    }

    pub fn has_receivers(&self) -> bool {
        self.0.receiver_count() > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_commits_before_a_look_are_one_change() {
        let news = CommitNews::default();
        let mut receiver = news.subscribe();
        assert!(!receiver.0.has_changed().unwrap_or(true));
        news.bump();
        news.bump();
        assert!(receiver.0.has_changed().unwrap_or(false));
        receiver.mark_seen();
        assert!(!receiver.0.has_changed().unwrap_or(true));
    }
}
