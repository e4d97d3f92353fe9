//! The signal the request path raises after each delete it commits, and how delivery hears
//! it: a signal goes out only when every one before it was heard, so a delete under load
//! costs one atomic swap rather than a send to the listeners.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering::SeqCst},
};

use tokio::sync::watch;

/// Raised after each delete this instance commits, so its deliveries read the log at once
/// rather than at their next poll.
#[derive(Debug, Clone, Default)]
pub struct CommitSignal(Arc<Shared>);

#[derive(Debug)]
struct Shared {
    rings: watch::Sender<u64>,
    /// A ring went out that no listener has acted on yet: rings until then add nothing.
    unheard: AtomicBool,
}

impl Default for Shared {
    fn default() -> Self {
        Self {
            rings: watch::Sender::new(0),
            unheard: AtomicBool::new(false),
        }
    }
}

impl CommitSignal {
    /// Nothing on the request path when no endpoint is being delivered to here.
    pub fn raise(&self) {
        let shared = &self.0;
        if shared.rings.receiver_count() > 0 && !shared.unheard.swap(true, SeqCst) {
            shared
                .rings
                .send_modify(|rung| *rung = rung.wrapping_add(1));
        }
    }

    /// A new listener, which hears the rings from now on.
    pub(super) fn listen(&self) -> SignalListener {
        let mut listener = SignalListener {
            shared: Arc::clone(&self.0),
            rings: self.0.rings.subscribe(),
        };
        // A ring no one heard would otherwise keep the next ones from going out to it.
        listener.heard();
        listener
    }
}

/// One listener's ear. Each acts on the rings with `heard` before it reads what they were
/// for: a delete committed after that rings again, for every listener, since no ring it
/// could be folded into is left unheard.
pub(super) struct SignalListener {
    shared: Arc<Shared>,
    rings: watch::Receiver<u64>,
}

impl SignalListener {
    /// Resolves at a ring not yet seen.
    pub(super) async fn changed(&mut self) {
        // Never an error: the listener keeps the signal, sender and all.
        let _ = self.rings.changed().await;
    }

    /// Whether the signal was raised since it was last heard or seen.
    pub(super) fn was_raised(&self) -> bool {
        self.rings.has_changed().unwrap_or(false)
    }

    /// Takes up the rings so far, just before acting on them.
    pub(super) fn heard(&mut self) {
        // Seen first, then cleared: a ring between the two is either seen later or was
        // for a delete committed before the clear, which the caller's read sees.
        self.rings.mark_unchanged();
        self.shared.unheard.store(false, SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_after_a_listener_heard_reaches_every_listener() {
        let signal = CommitSignal::default();
        let (mut first, mut second) = (signal.listen(), signal.listen());
        signal.raise();
        signal.raise();
        assert!(first.was_raised() && second.was_raised());
        first.heard();
        assert!(!first.was_raised());
        // Not heard by `second` yet, but `first` cleared the ring: the next goes out.
        signal.raise();
        assert!(first.was_raised() && second.was_raised());
        second.heard();
        first.heard();
        assert!(!first.was_raised() && !second.was_raised());
        signal.raise();
        assert!(first.was_raised() && second.was_raised());
    }

    #[test]
    fn a_new_listener_hears_the_next_ring_though_the_last_went_unheard() {
        let signal = CommitSignal::default();
        let _old = signal.listen();
        signal.raise();
        let late = signal.listen();
        assert!(!late.was_raised());
        signal.raise();
        assert!(late.was_raised());
    }

    #[test]
    fn rings_before_anyone_heard_go_out_once() {
        let signal = CommitSignal::default();
        let mut ear = signal.listen();
        signal.raise();
        let version = *ear.rings.borrow_and_update();
        signal.raise();
        signal.raise();
        assert!(!ear.was_raised(), "folded into the ring not yet heard");
        assert_eq!(version, 1);
    }
}
