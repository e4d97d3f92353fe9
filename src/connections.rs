//! Client connections: how many may be open at once (`PLANTSTORE_MAX_CONNECTIONS`), and
//! how long one may stay silent while the server waits to read (`PLANTSTORE_IDLE_TIMEOUT`).

use std::{
    future::Future,
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
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

/// Accepts a connection only while fewer than the cap are open; past it, new ones wait in
/// the kernel's backlog until one closes. Every connection it hands out is `Guarded`.
pub struct CappedAcceptor<A> {
    inner: A,
    slots: Arc<Semaphore>,
    idle_timeout: Duration,
}

impl<A> CappedAcceptor<A> {
    pub fn new(inner: A, max_open: usize, idle_timeout: Duration) -> Self {
        Self {
            inner,
            slots: Arc::new(Semaphore::new(max_open.max(1))),
            idle_timeout,
        }
    }
}

impl<A: Acceptor> Acceptor for CappedAcceptor<A> {
    type Io = Guarded<A::Io>;

    fn local_addr(&self) -> Vec<LocalAddr> {
        self.inner.local_addr()
    }

    async fn accept(&mut self) -> io::Result<(Self::Io, LocalAddr, RemoteAddr, Scheme)> {
        let slot = Arc::clone(&self.slots)
            .acquire_owned()
            .await
            .map_err(io::Error::other)?;
        let (io, local, remote, scheme) = self.inner.accept().await?;
        let guarded = Guarded {
            io,
            _slot: slot,
            idle_timeout: self.idle_timeout,
            silence: Box::pin(tokio::time::sleep(self.idle_timeout)),
        };
        Ok((guarded, local, remote, scheme))
    }
}

/// A connection that gives its slot back when it closes, and fails its read when the
/// client has sent nothing for the idle timeout. Done here, below HTTP, because poem's own
/// idle timeout shuts a connection down gracefully, which waits forever for a request
/// whose header stopped halfway.
pub struct Guarded<T> {
    io: T,
    _slot: OwnedSemaphorePermit,
    idle_timeout: Duration,
    silence: Pin<Box<Sleep>>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Guarded<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(read) => {
                let deadline = Instant::now() + this.idle_timeout;
                this.silence.as_mut().reset(deadline);
                Poll::Ready(read)
            }
            Poll::Pending => match this.silence.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(io::ErrorKind::TimedOut.into())),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Guarded<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
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
