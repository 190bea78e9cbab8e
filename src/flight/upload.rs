//! Reading what clients upload with `DoPut`: record batches, decoded into changes batch by
//! batch as they arrive, and the app metadata of the stream's last message.
//!
//! Messages without an IPC header (metadata-only messages such as pyarrow's
//! `write_metadata`, or the one empty message of a `CommandStatementUpdate`) carry no data and
//! are not fed to the IPC decoder, which would fail on them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use arrow_flight::FlightData;
use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::error::FlightError;
use bytes::Bytes;
use datafusion::arrow::record_batch::RecordBatch;
use futures::stream::{self, BoxStream};
use futures::{Stream, StreamExt as _, TryStreamExt as _};
use tonic::Status;

use crate::error::{Error, Result};
use crate::write::Op;
use crate::write::decode::{MissingColumns, RowDecoder, RowShape};

/// An upload being read.
pub(crate) struct Upload {
    batches: FlightRecordBatchStream,
    last_metadata: Arc<Mutex<Bytes>>,
}

/// What an upload's reader has seen so far: its rows, and the app metadata of its last
/// message.
#[derive(Clone)]
pub(crate) struct Tally {
    rows: Arc<AtomicUsize>,
    last_metadata: Arc<Mutex<Bytes>>,
}

impl Tally {
    /// Rows read.
    pub(crate) fn rows(&self) -> usize {
        self.rows.load(Ordering::Relaxed)
    }

    /// The app metadata of the last message read.
    pub(crate) fn last_metadata(&self) -> Bytes {
        self.last_metadata
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// `message`, once its body is found to hold every buffer its IPC header places in it. The
/// Arrow decoder slices the body where the header points and panics past its end; a client's
/// header is not to be trusted that far.
///
/// # Errors
/// [`FlightError::DecodeError`] naming the body's length and the buffer past it, or for a
/// header that does not parse.
pub(crate) fn checked_body(message: FlightData) -> Result<FlightData, FlightError> {
    use datafusion::arrow::ipc::{MessageHeader, root_as_message};
    if message.data_header.is_empty() {
        return Ok(message);
    }
    let header = root_as_message(&message.data_header).map_err(|err| {
        FlightError::DecodeError(format!("an Arrow IPC message header does not parse: {err}"))
    })?;
    let batch = match header.header_type() {
        MessageHeader::RecordBatch => header.header_as_record_batch(),
        MessageHeader::DictionaryBatch => header
            .header_as_dictionary_batch()
            .and_then(|dictionary| dictionary.data()),
        _ => None,
    };
    let body = message.data_body.len();
    for buffer in batch
        .and_then(|batch| batch.buffers())
        .into_iter()
        .flatten()
    {
        let end = usize::try_from(buffer.offset())
            .ok()
            .zip(usize::try_from(buffer.length()).ok())
            .and_then(|(offset, length)| offset.checked_add(length));
        if end.is_none_or(|end| end > body) {
            return Err(FlightError::DecodeError(format!(
                "an Arrow IPC message body of {body} bytes lacks a buffer its header places at \
                 offset {} with length {}: the body is cut short or the header is wrong",
                buffer.offset(),
                buffer.length()
            )));
        }
    }
    Ok(message)
}

impl Upload {
    /// Reads `stream`.
    pub(crate) fn new(
        stream: impl Stream<Item = Result<FlightData, Status>> + Send + 'static,
    ) -> Self {
        let last_metadata = Arc::new(Mutex::new(Bytes::new()));
        let seen = Arc::clone(&last_metadata);
        let data = stream
            .map_err(FlightError::from)
            .inspect_ok(move |message| {
                *seen.lock().unwrap_or_else(PoisonError::into_inner) = message.app_metadata.clone();
            })
            .try_filter(|message| futures::future::ready(!message.data_header.is_empty()))
            .and_then(|message| futures::future::ready(checked_body(message)))
            .boxed();
        Self {
            batches: FlightRecordBatchStream::new_from_flight_data(data),
            last_metadata,
        }
    }

    /// The next record batch, or `None` at the end of the stream.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] when the stream fails or does not decode.
    pub(crate) async fn next_batch(&mut self) -> Result<Option<RecordBatch>> {
        self.batches.try_next().await.map_err(|err| match err {
            FlightError::Tonic(status) => Error::InvalidRequest {
                reason: format!("the upload failed: {}", status.message()),
            },
            other => Error::InvalidRequest {
                reason: format!("the upload does not decode as Arrow IPC: {other}"),
            },
        })
    }

    /// The changes the upload's rows make as rows of `shape`, batch by batch as they are
    /// read, and the tally of what was read. A stream that ends without batches makes no
    /// change, but its schema is still checked, so that a wrong upload is not silently empty.
    pub(crate) fn changes(
        self,
        shape: RowShape,
        missing: MissingColumns,
    ) -> (BoxStream<'static, Result<Vec<Op>>>, Tally) {
        let tally = Tally {
            rows: Arc::new(AtomicUsize::new(0)),
            last_metadata: Arc::clone(&self.last_metadata),
        };
        let rows = Arc::clone(&tally.rows);
        let state = Some((self, None::<RowDecoder>));
        let changes = stream::unfold(state, move |state| {
            let rows = Arc::clone(&rows);
            async move {
                let (mut upload, mut decoder) = state?;
                let batch = match upload.next_batch().await {
                    Ok(Some(batch)) => batch,
                    Ok(None) => {
                        let schema = upload.batches.schema().cloned();
                        return match (decoder, schema) {
                            (None, Some(schema)) => RowDecoder::new(shape, &schema, missing)
                                .err()
                                .map(|err| (Err(err), None)),
                            _ => None,
                        };
                    }
                    Err(err) => return Some((Err(err), None)),
                };
                let changes = match &mut decoder {
                    Some(decoder) => decoder.decode(&batch),
                    None => RowDecoder::new(shape, &batch.schema(), missing)
                        .and_then(|d| decoder.insert(d).decode(&batch)),
                };
                rows.fetch_add(batch.num_rows(), Ordering::Relaxed);
                match changes {
                    Ok(ops) => Some((Ok(ops), Some((upload, decoder)))),
                    Err(err) => Some((Err(err), None)),
                }
            }
        })
        .boxed();
        (changes, tally)
    }
}
