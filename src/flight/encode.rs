//! What the service sends: `FlightInfo`s whose tickets this server signs, and record batch
//! streams encoded as Flight data in messages sized for the transport.

use std::pin::Pin;
use std::sync::Arc;

use arrow_flight::sql::{ProstMessageExt, TicketStatementQuery};
use arrow_flight::{FlightDescriptor, FlightEndpoint, FlightInfo, IpcMessage, SchemaAsIpc, Ticket};
use bytes::Bytes;
use datafusion::arrow::array::Int64Array;
use datafusion::arrow::buffer::Buffer;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::ipc::writer::{
    DictionaryTracker, IpcDataGenerator, IpcWriteOptions, StreamEncoder,
};
use datafusion::arrow::ipc::{MessageHeader, MetadataVersion, root_as_message};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::ScalarValue;
use datafusion::execution::SendableRecordBatchStream;
use futures::{Stream, StreamExt as _, TryStreamExt as _};
use prost::Message as _;
use tonic::{Response, Status};

use super::held::HeldId;
use super::service::MoraineSqlService;
use super::status::to_status;
use super::tickets::TicketKind;
use crate::auth::Session;
use crate::batch::served_schema;
use crate::catalog::CatalogSnapshot;
use crate::error::{Error, Result};
use crate::model::CatalogTable;
use crate::txn::TxnId;

/// Largest encoded message sent, well under the 16 MiB clients accept.
const MAX_FLIGHT_DATA: usize = 2 << 20;

pub(super) type BoxedStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// The result of a write statement: one row, the rows it affected.
pub(super) fn count_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new(
        "count",
        DataType::Int64,
        false,
    )]))
}

impl MoraineSqlService {
    /// The `FlightInfo` of a write statement that has run: its count as `total_records`, and
    /// a ticket streaming that count.
    pub(super) fn affected_info(
        &self,
        rows: i64,
        descriptor: FlightDescriptor,
    ) -> Result<FlightInfo> {
        let info = self.ticket_info(&TicketKind::Affected { rows }, &count_schema(), descriptor)?;
        Ok(info.with_total_records(rows))
    }

    /// The `FlightInfo` of a read in `txn`: parallel endpoints for a whole table
    /// (`SELECT * FROM t`), one endpoint otherwise.
    pub(super) async fn read_info(
        &self,
        sql: String,
        params: Vec<ScalarValue>,
        txn: Option<TxnId>,
        session: &Session,
        descriptor: FlightDescriptor,
    ) -> Result<FlightInfo> {
        match self.engine.whole_table(&sql) {
            Some(table) if params.is_empty() => {
                let view = self.view(txn.as_ref()).await?;
                let owner = txn.and(session.owner().map(str::to_owned));
                self.parts_info(table, PartsAt::Fresh { view, owner }, descriptor)
                    .await
            }
            _ => self.query_info(sql, params, txn, descriptor).await,
        }
    }

    /// The `FlightInfo` of a query read in `txn`.
    pub(super) async fn query_info(
        &self,
        sql: String,
        params: Vec<ScalarValue>,
        txn: Option<TxnId>,
        descriptor: FlightDescriptor,
    ) -> Result<FlightInfo> {
        let view = self.view(txn.as_ref()).await?;
        let schema = self.engine.schema_at(&view, &sql, params.clone()).await?;
        let ticket = TicketKind::Statement {
            sql,
            params,
            txn: txn.map(|id| id.to_string()),
        };
        self.ticket_info(&ticket, &schema, descriptor)
    }

    /// A `FlightInfo` whose one endpoint streams `ticket` from this server.
    pub(crate) fn ticket_info(
        &self,
        ticket: &TicketKind,
        schema: &SchemaRef,
        descriptor: FlightDescriptor,
    ) -> Result<FlightInfo> {
        info_with(schema, descriptor, self.endpoint(ticket)?)
    }

    /// The `FlightInfo` of a whole-table read of `table`, divided into endpoints of about
    /// equal volume, each a range of DuckLake tables, all reading one held snapshot: `at`,
    /// held from now, or a snapshot held already. Its `app_metadata` names the snapshot (to
    /// read other tables at it, ask for the path `[table, "@<snapshot>"]`) and how long it
    /// is held; each endpoint's names its tables and, where measured, their volume.
    pub(crate) async fn parts_info(
        &self,
        table: CatalogTable,
        at: PartsAt,
        descriptor: FlightDescriptor,
    ) -> Result<FlightInfo> {
        let kind = crate::query::provider::row_kind(table);
        let division = self.held.limits().division;
        let (id, parts, serials) = match at {
            PartsAt::Fresh { view, owner } => {
                let parts = view.table_parts(kind, division).await?;
                let (id, serials) = self.held.hold(view, owner, parts.len())?;
                (id, parts, serials)
            }
            PartsAt::Held { id, owner } => {
                let (view, _) = self.held.extend(&id, owner.as_deref(), 0)?;
                let parts = view.table_parts(kind, division).await?;
                let (_, serials) = self.held.extend(&id, owner.as_deref(), parts.len())?;
                (id, parts, serials)
            }
        };
        let mut info = FlightInfo::new()
            .try_with_schema(&served_schema(self.engine.catalog().ducklake(), table))
            .map_err(|err| Error::Internal {
                context: "encoding a result schema",
                reason: err.to_string(),
            })?
            .with_descriptor(descriptor)
            .with_total_records(-1)
            .with_total_bytes(-1);
        for (part, serial) in parts.into_iter().zip(serials) {
            let ticket = TicketKind::Part {
                table,
                tables: part.tables.clone(),
                snapshot: id,
                serial,
            };
            let about = match part.volume {
                Some(volume) => serde_json::json!({
                    "tables": [part.tables.start(), part.tables.end()],
                    "volume": volume,
                }),
                None => serde_json::json!({
                    "tables": [part.tables.start(), part.tables.end()],
                }),
            };
            info = info.with_endpoint(
                self.endpoint(&ticket)?
                    .with_app_metadata(about.to_string().into_bytes()),
            );
        }
        let held_for = self.held.remaining(&id).unwrap_or_default();
        let about = serde_json::json!({
            "snapshot": crate::key_range::hex(&id),
            "expires_in_ms": u64::try_from(held_for.as_millis()).unwrap_or(u64::MAX),
        });
        Ok(info.with_app_metadata(about.to_string().into_bytes()))
    }

    fn endpoint(&self, ticket: &TicketKind) -> Result<FlightEndpoint> {
        let handle = TicketStatementQuery {
            statement_handle: ticket.encode(&self.ticket_key)?.into(),
        };
        Ok(FlightEndpoint::new().with_ticket(Ticket {
            ticket: handle.as_any().encode_to_vec().into(),
        }))
    }

    /// Streams what `ticket` names.
    pub(crate) async fn stream_ticket(
        &self,
        ticket: TicketKind,
        session: &Session,
    ) -> Result<SendableRecordBatchStream> {
        match ticket {
            TicketKind::Statement { sql, params, txn } => {
                let txn = txn.map(|id| TxnId::from_bytes(id.as_bytes()));
                if let Some(id) = &txn {
                    self.txns.check_access(id, session.owner())?;
                }
                let view = self.view(txn.as_ref()).await?;
                self.engine.execute_at(&view, &sql, params).await
            }
            TicketKind::Table { table, table_id } => self.engine.scan_table(table, table_id).await,
            TicketKind::Part {
                table,
                tables,
                snapshot,
                serial,
            } => {
                let view = self.held.snapshot(&snapshot, serial, session.owner())?;
                let rows = self.engine.scan_part(&view, table, tables)?;
                let held = Arc::clone(&self.held);
                Ok(on_end(rows, move || held.read(&snapshot, serial)))
            }
            TicketKind::Affected { rows } => {
                let batch = RecordBatch::try_new(
                    count_schema(),
                    vec![Arc::new(Int64Array::from(vec![rows]))],
                )
                .map_err(|err| Error::Internal {
                    context: "building a write's count",
                    reason: err.to_string(),
                })?;
                let schema = batch.schema();
                Ok(Box::pin(
                    datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(
                        schema,
                        futures::stream::once(async move { Ok(batch) }),
                    ),
                ))
            }
        }
    }
}

/// What the parts of a whole-table read read.
pub(crate) enum PartsAt {
    /// A view held from now: a fresh snapshot, or a transaction's view, which only its
    /// session (`owner`) may read.
    Fresh {
        /// The view.
        view: CatalogSnapshot,
        /// The session it belongs to, for a transaction's view.
        owner: Option<String>,
    },
    /// A snapshot held already, by an earlier `GetFlightInfo`.
    Held {
        /// Its id.
        id: HeldId,
        /// The caller's session.
        owner: Option<String>,
    },
}

/// `rows`, calling `end` once they have all been produced without an error.
fn on_end(
    rows: SendableRecordBatchStream,
    end: impl FnOnce() + Send + 'static,
) -> SendableRecordBatchStream {
    let schema = rows.schema();
    let mut end = Some(end);
    let failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = Arc::clone(&failed);
    let tracked = rows
        .inspect(move |item| {
            if item.is_err() {
                seen.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        })
        .chain(futures::stream::poll_fn(move |_| {
            if !failed.load(std::sync::atomic::Ordering::Relaxed)
                && let Some(end) = end.take()
            {
                end();
            }
            std::task::Poll::Ready(None)
        }));
    Box::pin(datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(schema, tracked))
}

fn info_with(
    schema: &SchemaRef,
    descriptor: FlightDescriptor,
    endpoint: FlightEndpoint,
) -> Result<FlightInfo> {
    Ok(FlightInfo::new()
        .try_with_schema(schema)
        .map_err(|err| Error::Internal {
            context: "encoding a result schema",
            reason: err.to_string(),
        })?
        .with_endpoint(endpoint)
        .with_descriptor(descriptor)
        .with_total_records(-1)
        .with_total_bytes(-1))
}

/// A `FlightInfo` for a metadata command: the command itself is the ticket.
pub(super) fn command_info(
    command: &impl ProstMessageExt,
    schema: &SchemaRef,
    descriptor: FlightDescriptor,
) -> Result<Response<FlightInfo>, Status> {
    let endpoint = FlightEndpoint::new().with_ticket(Ticket {
        ticket: command.as_any().encode_to_vec().into(),
    });
    info_with(schema, descriptor, endpoint)
        .map(Response::new)
        .map_err(|e| to_status(&e))
}

/// Encodes a record batch stream as Flight data, schema first even when there are no rows.
/// Each message's body is copied into one buffer here; the `DoGet` path sends
/// [`message_stream`]'s messages as they are instead.
pub(crate) fn flight_stream(
    schema: &Schema,
    batches: SendableRecordBatchStream,
) -> BoxedStream<arrow_flight::FlightData> {
    Box::pin(message_stream(schema, batches).map_ok(Message::into_flight_data))
}

/// One Flight data message whose body stays in the pieces it is made of: the Arrow buffers
/// of the batch's columns (and the padding between them), not a copy of them.
#[derive(Debug)]
pub(crate) struct Message {
    /// The IPC message's flatbuffer (`FlightData.data_header`).
    pub header: Bytes,
    /// The IPC body (`FlightData.data_body`), in pieces.
    pub body: Vec<Bytes>,
}

impl Message {
    /// The body's length in bytes.
    pub fn body_len(&self) -> usize {
        self.body.iter().map(Bytes::len).sum()
    }

    /// The message as one `FlightData`, its body copied into one buffer.
    fn into_flight_data(self) -> arrow_flight::FlightData {
        let body = match <[Bytes; 1]>::try_from(self.body) {
            Ok([one]) => one,
            Err(pieces) => pieces.concat().into(),
        };
        arrow_flight::FlightData {
            data_header: self.header,
            data_body: body,
            ..Default::default()
        }
    }
}

/// Encodes a record batch stream as Flight data messages, schema first even when there are
/// no rows, each body left in the pieces of the batch it holds.
pub(crate) fn message_stream(
    schema: &Schema,
    batches: SendableRecordBatchStream,
) -> BoxedStream<Message> {
    let metrics = crate::metrics::get();
    let encoding_failed = |err: ArrowError| {
        to_status(&Error::Internal {
            context: "encoding a result stream",
            reason: err.to_string(),
        })
    };
    let mut encoder = match BatchEncoder::new(schema) {
        Ok(encoder) => encoder,
        Err(err) => {
            return Box::pin(futures::stream::once(std::future::ready(Err(
                encoding_failed(err),
            ))));
        }
    };
    let first = encoder.schema(schema);
    let rest = batches.flat_map(move |batch| {
        let outcome = match batch {
            Ok(batch) => {
                metrics
                    .rows_streamed
                    .inc_by(u64::try_from(batch.num_rows()).unwrap_or(u64::MAX));
                encoder.batch(&batch).map_err(encoding_failed)
            }
            Err(err) => Err(to_status(&crate::query::from_datafusion(err))),
        };
        futures::stream::iter(match outcome {
            Ok(messages) => messages.into_iter().map(Ok).collect(),
            Err(status) => vec![Err(status)],
        })
    });
    let all = futures::stream::once(std::future::ready(Ok(first)))
        .chain(rest)
        .inspect_ok(move |message| {
            let bytes = message.header.len() + message.body_len();
            metrics
                .bytes_streamed
                .inc_by(u64::try_from(bytes).unwrap_or(u64::MAX));
        });
    Box::pin(all)
}

/// Record batches as Flight data: the schema's message, then each batch in messages of at
/// most [`MAX_FLIGHT_DATA`] bytes, any dictionary a batch holds sent before it.
///
/// The IPC writer hands over a batch as the list of its buffers (a stream message's prefix
/// and header, then the columns' own buffers and the padding between them); each message's
/// body is kept as those buffers. Copying them into one body, as arrow-flight's encoder
/// does, and then again into the gRPC message, as tonic's codec does, was about a tenth of
/// the server's time on a full read.
struct BatchEncoder {
    stream: StreamEncoder,
    options: IpcWriteOptions,
}

impl BatchEncoder {
    fn new(schema: &Schema) -> Result<Self, ArrowError> {
        // Buffers aligned to 8 bytes, as the format asks (the writer's default, 64, pads
        // each buffer with up to 63 bytes more).
        let options = IpcWriteOptions::try_new(8, false, MetadataVersion::V5)?;
        Ok(Self {
            stream: StreamEncoder::try_new_with_options(schema, options.clone())?,
            options,
        })
    }

    /// The schema's message. Dictionary ids are numbered in the schema's field order, as the
    /// stream encoder numbers them for the batches.
    fn schema(&self, schema: &Schema) -> Message {
        let encoded = IpcDataGenerator::default().schema_to_bytes_with_dictionary_tracker(
            schema,
            &mut DictionaryTracker::new(false),
            &self.options,
        );
        Message {
            header: encoded.ipc_message.into(),
            body: Vec::new(),
        }
    }

    /// The messages of one batch: its dictionaries, then its rows, in slices that fit a
    /// message.
    fn batch(&mut self, batch: &RecordBatch) -> Result<Vec<Message>, ArrowError> {
        let mut messages = Vec::with_capacity(1);
        for part in message_slices(batch, MAX_FLIGHT_DATA) {
            let buffers = self.stream.encode(&part)?;
            split_messages(buffers, &mut messages)?;
        }
        Ok(messages)
    }
}

/// An Arrow buffer lent to the transport as bytes.
struct Lent(Buffer);

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

/// Reads an IPC stream held as a list of buffers.
struct Pieces {
    buffers: std::vec::IntoIter<Buffer>,
    current: Buffer,
    at: usize,
}

impl Pieces {
    fn new(buffers: Vec<Buffer>) -> Self {
        Self {
            buffers: buffers.into_iter(),
            current: Buffer::from_vec(Vec::<u8>::new()),
            at: 0,
        }
    }

    /// The rest of the current buffer, moving to the next one when it is used up; `None`
    /// at the end of the stream.
    fn available(&mut self) -> Option<usize> {
        while self.at >= self.current.len() {
            self.current = self.buffers.next()?;
            self.at = 0;
        }
        Some(self.current.len() - self.at)
    }

    /// The next `n` bytes as pieces of the buffers that hold them.
    fn take(&mut self, mut n: usize, out: &mut Vec<Bytes>) -> Result<(), ArrowError> {
        while n > 0 {
            let k = self.available().ok_or_else(short_stream)?.min(n);
            let piece = self.current.slice_with_length(self.at, k);
            out.push(Bytes::from_owner(Lent(piece)));
            self.at += k;
            n -= k;
        }
        Ok(())
    }

    /// The next `n` bytes, copied; `None` at the end of the stream.
    fn copy(&mut self, n: usize) -> Result<Option<Vec<u8>>, ArrowError> {
        if self.available().is_none() {
            return Ok(None);
        }
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let k = self
                .available()
                .ok_or_else(short_stream)?
                .min(n - out.len());
            out.extend_from_slice(
                self.current
                    .as_slice()
                    .get(self.at..self.at + k)
                    .unwrap_or_default(),
            );
            self.at += k;
        }
        Ok(Some(out))
    }
}

fn short_stream() -> ArrowError {
    ArrowError::IpcError("the IPC writer's stream ends inside a message".into())
}

/// Splits the IPC stream messages in `buffers` into Flight messages (the stream's schema
/// message, sent once at the start already, is left out).
fn split_messages(buffers: Vec<Buffer>, out: &mut Vec<Message>) -> Result<(), ArrowError> {
    let mut pieces = Pieces::new(buffers);
    while let Some(prefix) = pieces.copy(8)? {
        let (marker, length) = prefix.split_at(4);
        if marker != [0xff; 4] {
            return Err(ArrowError::IpcError(
                "an IPC message without its continuation marker".into(),
            ));
        }
        let length = i32::from_le_bytes(length.try_into().unwrap_or_default());
        let length = usize::try_from(length)
            .map_err(|_| ArrowError::IpcError(format!("an IPC header of {length} bytes")))?;
        if length == 0 {
            continue;
        }
        let header = pieces.copy(length)?.ok_or_else(short_stream)?;
        let message = root_as_message(&header)
            .map_err(|err| ArrowError::IpcError(format!("an IPC header: {err}")))?;
        let body_len = usize::try_from(message.bodyLength())
            .map_err(|_| ArrowError::IpcError("a negative IPC body length".into()))?;
        let schema = message.header_type() == MessageHeader::Schema;
        let mut body = Vec::new();
        pieces.take(body_len, &mut body)?;
        if !schema {
            out.push(Message {
                header: header.into(),
                body,
            });
        }
    }
    Ok(())
}

/// `batch` cut into slices of equal rows, as few as keep each under `max_bytes` of buffers
/// (none for a batch without rows).
fn message_slices(batch: &RecordBatch, max_bytes: usize) -> Vec<RecordBatch> {
    let bytes: usize = batch
        .columns()
        .iter()
        .map(|column| column.get_buffer_memory_size())
        .sum();
    let parts = bytes.div_ceil(max_bytes.max(1)).max(1);
    let rows = batch.num_rows();
    let per_part = rows.div_ceil(parts).max(1);
    (0..rows)
        .step_by(per_part)
        .map(|offset| batch.slice(offset, per_part.min(rows - offset)))
        .collect()
}

pub(super) fn one_batch(batch: RecordBatch) -> BoxedStream<arrow_flight::FlightData> {
    let schema = batch.schema();
    let stream = datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(
        Arc::clone(&schema),
        futures::stream::once(async move { Ok(batch) }),
    );
    flight_stream(&schema, Box::pin(stream))
}

pub(super) fn schema_bytes(schema: &SchemaRef) -> Result<Vec<u8>, Status> {
    if schema.fields().is_empty() {
        return Ok(Vec::new());
    }
    let message: IpcMessage = SchemaAsIpc::new(schema, &IpcWriteOptions::default())
        .try_into()
        .map_err(|err: datafusion::arrow::error::ArrowError| {
            to_status(&Error::Internal {
                context: "encoding a schema",
                reason: err.to_string(),
            })
        })?;
    Ok(message.0.to_vec())
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::Arc;

    use arrow_flight::decode::FlightRecordBatchStream;
    use datafusion::arrow::array::{
        ArrayRef, BooleanArray, DictionaryArray, Int64Array, StringArray,
    };
    use datafusion::arrow::compute::concat_batches;
    use datafusion::arrow::datatypes::{DataType, Field, Int32Type, Schema, SchemaRef};
    use datafusion::arrow::record_batch::RecordBatch;
    use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
    use futures::{StreamExt as _, TryStreamExt as _};

    use super::{MAX_FLIGHT_DATA, flight_stream};

    /// A result's schema: an id, a name and a flag, some null, and a dictionary column.
    pub(in crate::flight) fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
            Field::new("flag", DataType::Boolean, true),
            Field::new(
                "kind",
                DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
                true,
            ),
        ]))
    }

    /// `rows` rows of [`schema`], names of `name_bytes` bytes.
    pub(in crate::flight) fn batch(rows: i64, name_bytes: usize) -> RecordBatch {
        let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..rows));
        let names: ArrayRef = Arc::new(
            (0..rows)
                .map(|i| (i % 5 != 0).then(|| format!("{i:0>name_bytes$}")))
                .collect::<StringArray>(),
        );
        let flags: ArrayRef = Arc::new(
            (0..rows)
                .map(|i| (i % 7 != 0).then_some(i % 2 == 0))
                .collect::<BooleanArray>(),
        );
        let kinds: ArrayRef = Arc::new(
            (0..rows)
                .map(|i| {
                    ["by_name", "by_id"]
                        .get(usize::try_from(i % 2).unwrap_or(0))
                        .copied()
                })
                .collect::<DictionaryArray<Int32Type>>(),
        );
        RecordBatch::try_new(schema(), vec![ids, names, flags, kinds]).expect("batch")
    }

    async fn messages(batches: Vec<RecordBatch>) -> Vec<arrow_flight::FlightData> {
        let stream = RecordBatchStreamAdapter::new(
            schema(),
            futures::stream::iter(batches.into_iter().map(Ok)),
        );
        flight_stream(&schema(), Box::pin(stream))
            .try_collect()
            .await
            .expect("encoded")
    }

    /// What a Flight client reads from `messages`: the schema and the batches.
    pub(in crate::flight) async fn decoded(
        messages: Vec<arrow_flight::FlightData>,
    ) -> (SchemaRef, Vec<RecordBatch>) {
        let mut stream = FlightRecordBatchStream::new_from_flight_data(futures::stream::iter(
            messages.into_iter().map(Ok),
        ));
        let mut batches = Vec::new();
        while let Some(batch) = stream.next().await {
            batches.push(batch.expect("decodes"));
        }
        (stream.schema().cloned().expect("a schema"), batches)
    }

    /// A result stream is its schema's message, then its batches, a batch over the message
    /// limit cut into messages under it, a dictionary column sent with its dictionaries; a
    /// Flight client reads back exactly the rows sent.
    #[tokio::test]
    async fn a_result_stream_reads_back_as_sent_in_messages_under_the_limit() {
        let sent = vec![batch(3, 4), batch(60_000, 48), batch(0, 4), batch(1_000, 8)];
        let encoded = messages(sent.clone()).await;
        let first = encoded.first().expect("a schema message");
        assert!(first.data_body.is_empty() && !first.data_header.is_empty());
        assert!(
            encoded.len() >= 1 + 3 + 2,
            "the 3 MB batch is cut: {} messages",
            encoded.len()
        );
        for message in &encoded {
            assert!(
                message.data_body.len() <= MAX_FLIGHT_DATA,
                "a body of {} bytes",
                message.data_body.len()
            );
        }
        let (read, batches) = decoded(encoded).await;
        assert_eq!(read, schema());
        let rows = |b: &[RecordBatch]| concat_batches(&schema(), b).expect("concatenated");
        assert_eq!(rows(&batches), rows(&sent));
    }

    /// A result without rows is its schema alone.
    #[tokio::test]
    async fn a_result_without_rows_is_its_schema() {
        let encoded = messages(Vec::new()).await;
        assert_eq!(encoded.len(), 1);
        let (read, batches) = decoded(encoded).await;
        assert_eq!(read, schema());
        assert!(batches.is_empty());
    }
}
