//! The gateway's connections, bounded: at most [`MAX_CONNECTIONS`] are open at once. Each
//! accepted connection holds a place for its whole life; with every place taken, the next
//! is not accepted (it waits in the kernel's queue) until one closes, so idle or slow
//! clients cannot make the gateway hold more sockets, buffers and tasks than that.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The most connections open at once.
pub const MAX_CONNECTIONS: usize = 256;

/// A listener that accepts a connection only when it has a place for it.
pub struct Bounded {
    inner: TcpListener,
    places: Arc<Semaphore>,
}

impl Bounded {
    pub fn new(inner: TcpListener) -> Bounded {
        Bounded {
            inner,
            places: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
        }
    }
}

/// An accepted connection and its place.
pub struct Connection {
    stream: TcpStream,
    _place: OwnedSemaphorePermit,
}

impl axum::serve::Listener for Bounded {
    type Io = Connection;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Connection, std::net::SocketAddr) {
        let place = Arc::clone(&self.places)
            .acquire_owned()
            .await
            .expect("the places are never closed");
        let (stream, addr) = axum::serve::Listener::accept(&mut self.inner).await;
        (
            Connection {
                stream,
                _place: place,
            },
            addr,
        )
    }

    fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.inner.local_addr()
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
