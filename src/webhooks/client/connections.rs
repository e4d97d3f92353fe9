//! One endpoint's connections, and which one carries the next request: requests that come
//! together share one connection and one write, so that a receiver under load is woken
//! once for many events rather than once for each.

use std::{
    collections::VecDeque,
    sync::{Arc, atomic::Ordering::Relaxed},
    time::Duration,
};

use bytes::Bytes;
use tokio::{
    sync::{mpsc, oneshot},
    time::Instant,
};

use super::{
    address::Address,
    connection::{self, Answered, Counts, Outgoing},
    connector::Connector,
};

/// The most requests one connection carries at once. An answer that is late holds up
/// those behind it until the timeout, when they are sent again on another connection.
const DEPTH: usize = 64;
/// The most connections open at once while requests are pipelined: few, so that each
/// write, and each wake-up of the receiver, carries many requests.
const PIPELINED: usize = 8;
/// The most connections open at once while requests go one per connection; the requests
/// past them are held until a connection is free.
const ONE_EACH: usize = 32;
/// How long requests go one per connection after a connection ended with requests
/// unanswered: the receiver may not take requests pipelined, or may be slow.
const ONE_AT_A_TIME: Duration = Duration::from_secs(60);

/// An open connection, as its endpoint sees it.
struct Pipe {
    requests: mpsc::UnboundedSender<Outgoing>,
    counts: Arc<Counts>,
}

pub(in crate::webhooks) struct Connections {
    connector: Connector,
    address: Arc<Address>,
    timeout: Duration,
    open: Vec<Pipe>,
    /// Requests waiting for a connection of their own, in the order they came.
    held: VecDeque<Outgoing>,
    /// Until when each request goes on a connection of its own.
    one_at_a_time_until: Option<Instant>,
}

impl Connections {
    /// Connections to `address`, whose requests fail when not answered within `timeout`.
    pub(in crate::webhooks) fn new(
        connector: Connector,
        address: Arc<Address>,
        timeout: Duration,
    ) -> Self {
        Self {
            connector,
            address,
            timeout,
            open: Vec::with_capacity(ONE_EACH),
            held: VecDeque::new(),
            one_at_a_time_until: None,
        }
    }

    /// Sends `request` on a connection, or holds it until one is free (see `hand_out`);
    /// its answer, or why there is none, comes back on the receiver. Must be called inside
    /// the runtime new connections run on.
    pub(in crate::webhooks) fn send(&mut self, request: Bytes) -> oneshot::Receiver<Answered> {
        let (answered, answer) = oneshot::channel();
        self.held.push_back(Outgoing { request, answered });
        self.hand_out();
        answer
    }

    /// Hands the held requests to connections while one can take them. Called again
    /// whenever an answer came back, which may have freed a connection.
    pub(in crate::webhooks) fn hand_out(&mut self) {
        while let Some(outgoing) = self.held.pop_front() {
            if let Err(held) = self.hand_over(outgoing) {
                self.held.push_front(held);
                return;
            }
        }
    }

    /// Gives `outgoing` to a connection; back when none can take it now.
    fn hand_over(&mut self, mut outgoing: Outgoing) -> Result<(), Outgoing> {
        loop {
            let Some(index) = self.choose() else {
                return Err(outgoing);
            };
            let pipe = &self.open[index];
            // Counted before it is handed over: the connection may answer it at once.
            pipe.counts.outstanding.fetch_add(1, Relaxed);
            pipe.counts.unwritten.fetch_add(1, Relaxed);
            match pipe.requests.send(outgoing) {
                Ok(()) => return Ok(()),
                // It ended since it was chosen.
                Err(mpsc::error::SendError(back)) => {
                    self.open.swap_remove(index);
                    outgoing = back;
                }
            }
        }
    }

    /// After a connection ended with requests unanswered: one request per connection for
    /// a while.
    pub(in crate::webhooks) fn one_at_a_time(&mut self) {
        self.one_at_a_time_until = Some(Instant::now() + ONE_AT_A_TIME);
    }

    /// The connection for the next request: one about to write others, while it has room;
    /// else an idle one; else a new one; else, while pipelining, the least busy. `None`
    /// when requests go one per connection and every connection is busy.
    fn choose(&mut self) -> Option<usize> {
        self.open.retain(|pipe| !pipe.requests.is_closed());
        let load = |pipe: &Pipe| pipe.counts.outstanding.load(Relaxed);
        let pipelining = self
            .one_at_a_time_until
            .is_none_or(|until| Instant::now() >= until);
        let joining = self.open.iter().position(|pipe| {
            pipelining && pipe.counts.unwritten.load(Relaxed) > 0 && load(pipe) < DEPTH
        });
        let idle = || self.open.iter().position(|pipe| load(pipe) == 0);
        if let Some(index) = joining.or_else(idle) {
            return Some(index);
        }
        let most = if pipelining { PIPELINED } else { ONE_EACH };
        if self.open.len() < most {
            self.open.push(self.start());
            return Some(self.open.len() - 1);
        }
        if !pipelining {
            return None;
        }
        (0..self.open.len()).min_by_key(|&index| load(&self.open[index]))
    }

    fn start(&self) -> Pipe {
        let (requests, taken) = mpsc::unbounded_channel();
        let counts = Arc::new(Counts::default());
        let open = self.connector.clone().open(Arc::clone(&self.address));
        tokio::spawn(connection::run(
            open,
            taken,
            Arc::clone(&counts),
            self.timeout,
        ));
        Pipe { requests, counts }
    }
}
