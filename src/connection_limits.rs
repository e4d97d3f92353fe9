//! Client connections' limits, kept below HTTP: how many may be open at once
//! (`PLANTSTORE_MAX_CONNECTIONS`), how long one may stay silent (`PLANTSTORE_IDLE_TIMEOUT`),
//! how long a request head may take to arrive (`PLANTSTORE_HEADER_TIMEOUT`) and how large
//! it may be. The HTTP layer says what a refused head is answered with.

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

/// How long a refused client may go on sending before its connection is dropped: long
/// enough for it to finish sending and read the answer (closing with its bytes unread
/// would reset the connection and lose the answer), short enough to cost little.
const LINGER: Duration = Duration::from_secs(2);

/// Why a request head was refused before HTTP saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadRefusal {
    /// It did not arrive within `PLANTSTORE_HEADER_TIMEOUT`.
    TooSlow,
    /// Its request line is longer than `head::MAX_HEAD_BYTES`.
    UriTooLong,
    /// It is longer than `head::MAX_HEAD_BYTES` or has more than `head::MAX_HEADER_LINES`.
    TooLarge,
}

/// The whole HTTP/1.1 answer, as bytes, that a refused head gets before its connection
/// closes.
pub type RefusalAnswer = fn(HeadRefusal) -> Vec<u8>;

/// Accepts a connection only while fewer than the cap are open; past it, new ones wait in
/// the kernel's backlog until one closes. Every connection it hands out is a `ClientConnection`.
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

/// A connection that gives its slot back when it closes; fails its read when the client
/// has sent nothing for the idle timeout; and answers a request head that is too slow or
/// too large itself, with the answer the HTTP layer gave, then closes. Done here, below
/// HTTP, because poem's idle timeout waits forever for a head that stopped halfway, poem
/// sets no header timeout on hyper, and hyper answers an oversized head with a bare status.
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

/// An answer being written to a refused client, then its remaining bytes read and dropped
/// for up to `LINGER`, then end of stream for hyper.
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

    /// Looks at bytes just read: starts or stops the head clock, or refuses the head.
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

pub mod head {
    //! Where each HTTP/1 request head starts and ends on a connection, read from the bytes
    //! as they arrive, so a head too long, with too many lines or too slow can be answered
    //! before hyper, which would answer with a bare status and no body.

    /// Longest request head accepted (request line and header lines), far under hyper's own
    /// buffer limit so the answer is always ours.
    pub const MAX_HEAD_BYTES: usize = 64 * 1024;
    /// Most header lines accepted: hyper's own limit, which it answers with a bare 431.
    pub const MAX_HEADER_LINES: usize = 100;

    /// What the bytes so far say about the connection.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum HeadVerdict {
        /// Nothing to object to.
        WithinLimits,
        /// The request line alone is longer than `MAX_HEAD_BYTES`.
        UriTooLong,
        /// The head is longer than `MAX_HEAD_BYTES` or has more than `MAX_HEADER_LINES` lines.
        HeadTooLarge,
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
    enum Phase {
        /// Between requests: no byte of the next head yet (blank lines before it are skipped).
        #[default]
        Idle,
        /// Inside a head.
        Head,
        /// The head is complete; what follows is its body until the server answers.
        Body,
        /// HTTP/2 (prior knowledge): its frames are not heads, so nothing is watched.
        Off,
    }

    /// Follows one connection's heads. Lines end in LF, with or without CR before it, as
    /// hyper's parser takes them; a blank line ends the head.
    #[derive(Debug, Default)]
    pub struct HeadScanner {
        phase: Phase,
        head_bytes: usize,
        lines_done: usize,
        line_len: usize,
        first_head_done: bool,
        /// The start of the first request line, to spot the HTTP/2 preface.
        request_line: [u8; PREFACE.len()],
    }

    const PREFACE: &[u8] = b"PRI * HTTP/2.0";

    impl HeadScanner {
        /// True while part of a head has arrived and its end has not.
        pub fn in_head(&self) -> bool {
            self.phase == Phase::Head
        }

        /// True while the next head's bytes are awaited or arriving (the header deadline runs).
        pub fn awaiting_head(&self) -> bool {
            matches!(self.phase, Phase::Idle | Phase::Head)
        }

        /// The server started writing an answer: what the client sends next is a new head.
        /// (No operation reads a body, so hyper never writes `100 Continue` mid-body: the
        /// test `no_operation_reads_a_request_body` holds the service to that.)
        pub fn answered(&mut self) {
            if self.phase == Phase::Body {
                self.phase = Phase::Idle;
            }
        }

        /// Takes the bytes just read. Once it returns anything but `WithinLimits`, the connection is
        /// to be answered and closed; later calls are meaningless.
        pub fn feed(&mut self, bytes: &[u8]) -> HeadVerdict {
            for &byte in bytes {
                match self.phase {
                    Phase::Body | Phase::Off => return HeadVerdict::WithinLimits,
                    Phase::Idle if matches!(byte, b'\r' | b'\n') => continue,
                    Phase::Idle => self.start_head(),
                    Phase::Head => {}
                }
                if let Some(verdict) = self.take(byte) {
                    return verdict;
                }
            }
            HeadVerdict::WithinLimits
        }

        fn start_head(&mut self) {
            self.phase = Phase::Head;
            self.head_bytes = 0;
            self.lines_done = 0;
            self.line_len = 0;
        }

        /// One byte of a head; `Some` when the head is refused.
        fn take(&mut self, byte: u8) -> Option<HeadVerdict> {
            self.head_bytes += 1;
            if self.head_bytes > MAX_HEAD_BYTES {
                return Some(if self.lines_done == 0 {
                    HeadVerdict::UriTooLong
                } else {
                    HeadVerdict::HeadTooLarge
                });
            }
            match byte {
                b'\n' => self.end_line(),
                b'\r' => {}
                _ => {
                    if self.line_len == 0 && self.lines_done > MAX_HEADER_LINES {
                        return Some(HeadVerdict::HeadTooLarge);
                    }
                    if self.lines_done == 0 && self.line_len < PREFACE.len() {
                        self.request_line[self.line_len] = byte;
                    }
                    self.line_len += 1;
                }
            }
            None
        }

        fn end_line(&mut self) {
            if self.line_len == 0 {
                self.phase = Phase::Body;
                self.first_head_done = true;
                return;
            }
            if self.lines_done == 0 && !self.first_head_done && self.request_line == *PREFACE {
                self.phase = Phase::Off;
                return;
            }
            self.lines_done += 1;
            self.line_len = 0;
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn head_with(headers: usize) -> Vec<u8> {
            let mut head = b"DELETE /plants/1 HTTP/1.1\r\n".to_vec();
            for n in 0..headers {
                head.extend_from_slice(format!("x-h{n}: v\r\n").as_bytes());
            }
            head.extend_from_slice(b"\r\n");
            head
        }

        #[test]
        fn a_whole_head_byte_by_byte_then_its_body_then_the_next_head() {
            let mut scanner = HeadScanner::default();
            assert!(scanner.awaiting_head() && !scanner.in_head());
            for byte in head_with(3) {
                assert_eq!(scanner.feed(&[byte]), HeadVerdict::WithinLimits);
            }
            assert!(!scanner.awaiting_head());
            assert_eq!(
                scanner.feed(&[b'x'; MAX_HEAD_BYTES * 2]),
                HeadVerdict::WithinLimits
            );
            scanner.answered();
            assert!(scanner.awaiting_head() && !scanner.in_head());
            assert_eq!(
                scanner.feed(b"\r\nGET / HTTP/1.1\r\n"),
                HeadVerdict::WithinLimits
            );
            assert!(scanner.in_head());
        }

        #[test]
        fn hyper_s_header_count_is_the_limit() {
            let mut scanner = HeadScanner::default();
            assert_eq!(
                scanner.feed(&head_with(MAX_HEADER_LINES)),
                HeadVerdict::WithinLimits
            );
            assert!(!scanner.awaiting_head());
            let mut scanner = HeadScanner::default();
            assert_eq!(
                scanner.feed(&head_with(MAX_HEADER_LINES + 1)),
                HeadVerdict::HeadTooLarge
            );
        }

        #[test]
        fn a_long_request_line_is_414_and_a_long_header_431() {
            let mut scanner = HeadScanner::default();
            let long_path = format!("DELETE /{} HTTP/1.1\r\n\r\n", "a".repeat(MAX_HEAD_BYTES));
            assert_eq!(scanner.feed(long_path.as_bytes()), HeadVerdict::UriTooLong);
            let mut scanner = HeadScanner::default();
            let long_header = format!(
                "GET / HTTP/1.1\r\nx: {}\r\n\r\n",
                "a".repeat(MAX_HEAD_BYTES)
            );
            assert_eq!(
                scanner.feed(long_header.as_bytes()),
                HeadVerdict::HeadTooLarge
            );
        }

        #[test]
        fn http2_prior_knowledge_is_left_alone() {
            let mut scanner = HeadScanner::default();
            assert_eq!(
                scanner.feed(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
                HeadVerdict::WithinLimits
            );
            assert_eq!(
                scanner.feed(&[0; MAX_HEAD_BYTES * 2]),
                HeadVerdict::WithinLimits
            );
            assert!(!scanner.awaiting_head());
        }
    }
}
