//! Client connections' limits, kept below HTTP: how many are open, how long one stays
//! silent, how long and how large a request head may be. HTTP says what a refusal answers.

pub mod head;

use std::{
    future::Future,
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
    time::Duration,
};

use poem::{
    http::uri::Scheme,
    listener::Acceptor,
    web::{LocalAddr, RemoteAddr},
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    sync::{OwnedSemaphorePermit, Semaphore},
    time::{Instant, Sleep},
};

use crate::config::ConnectionConfig;
use head::{HeadScanner, HeadVerdict};

/// How long a refused client may go on sending: long enough to finish and read the answer
/// (closing on its unread bytes would reset the connection), short enough to cost little.
const LINGER: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadRefusal {
    /// It did not arrive within `PLANTSTORE_HEADER_TIMEOUT`.
    TooSlow,
    UriTooLong,
    TooLarge,
}

/// The whole HTTP/1.1 answer a refused head gets, as bytes, before its connection closes.
pub type RefusalAnswer = fn(HeadRefusal) -> Vec<u8>;

/// Accepts a connection only while fewer than the cap are open, as a `ClientConnection`.
pub struct CappedAcceptor<A> {
    inner: A,
    slots: Arc<Semaphore>,
    limits: ConnectionConfig,
    answer: RefusalAnswer,
}

impl<A> CappedAcceptor<A> {
    pub fn new(inner: A, limits: ConnectionConfig, answer: RefusalAnswer) -> Self {
        Self {
            inner,
            slots: Arc::new(Semaphore::new((limits.max_connections as usize).max(1))),
            limits,
            answer,
        }
    }
}

impl<A: Acceptor> Acceptor for CappedAcceptor<A> {
    type Io = ClientConnection<A::Io>;

    fn local_addr(&self) -> Vec<LocalAddr> {
        self.inner.local_addr()
    }

    async fn accept(&mut self) -> io::Result<(Self::Io, LocalAddr, RemoteAddr, Scheme)> {
        let slot = Arc::clone(&self.slots)
            .acquire_owned()
            .await
            .map_err(io::Error::other)?;
        let (io, local, remote, scheme) = self.inner.accept().await?;
        let guarded = ClientConnection {
            io,
            _slot: slot,
            limits: self.limits,
            silence: Box::pin(tokio::time::sleep(self.limits.idle_timeout)),
            // The first head's clock runs from the connection's start.
            head_clock: Some(Box::pin(tokio::time::sleep(self.limits.header_timeout))),
            heads: HeadScanner::default(),
            answer: self.answer,
            refusal: None,
        };
        Ok((guarded, local, remote, scheme))
    }
}

/// A connection that frees its slot on close, fails its read after the idle timeout, and
/// answers a too slow or too large head itself: poem's idle timeout waits for ever on a
/// half-sent head, poem sets hyper no header timeout, and hyper's answer is a bare status.
pub struct ClientConnection<T> {
    io: T,
    _slot: OwnedSemaphorePermit,
    limits: ConnectionConfig,
    silence: Pin<Box<Sleep>>,
    /// Runs while a head is awaited or arriving; `None` between requests.
    head_clock: Option<Pin<Box<Sleep>>>,
    heads: HeadScanner,
    answer: RefusalAnswer,
    refusal: Option<RefusedHead>,
}

/// An answer written to a refused client, its later bytes drained for up to `LINGER`.
struct RefusedHead {
    answer: Vec<u8>,
    written: usize,
    shut: bool,
    linger: Pin<Box<Sleep>>,
}

impl<T: AsyncRead + AsyncWrite + Unpin> ClientConnection<T> {
    fn refuse(&mut self, refusal: HeadRefusal) {
        self.refusal = Some(RefusedHead {
            answer: (self.answer)(refusal),
            written: 0,
            shut: false,
            linger: Box::pin(tokio::time::sleep(LINGER)),
        });
    }

    /// Writes the refusal, then drains the client until it stops or `LINGER` passes;
    /// `Ready(Ok)` with nothing read is the end of stream hyper then sees.
    fn poll_refused_head(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Some(refusal) = self.refusal.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let io = &mut self.io;
        while refusal.written < refusal.answer.len() {
            let n = ready!(Pin::new(&mut *io).poll_write(cx, &refusal.answer[refusal.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            refusal.written += n;
        }
        if !refusal.shut {
            ready!(Pin::new(&mut *io).poll_flush(cx))?;
            ready!(Pin::new(&mut *io).poll_shutdown(cx))?;
            refusal.shut = true;
        }
        let mut scratch = [0u8; 8192];
        loop {
            if refusal.linger.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Ok(()));
            }
            let mut drain = ReadBuf::new(&mut scratch);
            match ready!(Pin::new(&mut *io).poll_read(cx, &mut drain)) {
                Ok(()) if !drain.filled().is_empty() => continue,
                _ => return Poll::Ready(Ok(())),
            }
        }
    }

    fn inspect(&mut self, bytes: &[u8]) -> Result<(), HeadRefusal> {
        match self.heads.feed(bytes) {
            HeadVerdict::WithinLimits => {}
            HeadVerdict::UriTooLong => return Err(HeadRefusal::UriTooLong),
            HeadVerdict::HeadTooLarge => return Err(HeadRefusal::TooLarge),
        }
        if !self.heads.awaiting_head() {
            self.head_clock = None;
        } else if self.heads.in_head() && self.head_clock.is_none() {
            self.head_clock = Some(Box::pin(tokio::time::sleep(self.limits.header_timeout)));
        }
        Ok(())
    }

    /// Pending read: has the client been silent too long, or its head too slow?
    fn poll_clocks(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.silence.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::ErrorKind::TimedOut.into()));
        }
        let Some(clock) = self.head_clock.as_mut() else {
            return Poll::Pending;
        };
        ready!(clock.as_mut().poll(cx));
        self.head_clock = None;
        if !self.heads.in_head() {
            // Nothing of a request arrived: nobody to answer.
            return Poll::Ready(Err(io::ErrorKind::TimedOut.into()));
        }
        self.refuse(HeadRefusal::TooSlow);
        self.poll_refused_head(cx)
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for ClientConnection<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.refusal.is_some() {
            return this.poll_refused_head(cx);
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let deadline = Instant::now() + this.limits.idle_timeout;
                this.silence.as_mut().reset(deadline);
                match this.inspect(&buf.filled()[before..]) {
                    Ok(()) => Poll::Ready(Ok(())),
                    Err(error) => {
                        // hyper never sees the refused bytes.
                        buf.set_filled(before);
                        this.refuse(error);
                        this.poll_refused_head(cx)
                    }
                }
            }
            Poll::Ready(Err(err)) => Poll::Ready(Err(err)),
            Poll::Pending => this.poll_clocks(cx),
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ClientConnection<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.heads.answered();
        Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.heads.answered();
        Pin::new(&mut this.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
