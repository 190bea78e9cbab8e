//! Reading what clients upload with `DoPut`: record batches, decoded into changes batch by
//! batch as they arrive, and the app metadata of the stream's last message.
//!
//! Messages without an IPC header (metadata-only messages such as pyarrow's
//! `write_metadata`, or the one empty message of a `CommandStatementUpdate`) carry no data:
//! the decoder skips them ([`decoded`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use arrow_flight::FlightData;
use arrow_flight::error::FlightError;
use bytes::Bytes;
use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::buffer::Buffer;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::ipc::{Message, MessageHeader, root_as_message};
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

/// Whether the body of `body` bytes holds every buffer `header` places in it. Arrow's IPC
/// reader slices the body where the header points and panics past its end; a client's
/// header is not to be trusted that far.
///
/// # Errors
/// [`FlightError::DecodeError`] naming the body's length and the buffer past it.
fn check_body(header: &Message<'_>, body: usize) -> Result<(), FlightError> {
    let batch = match header.header_type() {
        MessageHeader::RecordBatch => header.header_as_record_batch(),
        MessageHeader::DictionaryBatch => header
            .header_as_dictionary_batch()
            .and_then(|dictionary| dictionary.data()),
        _ => None,
    };
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
    Ok(())
}

/// The record batches of a stream of IPC messages, with any panic of Arrow's IPC reader on
/// bytes it did not expect contained: it ends the stream with a decode error instead of
/// taking the server down. Messages without an IPC header are skipped.
pub(crate) fn decoded(
    messages: impl Stream<Item = Result<FlightData, FlightError>> + Send + 'static,
    schema: Arc<Mutex<Option<SchemaRef>>>,
) -> BoxStream<'static, Result<RecordBatch, FlightError>> {
    let mut decoder = IpcDecoder {
        schema: None,
        fields: Vec::new(),
        dictionaries: HashMap::new(),
        shared: schema,
    };
    let batches =
        messages.try_filter_map(move |message| futures::future::ready(decoder.decode(&message)));
    Contained {
        inner: batches.boxed(),
        done: false,
    }
    .boxed()
}

/// Decodes an upload's IPC messages, reading each message's header once: the header is
/// checked against the body ([`check_body`]) and, for a record batch of the flat column types
/// uploads hold, against the schema ([`check_layout`]: every buffer as long as the batch's row
/// count needs, which the reader trusts and panics or allocates by when they lie), and then
/// handed to Arrow's IPC reader as parsed. (arrow-flight's decoder parses and verifies every
/// header again, and a schema twice more: a third of a worker's instructions for a one-commit
/// upload.) A body is read where it lies; the reader copies a buffer only where it is not
/// aligned for its type.
struct IpcDecoder {
    schema: Option<SchemaRef>,
    /// The schema's column types, for [`check_layout`].
    fields: Vec<DataType>,
    dictionaries: HashMap<i64, ArrayRef>,
    /// Where the stream's schema goes once read.
    shared: Arc<Mutex<Option<SchemaRef>>>,
}

impl IpcDecoder {
    /// The stream's schema, which a `what` message needs read before it.
    fn schema(&self, what: &str) -> Result<SchemaRef, FlightError> {
        self.schema.clone().ok_or_else(|| {
            FlightError::protocol(format!("an Arrow IPC {what} before the stream's schema"))
        })
    }

    fn decode(&mut self, message: &FlightData) -> Result<Option<RecordBatch>, FlightError> {
        use datafusion::arrow::ipc::{convert, reader};
        if message.data_header.is_empty() {
            return Ok(None);
        }
        let header = root_as_message(&message.data_header).map_err(|err| {
            FlightError::DecodeError(format!("an Arrow IPC message header does not parse: {err}"))
        })?;
        check_body(&header, message.data_body.len())?;
        let version = header.version();
        let unreadable = |what: &str, err: ArrowError| {
            FlightError::DecodeError(format!("an Arrow IPC {what} does not decode: {err}"))
        };
        match header.header_type() {
            MessageHeader::Schema => {
                let schema = header.header_as_schema().ok_or_else(|| {
                    FlightError::DecodeError("an Arrow IPC schema message without a schema".into())
                })?;
                check_types(schema)?;
                let schema = Arc::new(convert::fb_to_schema(schema));
                self.fields = schema
                    .fields()
                    .iter()
                    .map(|f| f.data_type().clone())
                    .collect();
                self.dictionaries.clear();
                *self.shared.lock().unwrap_or_else(PoisonError::into_inner) =
                    Some(Arc::clone(&schema));
                self.schema = Some(schema);
                Ok(None)
            }
            MessageHeader::DictionaryBatch => {
                let schema = self.schema("dictionary batch")?;
                let dictionary = header.header_as_dictionary_batch().ok_or_else(|| {
                    FlightError::DecodeError(
                        "an Arrow IPC dictionary message without its batch".into(),
                    )
                })?;
                let body = Buffer::from(message.data_body.clone());
                reader::read_dictionary(
                    &body,
                    dictionary,
                    &schema,
                    &mut self.dictionaries,
                    &version,
                )
                .map_err(|err| unreadable("dictionary batch", err))?;
                Ok(None)
            }
            MessageHeader::RecordBatch => {
                let schema = self.schema("record batch")?;
                let batch = header.header_as_record_batch().ok_or_else(|| {
                    FlightError::DecodeError(
                        "an Arrow IPC record batch message without its batch".into(),
                    )
                })?;
                if batch.compression().is_none() {
                    check_layout(&self.fields, &batch)?;
                }
                let body = Buffer::from(message.data_body.clone());
                reader::read_record_batch(&body, batch, schema, &self.dictionaries, None, &version)
                    .map(Some)
                    .map_err(|err| unreadable("record batch", err))
            }
            MessageHeader::NONE => Ok(None),
            other => Err(FlightError::protocol(format!(
                "an unexpected Arrow IPC message, {}",
                other.variant_name().unwrap_or("of an unknown kind")
            ))),
        }
    }
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
            });
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
        (
            crate::read_ahead::read_ahead(changes, DECODED_AHEAD, "reading an upload"),
            tally,
        )
    }
}

/// Batches an upload's reader decodes into changes before staging takes them, beyond the
/// one it holds. Reading, decoding and staging then run on two cores: a 100k-mapping
/// transaction through ADBC (W5b) took 294 ms instead of 328 ms (the profiling build, 15
/// interleaved rounds, medians), and two ahead did no better than one. It bounds what an
/// upload holds beyond what is staged: the batch being staged, one decoded and waiting, and
/// the one being decoded, each at most a message's size.
const DECODED_AHEAD: usize = 1;

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use arrow_flight::FlightData;
    use arrow_flight::encode::{DictionaryHandling, FlightDataEncoderBuilder};
    use bytes::{Bytes, BytesMut};
    use datafusion::arrow::array::{ArrayRef, DictionaryArray, Int64Array};
    use datafusion::arrow::datatypes::{DataType, Field, Int32Type, Schema};
    use datafusion::arrow::record_batch::RecordBatch;
    use futures::TryStreamExt as _;

    use super::decoded;

    /// An upload decodes as sent: a dictionary column with its dictionaries, bodies where the
    /// transport put them or moved off their alignment (the reader copies what its types need
    /// aligned), a metadata-only message skipped; the stream's schema is handed on. A
    /// dictionary or record batch before the schema is refused.
    #[tokio::test]
    async fn an_upload_decodes_as_sent_wherever_its_bodies_lie() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new(
                "kind",
                DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
                true,
            ),
        ]));
        let batch = |ids: Vec<i64>, kinds: Vec<Option<&str>>| {
            let kinds: DictionaryArray<Int32Type> = kinds.into_iter().collect();
            let columns: Vec<ArrayRef> = vec![Arc::new(Int64Array::from(ids)), Arc::new(kinds)];
            RecordBatch::try_new(Arc::clone(&schema), columns).expect("batch")
        };
        let sent = vec![
            batch(vec![1, 2, 3], vec![Some("a"), None, Some("b")]),
            batch(vec![4], vec![Some("c")]),
        ];
        let mut messages: Vec<FlightData> = FlightDataEncoderBuilder::new()
            .with_dictionary_handling(DictionaryHandling::Resend)
            .build(futures::stream::iter(sent.clone().into_iter().map(Ok)))
            .try_collect()
            .await
            .expect("encoded");
        messages.insert(
            1,
            FlightData {
                app_metadata: Bytes::from_static(b"a note"),
                ..FlightData::default()
            },
        );
        let unaligned: Vec<FlightData> = messages
            .iter()
            .cloned()
            .map(|mut message| {
                let mut moved = BytesMut::with_capacity(message.data_body.len() + 1);
                moved.extend_from_slice(&[0]);
                moved.extend_from_slice(&message.data_body);
                message.data_body = moved.freeze().slice(1..);
                message
            })
            .collect();
        for messages in [messages.clone(), unaligned] {
            let seen = Arc::new(Mutex::new(None));
            let got: Vec<RecordBatch> = decoded(
                futures::stream::iter(messages.into_iter().map(Ok)),
                Arc::clone(&seen),
            )
            .try_collect()
            .await
            .expect("decodes");
            assert_eq!(got, sent);
            let seen = seen.lock().expect("unpoisoned").clone();
            assert_eq!(seen.as_deref(), Some(schema.as_ref()));
        }
        let headless = messages.into_iter().skip(1);
        let err = decoded(futures::stream::iter(headless.map(Ok)), Arc::default())
            .try_collect::<Vec<RecordBatch>>()
            .await
            .expect_err("no schema");
        assert!(
            err.to_string().contains("before the stream's schema"),
            "{err}"
        );
    }
}
