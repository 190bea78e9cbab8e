//! A stream read ahead of its consumer by a task of its own, so that producing the items (an
//! upload's decoding, a scan's store reads) and consuming them run on two cores.

use futures::StreamExt as _;
use futures::stream::{self, BoxStream};

use crate::error::{Error, Result};

/// `items` read by a task of its own, at most `ahead` items (at least one) before the caller
/// takes them, in order; the first error ends the stream, and once ended it stays ended.
/// The task stops when the caller drops the stream. A reader that panics ends the stream
/// with an internal error about `what` it was doing, so that a cut-off stream is never
/// taken for a whole one.
pub(crate) fn read_ahead<T: Send + 'static>(
    mut items: BoxStream<'static, Result<T>>,
    ahead: usize,
    what: &'static str,
) -> BoxStream<'static, Result<T>> {
    /// The receiving end; dropping it stops the reader.
    struct Ahead<T> {
        items: tokio::sync::mpsc::Receiver<Result<T>>,
        reader: Option<tokio::task::JoinHandle<()>>,
    }
    impl<T> Drop for Ahead<T> {
        fn drop(&mut self) {
            if let Some(reader) = &self.reader {
                reader.abort();
            }
        }
    }
    let (sender, received) = tokio::sync::mpsc::channel(ahead.max(1));
    let reader = tokio::spawn(async move {
        while let Some(item) = items.next().await {
            let failed = item.is_err();
            if sender.send(item).await.is_err() || failed {
                return;
            }
        }
    });
    let ahead = Ahead {
        items: received,
        reader: Some(reader),
    };
    stream::unfold(ahead, move |mut ahead| async move {
        if let Some(item) = ahead.items.recv().await {
            return Some((item, ahead));
        }
        // The reader is done: the stream ended, or the reader failed.
        let reader = ahead.reader.take()?;
        match reader.await {
            Ok(()) => None,
            Err(err) => {
                tracing::warn!(%err, "a reader failed while {what}; its stream ends with an error");
                Some((
                    Err(Error::Internal {
                        context: what,
                        reason: err.to_string(),
                    }),
                    ahead,
                ))
            }
        }
    })
    // Ends for good: a consumer may ask again after the end (several partitions sharing
    // one reader each see it).
    .fuse()
    .boxed()
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::read_ahead;
    use crate::error::{Error, Result};

    /// Lets every other task of the (single-threaded) test runtime run until it waits.
    async fn let_others_run() {
        for _ in 0..64 {
            tokio::task::yield_now().await;
        }
    }

    /// Items read ahead come in order, and the reader runs at most its bound ahead of the
    /// caller (one waiting in the channel, one in its hands), not to the end of the stream.
    /// Once ended the stream stays ended; the first error ends it.
    #[tokio::test]
    async fn items_read_ahead_come_in_order_within_the_bound() {
        use futures::StreamExt as _;
        use std::sync::atomic::{AtomicUsize, Ordering};

        let read = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&read);
        let upload = futures::stream::iter(0..10_usize)
            .map(move |batch| {
                counted.fetch_add(1, Ordering::SeqCst);
                Ok(batch)
            })
            .boxed();
        let mut ahead = read_ahead(upload, 1, "reading an upload");
        assert_eq!(ahead.next().await.map(Result::ok), Some(Some(0)));
        let_others_run().await;
        // Taken: 1; waiting in the channel: 1; read and held until there is room: 1.
        assert_eq!(read.load(Ordering::SeqCst), 3);
        let rest: Vec<usize> = (&mut ahead)
            .map(|batch| batch.expect("no error"))
            .collect()
            .await;
        assert_eq!(rest, (1..10).collect::<Vec<_>>());
        // Asked again after its end (as partitions sharing one reader do), it stays ended.
        assert!(ahead.next().await.is_none());

        let failing = futures::stream::iter(vec![
            Ok(1),
            Err(Error::InvalidRequest {
                reason: "batch 2".into(),
            }),
            Ok(3),
        ])
        .boxed();
        let got: Vec<Result<usize>> = read_ahead(failing, 1, "reading an upload").collect().await;
        assert!(
            matches!(got.as_slice(), [Ok(1), Err(Error::InvalidRequest { reason })] if reason == "batch 2")
        );
    }

    /// Dropping the stream stops its reader (the upload is let go); a reader that panics
    /// ends the stream with an error, not as if the upload had ended.
    #[tokio::test]
    async fn a_dropped_stream_stops_its_reader_and_a_failed_reader_is_an_error() {
        use futures::StreamExt as _;

        /// Says when the upload it is part of is let go.
        struct Released(Arc<Mutex<bool>>);
        impl Drop for Released {
            fn drop(&mut self) {
                *self.0.lock().expect("unpoisoned") = true;
            }
        }
        let released = Arc::new(Mutex::new(false));
        let guard = Released(Arc::clone(&released));
        let endless = futures::stream::repeat(1_usize)
            .map(move |batch| {
                let _held = &guard;
                Ok(batch)
            })
            .boxed();
        let mut ahead = read_ahead(endless, 1, "reading an upload");
        assert_eq!(ahead.next().await.map(Result::ok), Some(Some(1)));
        assert!(!*released.lock().expect("unpoisoned"));
        drop(ahead);
        let_others_run().await;
        assert!(*released.lock().expect("unpoisoned"));

        let panicking = futures::stream::iter(0..3_usize)
            .map(|batch| {
                assert!(batch < 1, "the decoder failed on batch {batch}");
                Ok(batch)
            })
            .boxed();
        let got: Vec<Result<usize>> = read_ahead(panicking, 1, "reading an upload")
            .collect()
            .await;
        assert!(
            matches!(
                got.as_slice(),
                [
                    Ok(0),
                    Err(Error::Internal {
                        context: "reading an upload",
                        ..
                    })
                ]
            ),
            "{got:?}"
        );
    }
}
