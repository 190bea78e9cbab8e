//! Reading what clients upload with `DoPut`: record batches, and the app metadata of the
//! stream's last message.
//!
//! Messages without an IPC header (metadata-only messages such as pyarrow's
//! `write_metadata`, or the one empty message of a `CommandStatementUpdate`) carry no data and
//! are not fed to the IPC decoder, which would fail on them.

use std::sync::{Arc, Mutex, PoisonError};

use arrow_flight::FlightData;
use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::error::FlightError;
use bytes::Bytes;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use futures::{Stream, StreamExt as _, TryStreamExt as _};
use tonic::Status;

use crate::error::{Error, Result};

/// An upload being read.
pub(crate) struct Upload {
    batches: FlightRecordBatchStream,
    last_metadata: Arc<Mutex<Bytes>>,
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

    /// The stream's schema, once its schema message has been read.
    pub(crate) fn schema(&self) -> Option<SchemaRef> {
        self.batches.schema().cloned()
    }

    /// The app metadata of the last message read.
    pub(crate) fn last_metadata(&self) -> Bytes {
        self.last_metadata
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}
