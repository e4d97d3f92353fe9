//! The bell the request path rings after each delete it commits, and how delivery hears
//! it: a ring goes out only when every ring before it was heard, so a delete under load
//! costs one atomic swap rather than a send to the listeners.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering::SeqCst},
};

use tokio::sync::watch;

/// Rung after each delete this instance commits, so its deliveries read the log at once
/// rather than at their next poll.
#[derive(Debug, Clone, Default)]
pub struct Bell(Arc<Shared>);

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

impl Bell {
    /// Nothing on the request path when no endpoint is being delivered to here.
    pub fn ring(&self) {
        let shared = &self.0;
        if shared.rings.receiver_count() > 0 && !shared.unheard.swap(true, SeqCst) {
            shared
                .rings
                .send_modify(|rung| *rung = rung.wrapping_add(1));
        }
    }

    /// A new listener, which hears the rings from now on.
    pub(super) fn listen(&self) -> Listener {
        let mut listener = Listener {
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
pub(super) struct Listener {
    shared: Arc<Shared>,
    rings: watch::Receiver<u64>,
}

impl Listener {
    /// Resolves at a ring not yet seen.
    pub(super) async fn changed(&mut self) {
        // Never an error: the listener keeps the bell, sender and all.
        let _ = self.rings.changed().await;
    }

    /// Whether the bell rang since it was last heard or seen.
    pub(super) fn rang(&self) -> bool {
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
        let bell = Bell::default();
        let (mut first, mut second) = (bell.listen(), bell.listen());
        bell.ring();
        bell.ring();
        assert!(first.rang() && second.rang());
        first.heard();
        assert!(!first.rang());
        // Not heard by `second` yet, but `first` cleared the ring: the next goes out.
        bell.ring();
        assert!(first.rang() && second.rang());
        second.heard();
        first.heard();
        assert!(!first.rang() && !second.rang());
        bell.ring();
        assert!(first.rang() && second.rang());
    }

    #[test]
    fn a_new_listener_hears_the_next_ring_though_the_last_went_unheard() {
        let bell = Bell::default();
        let _old = bell.listen();
        bell.ring();
        let late = bell.listen();
        assert!(!late.rang());
        bell.ring();
        assert!(late.rang());
    }

    #[test]
    fn rings_before_anyone_heard_go_out_once() {
        let bell = Bell::default();
        let mut ear = bell.listen();
        bell.ring();
        let version = *ear.rings.borrow_and_update();
        bell.ring();
        bell.ring();
        assert!(!ear.rang(), "folded into the ring not yet heard");
        assert_eq!(version, 1);
    }
}
