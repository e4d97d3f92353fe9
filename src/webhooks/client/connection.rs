//! One keep-alive connection to a receiver, run as a task of its own: requests written as
//! they come (those that come together in one write, pipelined) and answers read in order.

use std::{
    collections::VecDeque,
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering::Relaxed},
    },
    time::Duration,
};

use bytes::{Bytes, BytesMut};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    sync::{mpsc, oneshot},
    time::{Instant, sleep_until, timeout_at},
};

use super::{
    answer::{self, Answer, Read},
    connector::Stream,
};

/// How long a connection may sit unused before it is closed: under the keep-alive limits
/// receivers commonly set (Node's 5 s, nginx's 75 s), so a connection in use is rarely one
/// the receiver is closing at that moment.
const IDLE: Duration = Duration::from_secs(2);

/// Why a request got no answer a delivery can take.
#[derive(Debug)]
pub(in crate::webhooks) enum NoAnswer {
    /// The attempt failed: the receiver did not answer in time, or not in HTTP.
    Failed(String),
    /// The connection ended before this request's answer for a reason of its own (the
    /// receiver closed it, or an earlier answer was late): worth sending again at once.
    Unanswered(String),
}

pub(in crate::webhooks) type Answered = Result<Answer, NoAnswer>;

/// A request for the connection, and where its answer goes.
pub(super) struct Outgoing {
    pub(super) request: Bytes,
    pub(super) answered: oneshot::Sender<Answered>,
}

/// What the endpoint's side sees of a connection's queue.
#[derive(Default)]
pub(super) struct Counts {
    /// Requests taken and not yet answered.
    pub(super) outstanding: AtomicUsize,
    /// Requests taken that the connection has not yet picked up to write.
    pub(super) unwritten: AtomicUsize,
}

/// A request written and waiting for its answer.
struct Waiting {
    answered: oneshot::Sender<Answered>,
    deadline: Instant,
}

/// Runs one connection: opens it, then carries requests until the endpoint's side drops
/// its sender, the connection has sat unused for [`IDLE`], or it fails. Every request
/// taken gets an answer or a reason.
pub(super) async fn run(
    open: impl Future<Output = Result<Box<dyn Stream>, String>>,
    requests: mpsc::UnboundedReceiver<Outgoing>,
    counts: Arc<Counts>,
    timeout: Duration,
) {
    let mut connection = Connection {
        requests,
        counts,
        timeout,
        waiting: VecDeque::new(),
    };
    let opened = timeout_at(Instant::now() + timeout, open).await;
    let end = match opened {
        Ok(Ok(stream)) => connection.carry(stream).await,
        Ok(Err(err)) => NoAnswer::Failed(err),
        Err(_) => NoAnswer::Failed("cannot connect within the timeout".into()),
    };
    connection.end(end);
}

struct Connection {
    requests: mpsc::UnboundedReceiver<Outgoing>,
    counts: Arc<Counts>,
    timeout: Duration,
    waiting: VecDeque<Waiting>,
}

impl Connection {
    /// Carries requests over `stream`; why it stopped.
    async fn carry(&mut self, mut stream: Box<dyn Stream>) -> NoAnswer {
        let mut input = BytesMut::with_capacity(8 * 1024);
        let mut output = Vec::with_capacity(8 * 1024);
        let mut idle_since = Instant::now();
        // One timer, moved rather than made anew each round: for the first answer's
        // deadline while any is awaited, else for the end of the idle time.
        let timer = sleep_until(idle_since + IDLE);
        tokio::pin!(timer);
        loop {
            let late = self.waiting.front().map(|waiting| waiting.deadline);
            let wake = late.unwrap_or(idle_since + IDLE);
            if timer.deadline() != wake {
                timer.as_mut().reset(wake);
            }
            tokio::select! {
                // Answers first: each frees room for another request.
                biased;
                read = stream.read_buf(&mut input) => match read {
                    Ok(0) => return NoAnswer::Unanswered("the receiver closed the connection".into()),
                    Err(err) => return NoAnswer::Unanswered(format!("the connection failed: {err}")),
                    Ok(_) => match self.answers(&mut input) {
                        // Bytes that keep coming finish no answer past its deadline.
                        Ok(true) if self.waiting.front().is_some_and(|first| Instant::now() >= first.deadline) => {
                            return self.fail_first("no answer within the timeout".into());
                        }
                        Ok(true) => idle_since = Instant::now(),
                        Ok(false) => {
                            return NoAnswer::Unanswered("the receiver closed the connection after an earlier answer".into());
                        }
                        Err(bad) => return self.fail_first(bad),
                    },
                },
                () = &mut timer => {
                    if late.is_some() {
                        return self.fail_first("no answer within the timeout".into());
                    }
                    // A request handed over as the idle time ran out is carried: refused,
                    // it would count as unanswered and end pipelining for a minute.
                    if !self.requests.is_empty() {
                        idle_since = Instant::now();
                        continue;
                    }
                    return NoAnswer::Unanswered("the connection was closed unused".into());
                }
                taken = self.requests.recv() => {
                    let Some(first) = taken else {
                        return NoAnswer::Unanswered("delivery stopped".into());
                    };
                    self.take(first, &mut output);
                    let deadline = self.waiting.back().map_or_else(Instant::now, |w| w.deadline);
                    let written = timeout_at(deadline, async {
                        stream.write_all(&output).await?;
                        stream.flush().await
                    }).await;
                    output.clear();
                    match written {
                        Ok(Ok(())) => {}
                        Ok(Err(err)) => return NoAnswer::Unanswered(format!("the connection failed: {err}")),
                        Err(_) => return self.fail_first("no answer within the timeout".into()),
                    }
                }
            }
        }
    }

    /// Takes `first` and every request queued behind it, to go in one write.
    fn take(&mut self, first: Outgoing, output: &mut Vec<u8>) {
        let deadline = Instant::now() + self.timeout;
        let mut next = Some(first);
        while let Some(Outgoing { request, answered }) = next {
            output.extend_from_slice(&request);
            self.waiting.push_back(Waiting { answered, deadline });
            next = self.requests.try_recv().ok();
        }
        self.counts.unwritten.store(0, Relaxed);
    }

    /// Hands out every whole answer in `input`; whether the connection carries more.
    fn answers(&mut self, input: &mut BytesMut) -> Result<bool, String> {
        loop {
            match answer::read(input) {
                Read::Partial => return Ok(true),
                Read::Bad(err) => return Err(err),
                Read::Interim { used } => {
                    let _ = input.split_to(used);
                }
                Read::Whole { answer, used, last } => {
                    let Some(waiting) = self.waiting.pop_front() else {
                        return Err("the receiver answered a request never sent".into());
                    };
                    self.counts.outstanding.fetch_sub(1, Relaxed);
                    // The attempt may have been given up on; its answer then goes nowhere.
                    let _ = waiting.answered.send(Ok(answer));
                    if last {
                        return Ok(false);
                    }
                    let _ = input.split_to(used);
                }
            }
        }
    }

    /// The first request waiting fails with `error`; the connection ends.
    fn fail_first(&mut self, error: String) -> NoAnswer {
        if let Some(first) = self.waiting.pop_front() {
            self.counts.outstanding.fetch_sub(1, Relaxed);
            let _ = first.answered.send(Err(NoAnswer::Failed(error.clone())));
        }
        NoAnswer::Unanswered(format!(
            "an earlier request on the connection failed: {error}"
        ))
    }

    /// Every request still waiting, or queued and never written, gets `why`: the same
    /// reason, so an attempt never waits on a connection that is gone.
    fn end(mut self, why: NoAnswer) {
        self.requests.close();
        let queued = std::iter::from_fn(|| self.requests.try_recv().ok()).map(|out| out.answered);
        let waiting = self.waiting.drain(..).map(|waiting| waiting.answered);
        for answered in waiting.chain(queued).collect::<Vec<_>>() {
            self.counts.outstanding.fetch_sub(1, Relaxed);
            let why = match &why {
                NoAnswer::Failed(err) => NoAnswer::Failed(err.clone()),
                NoAnswer::Unanswered(err) => NoAnswer::Unanswered(err.clone()),
            };
            let _ = answered.send(Err(why));
        }
    }
}
