//! Word to the other instances that this one committed deletes, so that the one holding
//! an endpoint's lease reads them at once rather than at its next poll.

use std::{sync::Arc, time::Duration};

use plantstore_store::Announcements;
use tokio::sync::watch;

use super::CommitSignal;

/// The shortest time between two announcements: under load one goes out for many deletes,
/// each a transaction of its own.
const GAP: Duration = Duration::from_millis(50);

/// Announces the deletes the commit signal is raised for, while `needed` says some active endpoint is
/// delivered by another instance; while it does not, the signal costs the request path
/// nothing.
pub(super) async fn announce(
    announcements: Arc<dyn Announcements>,
    signal: CommitSignal,
    mut needed: watch::Receiver<bool>,
) {
    loop {
        if needed.wait_for(|needed| *needed).await.is_err() {
            return;
        }
        let mut rung = signal.listen();
        loop {
            tokio::select! {
                () = rung.changed() => {},
                changed = needed.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    if *needed.borrow_and_update() {
                        continue;
                    }
                    break;
                }
            }
            rung.heard();
            if let Err(err) = announcements.announce().await {
                tracing::warn!(error = %err, "cannot announce deletion events to the other instances");
            }
            // Rings during the gap are seen as one change when it ends.
            tokio::time::sleep(GAP).await;
        }
    }
}
