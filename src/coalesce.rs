//! A connection's writes gathered into fewer, larger socket writes.
//!
//! HTTP/2 caps a DATA frame at the size the peer accepts, 16 KiB unless the peer asks for
//! more, which grpc-go (ADBC's Flight SQL driver) does not. The `h2` crate hands the
//! socket one DATA frame at a time and flushes after each, so a streamed read of 80 MB took
//! about five thousand `writev` calls, each with its own pass through the TCP stack (on
//! loopback, the receiver's side of it too). [`Coalescing`] copies what the connection writes
//! into a buffer and sends it when [`COALESCE_BYTES`] have gathered, or when the connection
//! flushes and has nothing more to write right away: a flush that follows fresh writes is
//! answered at once and the connection's task is woken to poll again, and the flush it then
//! makes with nothing written since sends what is held. So a reply waits at most one more
//! poll of its connection, and a stream goes out in writes of [`COALESCE_BYTES`].

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// Bytes gathered before they are written without waiting for a flush.
pub const COALESCE_BYTES: usize = 256 << 10;

/// A stream whose writes are gathered before they reach `inner` (see the module's notes).
#[derive(Debug)]
pub struct Coalescing<T> {
    inner: T,
    /// Bytes written to this stream and not yet to `inner`, from `at` on.
    held: Vec<u8>,
    at: usize,
    /// Whether bytes were written since the last flush.
    fresh: bool,
}

impl<T> Coalescing<T> {
    /// `inner` with its writes gathered.
    pub fn new(inner: T) -> Self {
        Self {
            inner,
            held: Vec::new(),
            at: 0,
            fresh: false,
        }
    }
}

impl<T: AsyncWrite + Unpin> Coalescing<T> {
    /// Writes everything held to `inner`.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some(rest) = self.held.get(self.at..).filter(|rest| !rest.is_empty()) {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, rest))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.at += n;
        }
        self.held.clear();
        self.at = 0;
        Poll::Ready(Ok(()))
    }

    /// Takes `data` (`len` bytes in all): held, after what is held is sent if that has
    /// reached [`COALESCE_BYTES`]; or, when `data` alone is that large, written to `inner`
    /// straight away, after what is held. So at most twice [`COALESCE_BYTES`] are held,
    /// in a buffer allocated once for as long as the connection keeps writing.
    fn poll_take(
        &mut self,
        cx: &mut Context<'_>,
        data: &[IoSlice<'_>],
        len: usize,
    ) -> Poll<io::Result<usize>> {
        if self.held.len() >= COALESCE_BYTES || len >= COALESCE_BYTES {
            ready!(self.poll_send(cx))?;
        }
        if len >= COALESCE_BYTES {
            return Pin::new(&mut self.inner).poll_write_vectored(cx, data);
        }
        if self.held.capacity() == 0 {
            self.held.reserve_exact(2 * COALESCE_BYTES);
        }
        for slice in data {
            self.held.extend_from_slice(slice);
        }
        self.fresh = true;
        Poll::Ready(Ok(len))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Coalescing<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Coalescing<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .poll_take(cx, &[IoSlice::new(data)], data.len())
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let len = data.iter().map(|slice| slice.len()).sum();
        self.get_mut().poll_take(cx, data, len)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.fresh && this.held.len() < COALESCE_BYTES {
            // More may follow as soon as the connection polls again: hold these one turn.
            this.fresh = false;
            cx.waker().wake_by_ref();
            return Poll::Ready(Ok(()));
        }
        this.fresh = false;
        ready!(this.poll_send(cx))?;
        // An idle connection keeps no buffer.
        this.held = Vec::new();
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

impl<T: Connected> Connected for Coalescing<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, DuplexStream, duplex};

    use super::*;

    /// One end of an in-memory pipe that counts the writes it is given.
    struct Counted {
        inner: DuplexStream,
        writes: usize,
    }

    impl AsyncWrite for Counted {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            data: &[u8],
        ) -> Poll<io::Result<usize>> {
            let this = self.get_mut();
            this.writes += 1;
            Pin::new(&mut this.inner).poll_write(cx, data)
        }

        fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().inner).poll_flush(cx)
        }

        fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
        }
    }

    /// A waker that counts its wakes.
    #[derive(Default)]
    struct Wakes(AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }

        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A pipe wide enough that no write of these tests waits, its writing end coalesced.
    fn pipe() -> (Coalescing<Counted>, DuplexStream) {
        let (ours, theirs) = duplex(16 << 20);
        (
            Coalescing::new(Counted {
                inner: ours,
                writes: 0,
            }),
            theirs,
        )
    }

    /// What the peer can read without waiting.
    fn readable(peer: &mut DuplexStream) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = vec![0; 64 << 10];
        let mut cx = Context::from_waker(std::task::Waker::noop());
        loop {
            let mut read = ReadBuf::new(&mut buf);
            match Pin::new(&mut *peer).poll_read(&mut cx, &mut read) {
                Poll::Ready(Ok(())) if !read.filled().is_empty() => {
                    out.extend_from_slice(read.filled());
                }
                _ => return out,
            }
        }
    }

    /// Writes all of `data` (held or sent, as the stream decides).
    async fn put(stream: &mut Coalescing<Counted>, data: &[u8]) {
        stream
            .write_all(data)
            .await
            .unwrap_or_else(|err| panic!("{err}"));
    }

    /// One `poll_flush`, as a connection's task makes it, with `counter` as its waker.
    fn flush_once(stream: &mut Coalescing<Counted>, counter: &Arc<Wakes>) -> Poll<io::Result<()>> {
        let waker = std::task::Waker::from(Arc::clone(counter));
        Pin::new(stream).poll_flush(&mut Context::from_waker(&waker))
    }

    #[tokio::test]
    async fn frames_written_in_one_turn_reach_the_socket_in_one_write() {
        let (mut stream, mut peer) = pipe();
        let wakes = Arc::new(Wakes::default());
        let frames: Vec<Vec<u8>> = (0_u8..40).map(|i| vec![i; 16 << 10]).collect();
        for frame in &frames {
            put(&mut stream, frame).await;
            // What h2 does after each DATA frame: the flush is answered, the bytes held.
            assert!(matches!(
                flush_once(&mut stream, &wakes),
                Poll::Ready(Ok(()))
            ));
        }
        // 640 KiB in 16 KiB frames: sent in writes of `COALESCE_BYTES`, as each buffer
        // fills, and the rest held until the connection, woken, flushes with nothing new.
        assert_eq!(stream.inner.writes, 2, "two full buffers sent");
        let early = readable(&mut peer);
        assert_eq!(early.len(), 2 * COALESCE_BYTES);
        assert!(
            wakes.0.load(Ordering::SeqCst) > 0,
            "a held flush wakes the connection"
        );
        assert!(matches!(
            flush_once(&mut stream, &wakes),
            Poll::Ready(Ok(()))
        ));
        assert_eq!(stream.inner.writes, 3);
        let late = readable(&mut peer);
        assert_eq!([early, late].concat(), frames.concat());
    }

    #[tokio::test]
    async fn a_lone_reply_goes_out_at_the_second_flush() {
        let (mut stream, mut peer) = pipe();
        let wakes = Arc::new(Wakes::default());
        put(&mut stream, b"reply").await;
        assert!(matches!(
            flush_once(&mut stream, &wakes),
            Poll::Ready(Ok(()))
        ));
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
        assert!(readable(&mut peer).is_empty(), "held for one turn");
        assert!(matches!(
            flush_once(&mut stream, &wakes),
            Poll::Ready(Ok(()))
        ));
        assert_eq!(
            wakes.0.load(Ordering::SeqCst),
            1,
            "no wake once nothing is held"
        );
        assert_eq!(readable(&mut peer), b"reply");
        // `flush` polls until done: what a caller that awaits it sees.
        put(&mut stream, b"second").await;
        stream.flush().await.unwrap_or_else(|err| panic!("{err}"));
        assert!(readable(&mut peer).is_empty());
        stream.flush().await.unwrap_or_else(|err| panic!("{err}"));
        assert_eq!(readable(&mut peer), b"second");
    }

    #[tokio::test]
    async fn a_large_write_with_nothing_held_is_not_copied() {
        let (mut stream, mut peer) = pipe();
        let big = vec![7_u8; 2 * COALESCE_BYTES];
        put(&mut stream, &big).await;
        assert_eq!(stream.inner.writes, 1);
        assert!(stream.held.capacity() == 0, "nothing was copied");
        assert_eq!(readable(&mut peer), big);
    }

    #[tokio::test]
    async fn a_large_write_goes_after_what_is_held() {
        let (mut stream, mut peer) = pipe();
        put(&mut stream, b"head").await;
        let big = vec![9_u8; COALESCE_BYTES];
        put(&mut stream, &big).await;
        assert_eq!(
            stream.inner.writes, 2,
            "what was held, then the large write"
        );
        assert!(stream.held.capacity() <= 2 * COALESCE_BYTES);
        assert_eq!(readable(&mut peer), [&b"head"[..], &big].concat());
    }

    #[tokio::test]
    async fn shutdown_sends_what_is_held() {
        let (mut stream, mut peer) = pipe();
        put(&mut stream, b"last words").await;
        stream
            .shutdown()
            .await
            .unwrap_or_else(|err| panic!("{err}"));
        let mut all = Vec::new();
        peer.read_to_end(&mut all)
            .await
            .unwrap_or_else(|err| panic!("{err}"));
        assert_eq!(all, b"last words");
    }
}
