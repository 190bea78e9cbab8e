//! The Flight SQL service: decode, call the domain, encode. Nothing else lives here.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::sql::server::{FlightSqlService, PeekableFlightDataStream};
use arrow_flight::sql::{
    ActionClosePreparedStatementRequest, ActionCreatePreparedStatementRequest,
    ActionCreatePreparedStatementResult, Any, Command, CommandGetCatalogs, CommandGetDbSchemas,
    CommandGetPrimaryKeys, CommandGetSqlInfo, CommandGetTableTypes, CommandGetTables,
    CommandGetXdbcTypeInfo, CommandPreparedStatementQuery, CommandStatementQuery,
    DoPutPreparedStatementResult, ProstMessageExt, SqlInfo, TicketStatementQuery,
};
use arrow_flight::{
    Action, FlightDescriptor, FlightEndpoint, FlightInfo, HandshakeRequest, HandshakeResponse,
    IpcMessage, SchemaAsIpc, Ticket,
};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::ipc::writer::IpcWriteOptions;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::execution::SendableRecordBatchStream;
use futures::{Stream, TryStreamExt as _};
use prost::Message as _;
use tonic::{Request, Response, Status, Streaming};

use super::metadata;
use super::prepared::{Prepared, PreparedStatements};
use super::status::to_status;
use super::tickets::{TicketKind, params_of_row};
use crate::error::{Error, Result};
use crate::query::QueryEngine;

/// Largest encoded message sent, well under the 16 MiB clients accept.
const MAX_FLIGHT_DATA: usize = 2 << 20;

type BoxedStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// moraine's Flight SQL service.
pub struct MoraineSqlService {
    engine: QueryEngine,
    prepared: PreparedStatements,
}

impl MoraineSqlService {
    /// A service answering from `engine`.
    #[must_use]
    pub fn new(engine: QueryEngine) -> Self {
        Self {
            engine,
            prepared: PreparedStatements::new(Duration::from_millis(
                u64::try_from(metadata::PREPARED_STATEMENT_TTL_MS).unwrap_or(600_000),
            )),
        }
    }

    /// The query engine.
    #[must_use]
    pub fn engine(&self) -> &QueryEngine {
        &self.engine
    }

    /// A `FlightInfo` whose one endpoint streams `ticket` from this server.
    pub(crate) fn ticket_info(
        ticket: &TicketKind,
        schema: &SchemaRef,
        descriptor: FlightDescriptor,
    ) -> Result<FlightInfo> {
        let handle = TicketStatementQuery {
            statement_handle: ticket.encode()?.into(),
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
    ) -> Result<SendableRecordBatchStream> {
        match ticket {
            TicketKind::Statement { sql, params } => self.engine.execute(&sql, params).await,
            TicketKind::Table { table, table_id } => self.engine.scan_table(table, table_id).await,
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
        .map_err(|err| Error::InvalidRequest {
            reason: format!("result schema does not encode: {err}"),
        })?
        .with_endpoint(endpoint)
        .with_descriptor(descriptor)
        .with_total_records(-1)
        .with_total_bytes(-1))
}

/// A `FlightInfo` for a metadata command: the command itself is the ticket.
fn command_info(
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
            other => Status::internal(other.to_string()),
        });
    Box::pin(encoded)
}

fn one_batch(batch: RecordBatch) -> BoxedStream<arrow_flight::FlightData> {
    let schema = batch.schema();
    let stream = datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(
        Arc::clone(&schema),
        futures::stream::once(async move { Ok(batch) }),
    );
    flight_stream(schema, Box::pin(stream))
}

fn schema_bytes(schema: &SchemaRef) -> Result<Vec<u8>, Status> {
    if schema.fields().is_empty() {
        return Ok(Vec::new());
    }
    let message: IpcMessage = SchemaAsIpc::new(schema, &IpcWriteOptions::default())
        .try_into()
        .map_err(|err: datafusion::arrow::error::ArrowError| Status::internal(err.to_string()))?;
    Ok(message.0.to_vec())
}

fn status<T>(result: Result<T>) -> Result<T, Status> {
    result.map_err(|err| to_status(&err))
}

#[tonic::async_trait]
impl FlightSqlService for MoraineSqlService {
    type FlightService = MoraineSqlService;

    async fn do_handshake(
        &self,
        _request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<BoxedStream<HandshakeResponse>>, Status> {
        // No authentication yet: answer with an empty token so clients that always
        // handshake can proceed.
        let response = HandshakeResponse {
            protocol_version: 0,
            payload: Vec::new().into(),
        };
        Ok(Response::new(Box::pin(futures::stream::once(async {
            Ok(response)
        }))))
    }

    async fn get_flight_info_statement(
        &self,
        query: CommandStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = status(self.engine.schema(&query.query, Vec::new()).await)?;
        let ticket = TicketKind::Statement {
            sql: query.query,
            params: Vec::new(),
        };
        status(Self::ticket_info(&ticket, &schema, request.into_inner())).map(Response::new)
    }

    async fn get_flight_info_prepared_statement(
        &self,
        cmd: CommandPreparedStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let prepared = status(self.prepared.get(&cmd.prepared_statement_handle))?;
        let schema = status(
            self.engine
                .schema(&prepared.sql, prepared.bound.clone())
                .await,
        )?;
        let ticket = TicketKind::Statement {
            sql: prepared.sql,
            params: prepared.bound,
        };
        status(Self::ticket_info(&ticket, &schema, request.into_inner())).map(Response::new)
    }

    async fn do_get_statement(
        &self,
        ticket: TicketStatementQuery,
        _request: Request<Ticket>,
    ) -> Result<Response<BoxedStream<arrow_flight::FlightData>>, Status> {
        let ticket = status(TicketKind::decode(&ticket.statement_handle))?;
        let stream = status(self.stream_ticket(ticket).await)?;
        Ok(Response::new(flight_stream(stream.schema(), stream)))
    }

    async fn do_get_prepared_statement(
        &self,
        cmd: CommandPreparedStatementQuery,
        _request: Request<Ticket>,
    ) -> Result<Response<BoxedStream<arrow_flight::FlightData>>, Status> {
        let prepared = status(self.prepared.get(&cmd.prepared_statement_handle))?;
        let stream = status(self.engine.execute(&prepared.sql, prepared.bound).await)?;
        Ok(Response::new(flight_stream(stream.schema(), stream)))
    }

    async fn do_action_create_prepared_statement(
        &self,
        query: ActionCreatePreparedStatementRequest,
        _request: Request<Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        let shape = status(self.engine.shape(&query.query).await)?;
        let handle = self.prepared.insert(Prepared {
            sql: query.query,
            parameters: Arc::clone(&shape.parameters),
            bound: Vec::new(),
        });
        Ok(ActionCreatePreparedStatementResult {
            prepared_statement_handle: handle.into(),
            dataset_schema: schema_bytes(&shape.schema)?.into(),
            parameter_schema: schema_bytes(&shape.parameters)?.into(),
        })
    }

    async fn do_put_prepared_statement_query(
        &self,
        cmd: CommandPreparedStatementQuery,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<DoPutPreparedStatementResult, Status> {
        let handle = cmd.prepared_statement_handle;
        let prepared = status(self.prepared.get(&handle))?;
        let batches: Vec<RecordBatch> =
            arrow_flight::decode::FlightRecordBatchStream::new_from_flight_data(
                request.into_inner().map_err(FlightError::from),
            )
            .try_collect()
            .await
            .map_err(|err| {
                Status::invalid_argument(format!("parameter batch does not decode: {err}"))
            })?;
        let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
        let values = match batches.iter().find(|b| b.num_rows() > 0) {
            Some(batch) if rows == 1 => status(params_of_row(batch, 0))?,
            Some(_) => {
                return Err(Status::invalid_argument(format!(
                    "a query binds one row of parameters, got {rows}"
                )));
            }
            None => Vec::new(),
        };
        if values.len() != prepared.parameters.fields().len() {
            return Err(Status::invalid_argument(format!(
                "statement takes {} parameters, {} were bound",
                prepared.parameters.fields().len(),
                values.len()
            )));
        }
        status(self.prepared.bind(&handle, values))?;
        Ok(DoPutPreparedStatementResult {
            prepared_statement_handle: Some(handle),
        })
    }

    async fn do_action_close_prepared_statement(
        &self,
        query: ActionClosePreparedStatementRequest,
        _request: Request<Action>,
    ) -> Result<(), Status> {
        self.prepared.close(&query.prepared_statement_handle);
        Ok(())
    }

    async fn get_flight_info_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.into_builder().schema();
        command_info(&query, &schema, request.into_inner())
    }

    async fn do_get_catalogs(
        &self,
        query: CommandGetCatalogs,
        _request: Request<Ticket>,
    ) -> Result<Response<BoxedStream<arrow_flight::FlightData>>, Status> {
        Ok(Response::new(one_batch(status(metadata::catalogs(query))?)))
    }

    async fn get_flight_info_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder().schema();
        command_info(&query, &schema, request.into_inner())
    }

    async fn do_get_schemas(
        &self,
        query: CommandGetDbSchemas,
        _request: Request<Ticket>,
    ) -> Result<Response<BoxedStream<arrow_flight::FlightData>>, Status> {
        Ok(Response::new(one_batch(status(metadata::db_schemas(
            query,
        ))?)))
    }

    async fn get_flight_info_tables(
        &self,
        query: CommandGetTables,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = metadata::tables_schema(query.clone());
        command_info(&query, &schema, request.into_inner())
    }

    async fn do_get_tables(
        &self,
        query: CommandGetTables,
        _request: Request<Ticket>,
    ) -> Result<Response<BoxedStream<arrow_flight::FlightData>>, Status> {
        Ok(Response::new(one_batch(status(metadata::tables(query))?)))
    }

    async fn get_flight_info_table_types(
        &self,
        query: CommandGetTableTypes,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.into_builder().schema();
        command_info(&query, &schema, request.into_inner())
    }

    async fn do_get_table_types(
        &self,
        query: CommandGetTableTypes,
        _request: Request<Ticket>,
    ) -> Result<Response<BoxedStream<arrow_flight::FlightData>>, Status> {
        Ok(Response::new(one_batch(status(metadata::table_types(
            query,
        ))?)))
    }

    async fn get_flight_info_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder(&metadata::SQL_INFO).schema();
        command_info(&query, &schema, request.into_inner())
    }

    async fn do_get_sql_info(
        &self,
        query: CommandGetSqlInfo,
        _request: Request<Ticket>,
    ) -> Result<Response<BoxedStream<arrow_flight::FlightData>>, Status> {
        let batch = query
            .into_builder(&metadata::SQL_INFO)
            .build()
            .map_err(|err| Status::internal(err.to_string()))?;
        Ok(Response::new(one_batch(batch)))
    }

    async fn get_flight_info_xdbc_type_info(
        &self,
        query: CommandGetXdbcTypeInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.into_builder(&metadata::XDBC_TYPES).schema();
        command_info(&query, &schema, request.into_inner())
    }

    async fn do_get_xdbc_type_info(
        &self,
        query: CommandGetXdbcTypeInfo,
        _request: Request<Ticket>,
    ) -> Result<Response<BoxedStream<arrow_flight::FlightData>>, Status> {
        let batch = query
            .into_builder(&metadata::XDBC_TYPES)
            .build()
            .map_err(|err| Status::internal(err.to_string()))?;
        Ok(Response::new(one_batch(batch)))
    }

    async fn get_flight_info_primary_keys(
        &self,
        query: CommandGetPrimaryKeys,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        command_info(&query, &metadata::PRIMARY_KEYS_SCHEMA, request.into_inner())
    }

    async fn do_get_primary_keys(
        &self,
        query: CommandGetPrimaryKeys,
        _request: Request<Ticket>,
    ) -> Result<Response<BoxedStream<arrow_flight::FlightData>>, Status> {
        Ok(Response::new(one_batch(status(metadata::primary_keys(
            &query,
        ))?)))
    }

    async fn get_flight_info_fallback(
        &self,
        cmd: Command,
        _request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        Err(unsupported(cmd.type_url()))
    }

    async fn do_get_fallback(
        &self,
        _request: Request<Ticket>,
        message: Any,
    ) -> Result<Response<BoxedStream<arrow_flight::FlightData>>, Status> {
        Err(unsupported(&message.type_url))
    }

    async fn do_put_fallback(
        &self,
        _request: Request<PeekableFlightDataStream>,
        message: Any,
    ) -> Result<Response<BoxedStream<arrow_flight::PutResult>>, Status> {
        Err(unsupported(&message.type_url))
    }

    async fn do_action_fallback(
        &self,
        request: Request<Action>,
    ) -> Result<Response<BoxedStream<arrow_flight::Result>>, Status> {
        Err(unsupported(&request.into_inner().r#type))
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
}

fn unsupported(what: &str) -> Status {
    to_status(&Error::Unsupported {
        what: format!("{what} is not supported by this server"),
    })
}
