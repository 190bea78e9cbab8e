//! What the service sends: `FlightInfo`s whose tickets this server signs, and record batch
//! streams encoded as Flight data in messages sized for the transport.

use std::pin::Pin;
use std::sync::Arc;

use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::sql::{ProstMessageExt, TicketStatementQuery};
use arrow_flight::{FlightDescriptor, FlightEndpoint, FlightInfo, IpcMessage, SchemaAsIpc, Ticket};
use datafusion::arrow::array::Int64Array;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::ipc::writer::IpcWriteOptions;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::ScalarValue;
use datafusion::execution::SendableRecordBatchStream;
use futures::{Stream, TryStreamExt as _};
use prost::Message as _;
use tonic::{Response, Status};

use super::service::MoraineSqlService;
use super::status::to_status;
use super::tickets::TicketKind;
use crate::auth::Session;
use crate::error::{Error, Result};
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
        let handle = TicketStatementQuery {
            statement_handle: ticket.encode(&self.ticket_key)?.into(),
        };
        let endpoint = FlightEndpoint::new().with_ticket(Ticket {
            ticket: handle.as_any().encode_to_vec().into(),
        });
        info_with(schema, descriptor, endpoint)
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
pub(crate) fn flight_stream(
    schema: SchemaRef,
    batches: SendableRecordBatchStream,
) -> BoxedStream<arrow_flight::FlightData> {
    let batches = batches.map_err(|err| {
        FlightError::Tonic(Box::new(to_status(&crate::query::from_datafusion(err))))
    });
    let encoded = FlightDataEncoderBuilder::new()
        .with_schema(schema)
        .with_max_flight_data_size(MAX_FLIGHT_DATA)
        .build(batches)
        .map_err(|err| match err {
            FlightError::Tonic(status) => *status,
            other => to_status(&Error::Internal {
                context: "encoding a result stream",
                reason: other.to_string(),
            }),
        });
    Box::pin(encoded)
}

pub(super) fn one_batch(batch: RecordBatch) -> BoxedStream<arrow_flight::FlightData> {
    let schema = batch.schema();
    let stream = datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(
        Arc::clone(&schema),
        futures::stream::once(async move { Ok(batch) }),
    );
    flight_stream(schema, Box::pin(stream))
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
