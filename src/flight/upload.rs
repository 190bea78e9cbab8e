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
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use futures::stream::{self, BoxStream};
use futures::{Stream, StreamExt as _, TryStreamExt as _};
use tonic::Status;

use crate::error::{Error, Part, Result};
use crate::model::DuckLakeVersion;
use crate::write::Op;
use crate::write::decode::{MissingColumns, RowDecoder, RowShape};

/// An upload being read.
pub(crate) struct Upload {
    batches: BoxStream<'static, Result<RecordBatch, FlightError>>,
    /// The schema of the stream, once its first message has been read.
    schema: Arc<Mutex<Option<SchemaRef>>>,
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

/// The record batches of a stream of checked messages ([`checked_body`], [`LayoutCheck`]),
/// with any panic of the Arrow decoder on bytes it did not expect contained: it ends the
/// stream with a decode error instead of taking the server down.
pub(crate) fn decoded(
    messages: impl Stream<Item = Result<FlightData, FlightError>> + Send + 'static,
    schema: Arc<Mutex<Option<SchemaRef>>>,
) -> BoxStream<'static, Result<RecordBatch, FlightError>> {
    let mut layout = LayoutCheck {
        fields: None,
        schema,
    };
    let checked = messages
        .and_then(|message| futures::future::ready(checked_body(message)))
        .and_then(move |message| futures::future::ready(layout.check(message)));
    Contained {
        inner: FlightRecordBatchStream::new_from_flight_data(checked),
        done: false,
    }
    .boxed()
}

/// A stream whose polls may panic, made one that ends with an error instead.
struct Contained<S> {
    inner: S,
    done: bool,
}

impl<S> Stream for Contained<S>
where
    S: Stream<Item = Result<RecordBatch, FlightError>> + Unpin,
{
    type Item = Result<RecordBatch, FlightError>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        if self.done {
            return std::task::Poll::Ready(None);
        }
        let inner = &mut self.inner;
        if let Ok(poll) =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| inner.poll_next_unpin(cx)))
        {
            return poll;
        }
        self.done = true;
        tracing::warn!("the Arrow decoder failed on an upload; refused");
        std::task::Poll::Ready(Some(Err(FlightError::DecodeError(
            "an Arrow IPC message does not decode: its lengths disagree with its buffers".into(),
        ))))
    }
}

/// Checks each record batch of an upload against its schema before the Arrow decoder sees
/// it: for the flat column types uploads hold (integers, booleans, strings, nulls), every
/// buffer must be as long as the batch's row count needs. The decoder trusts those lengths
/// and panics, or allocates what they claim, when they lie. Other layouts (compressed bodies,
/// dictionaries, string views) are left to the decoder, whose panics [`decoded`] contains.
struct LayoutCheck {
    fields: Option<Vec<DataType>>,
    /// Where the stream's schema goes once read.
    schema: Arc<Mutex<Option<SchemaRef>>>,
}

impl LayoutCheck {
    fn check(&mut self, message: FlightData) -> Result<FlightData, FlightError> {
        use datafusion::arrow::ipc::{MessageHeader, convert, root_as_message};
        if message.data_header.is_empty() {
            return Ok(message);
        }
        let header = root_as_message(&message.data_header).map_err(|err| {
            FlightError::DecodeError(format!("an Arrow IPC message header does not parse: {err}"))
        })?;
        match header.header_type() {
            MessageHeader::Schema => {
                if let Some(schema) = header.header_as_schema() {
                    check_types(schema)?;
                    let schema = convert::fb_to_schema(schema);
                    self.fields = Some(
                        schema
                            .fields()
                            .iter()
                            .map(|f| f.data_type().clone())
                            .collect(),
                    );
                    *self.schema.lock().unwrap_or_else(PoisonError::into_inner) =
                        Some(Arc::new(schema));
                }
            }
            MessageHeader::RecordBatch => {
                if let (Some(fields), Some(batch)) = (&self.fields, header.header_as_record_batch())
                    && batch.compression().is_none()
                {
                    check_layout(fields, &batch)?;
                }
            }
            _ => {}
        }
        Ok(message)
    }
}

/// Refuses a schema with a column of a type no upload holds (uploads hold integers, floats,
/// booleans, strings, binaries and nulls, plain or dictionary-encoded), or with a type the
/// Arrow decoder cannot read (it panics on those).
fn check_types(schema: datafusion::arrow::ipc::Schema<'_>) -> Result<(), FlightError> {
    use datafusion::arrow::ipc::{Int, Precision, Type};
    let bad = |what: String| Err(FlightError::DecodeError(what));
    let valid_int = |int: Int<'_>| matches!(int.bitWidth(), 8 | 16 | 32 | 64);
    let Some(fields) = schema.fields() else {
        return bad("an Arrow IPC schema without fields".into());
    };
    for field in fields {
        let name = crate::error::excerpt(field.name().unwrap_or_default()).into_owned();
        if let Some(dictionary) = field.dictionary()
            && !dictionary.indexType().is_some_and(valid_int)
        {
            return bad(format!(
                "column {name:?} has a dictionary without a valid index type"
            ));
        }
        let taken = match field.type_type() {
            Type::Int => field.type_as_int().is_some_and(valid_int),
            Type::FloatingPoint => field.type_as_floating_point().is_some_and(|float| {
                matches!(
                    float.precision(),
                    Precision::HALF | Precision::SINGLE | Precision::DOUBLE
                )
            }),
            Type::Bool
            | Type::Utf8
            | Type::LargeUtf8
            | Type::Utf8View
            | Type::Binary
            | Type::LargeBinary
            | Type::Null => true,
            _ => false,
        };
        if !taken
            || field
                .children()
                .is_some_and(|children| !children.is_empty())
        {
            return bad(format!(
                "column {name:?} is of type {:?}, which no catalog column takes",
                field.type_type()
            ));
        }
    }
    Ok(())
}

/// Whether the flat columns `fields` of `batch` have the buffers their row count needs.
fn check_layout(
    fields: &[DataType],
    batch: &datafusion::arrow::ipc::RecordBatch<'_>,
) -> Result<(), FlightError> {
    let bad = |what: String| {
        Err(FlightError::DecodeError(format!(
            "an Arrow IPC record batch does not match its schema: {what}"
        )))
    };
    let rows = usize::try_from(batch.length()).unwrap_or(usize::MAX);
    let nodes: Vec<_> = batch.nodes().into_iter().flatten().collect();
    let buffers: Vec<usize> = batch
        .buffers()
        .into_iter()
        .flatten()
        .map(|b| usize::try_from(b.length()).unwrap_or(usize::MAX))
        .collect();
    if !fields.iter().all(is_flat) {
        return Ok(());
    }
    if nodes.len() != fields.len() {
        return bad(format!(
            "{} columns for a schema of {}",
            nodes.len(),
            fields.len()
        ));
    }
    let mut next = buffers.iter().copied();
    for (column, (field, node)) in fields.iter().zip(&nodes).enumerate() {
        let len = usize::try_from(node.length()).unwrap_or(usize::MAX);
        let nulls = usize::try_from(node.null_count()).unwrap_or(usize::MAX);
        if len != rows || nulls > len {
            return bad(format!(
                "column {column} has {len} rows and {nulls} nulls in a batch of {rows} rows"
            ));
        }
        let bitmap = len.div_ceil(8);
        let needs: Vec<usize> = match field {
            DataType::Null => Vec::new(),
            DataType::Boolean => vec![0, bitmap],
            DataType::Utf8 | DataType::Binary => vec![0, (len + 1) * 4, 0],
            DataType::LargeUtf8 | DataType::LargeBinary => vec![0, (len + 1) * 8, 0],
            other => vec![0, len.saturating_mul(other.primitive_width().unwrap_or(8))],
        };
        for (at, need) in needs.into_iter().enumerate() {
            let Some(have) = next.next() else {
                return bad(format!("column {column} lacks its buffers"));
            };
            // The validity bitmap may be absent when there are no nulls.
            let need = if at == 0 {
                if have == 0 && nulls == 0 { 0 } else { bitmap }
            } else if len == 0 {
                0
            } else {
                need
            };
            if have < need {
                return bad(format!(
                    "buffer {at} of column {column} holds {have} bytes, {len} rows need {need}"
                ));
            }
        }
    }
    Ok(())
}

/// Whether the check knows the layout of `data_type`.
fn is_flat(data_type: &DataType) -> bool {
    data_type.is_integer()
        || matches!(
            data_type,
            DataType::Null
                | DataType::Boolean
                | DataType::Utf8
                | DataType::LargeUtf8
                | DataType::Binary
                | DataType::LargeBinary
                | DataType::Float32
                | DataType::Float64
        )
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
            .try_filter(|message| futures::future::ready(!message.data_header.is_empty()));
        let schema = Arc::new(Mutex::new(None));
        Self {
            batches: decoded(data, Arc::clone(&schema)),
            schema,
            last_metadata,
        }
    }

    /// The next record batch, or `None` at the end of the stream.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] when the stream fails, [`Error::Malformed`] when it does not
    /// decode.
    pub(crate) async fn next_batch(&mut self) -> Result<Option<RecordBatch>> {
        self.batches.try_next().await.map_err(|err| match err {
            FlightError::Tonic(status) => Error::InvalidRequest {
                reason: format!("the upload failed: {}", status.message()),
            },
            other => Error::Malformed {
                part: Part::Upload,
                problem: format!("does not decode as Arrow IPC: {other}"),
            },
        })
    }

    /// The changes the upload's rows make as rows of `shape` in DuckLake `version`, batch by
    /// batch as they are read, and the tally of what was read. A stream that ends without
    /// batches makes no change, but its schema is still checked, so that a wrong upload is not
    /// silently empty.
    pub(crate) fn changes(
        self,
        shape: RowShape,
        version: DuckLakeVersion,
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
                        let schema = upload
                            .schema
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .clone();
                        return match (decoder, schema) {
                            (None, Some(schema)) => {
                                RowDecoder::new(shape, version, &schema, missing)
                                    .err()
                                    .map(|err| (Err(err), None))
                            }
                            _ => None,
                        };
                    }
                    Err(err) => return Some((Err(err), None)),
                };
                let changes = match &mut decoder {
                    Some(decoder) => decoder.decode(&batch),
                    None => RowDecoder::new(shape, version, &batch.schema(), missing)
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
