//! The gateway's connections, bounded: at most [`MAX_CONNECTIONS`] are open at once. Each
//! accepted connection holds a place for its whole life; with every place taken, the next
//! is not accepted (it waits in the kernel's queue) until one closes, so idle or slow
//! clients cannot make the gateway hold more sockets, buffers and tasks than that. A
//! connection on which no byte moved either way for [`IDLE`] is closed, so idle clients
//! cannot hold every place for ever either (a stream says something every 15 s).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// The most connections open at once.
pub const MAX_CONNECTIONS: usize = 256;
/// How long a connection may stay without a byte read or written. A call being answered
/// moves no byte either: a blocking `SendMessage` waits for the verdict, then for the task,
/// before it writes a byte, so the connection must outlast both waits.
pub const IDLE: Duration = Duration::from_secs(120);
const _: () = assert!(
    IDLE.as_secs()
        > crate::server::VERDICT_WITHIN.as_secs() + crate::server::BLOCK_FOR.as_secs() + 30,
    "a blocking send's connection would be closed as idle before its answer"
);

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
    /// Ends the connection once nothing moved on it for `idle`.
    quiet: Pin<Box<Sleep>>,
    idle: Duration,
}

impl Connection {
    fn new(stream: TcpStream, place: OwnedSemaphorePermit, idle: Duration) -> Connection {
        Connection {
            stream,
            _place: place,
            quiet: Box::pin(tokio::time::sleep(idle)),
            idle,
        }
    }

    /// A byte moved: the connection is not idle.
    fn moved(&mut self) {
        let until = Instant::now() + self.idle;
        self.quiet.as_mut().reset(until);
    }

    /// What a write said: bytes written mean the connection is not idle; a write that must
    /// wait, waits unless it was idle too long.
    fn wrote(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match poll {
            Poll::Pending => self.waiting(cx),
            Poll::Ready(result) => {
                if result.as_ref().is_ok_and(|n| *n > 0) {
                    self.moved();
                }
                Poll::Ready(result)
            }
        }
    }

    /// What a read or write that must wait says: wait, unless the connection was idle too
    /// long.
    fn waiting<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        match self.quiet.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "nothing moved on the connection for too long",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
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
        (Connection::new(stream, place, IDLE), addr)
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
        let before = buf.filled().len();
        match Pin::new(&mut self.stream).poll_read(cx, buf) {
            Poll::Pending => self.waiting(cx),
            Poll::Ready(result) => {
                if buf.filled().len() > before {
                    self.moved();
                }
                Poll::Ready(result)
            }
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.wrote(cx, poll)
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
        let poll = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.wrote(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Read what the connection has, as the HTTP server does.
    async fn read(server: &mut Connection, buf: &mut [u8]) -> io::Result<usize> {
        let mut buf = ReadBuf::new(buf);
        std::future::poll_fn(|cx| Pin::new(&mut *server).poll_read(cx, &mut buf)).await?;
        Ok(buf.filled().len())
    }

    /// A connection that moves bytes stays; one on which nothing moves for the idle time is
    /// closed, whether it sent nothing or half a request.
    #[tokio::test]
    async fn a_connection_on_which_nothing_moves_is_closed() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let places = Arc::new(Semaphore::new(1));
        let idle = Duration::from_millis(300);
        let client = TcpStream::connect(addr).await.unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        let place = Arc::clone(&places).acquire_owned().await.unwrap();
        let mut server = Connection::new(stream, place, idle);
        // Bytes that keep coming, each within the idle time, are read.
        let began = std::time::Instant::now();
        let mut buf = [0u8; 16];
        let mut last_moved = began;
        for _ in 0..4 {
            client.writable().await.unwrap();
            assert_eq!(client.try_write(b"GET").unwrap(), 3);
            let n = read(&mut server, &mut buf).await.unwrap();
            assert_eq!(&buf[..n], b"GET");
            last_moved = std::time::Instant::now();
            tokio::time::sleep(idle / 2).await;
        }
        assert!(
            began.elapsed() > idle,
            "outlived one idle time while bytes moved"
        );
        // Then nothing: the read ends with an error once the idle time is out, counted from
        // the last byte.
        let error = read(&mut server, &mut buf).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        let quiet = last_moved.elapsed();
        assert!(quiet >= idle.mul_f32(0.9), "{quiet:?}");
        drop(server);
        // Its place is free again.
        assert_eq!(places.available_permits(), 1);
    }
}
