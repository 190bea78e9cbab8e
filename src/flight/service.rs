//! The Flight SQL service: decode, call the domain, encode. Nothing else lives here.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::sql::metadata::SqlInfoData;
use arrow_flight::sql::server::{FlightSqlService, PeekableFlightDataStream};
use arrow_flight::sql::{
    ActionBeginTransactionRequest, ActionBeginTransactionResult,
    ActionClosePreparedStatementRequest, ActionCreatePreparedStatementRequest,
    ActionCreatePreparedStatementResult, ActionEndTransactionRequest, Any, Command,
    CommandGetCatalogs, CommandGetDbSchemas, CommandGetPrimaryKeys, CommandGetSqlInfo,
    CommandGetTableTypes, CommandGetTables, CommandGetXdbcTypeInfo, CommandPreparedStatementQuery,
    CommandPreparedStatementUpdate, CommandStatementIngest, CommandStatementQuery,
    CommandStatementUpdate, DoPutPreparedStatementResult, EndTransaction, ProstMessageExt, SqlInfo,
    TicketStatementQuery,
};
use arrow_flight::{
    Action, FlightDescriptor, FlightEndpoint, FlightInfo, HandshakeRequest, HandshakeResponse,
    IpcMessage, SchemaAsIpc, Ticket,
};
use datafusion::arrow::array::Int64Array;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::ipc::writer::IpcWriteOptions;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::execution::SendableRecordBatchStream;
use futures::{Stream, TryStreamExt as _};
use prost::Message as _;
use tonic::{Request, Response, Status, Streaming};

use super::metadata;
use super::prepared::{Prepared, PreparedLimits, PreparedStatements};
use super::status::to_status;
use super::tickets::{TicketKind, params_of_row};
use super::upload::Upload;
use crate::catalog::CatalogSnapshot;
use crate::error::{Error, Result};
use crate::model::CatalogTable;
use crate::query::QueryEngine;
use crate::query::dml::WriteStatement;
use crate::txn::{Transactions, TxnId, random_token};
use crate::write::Op;
use crate::write::decode::{MissingColumns, RowShape};

/// Largest encoded message sent, well under the 16 MiB clients accept.
const MAX_FLIGHT_DATA: usize = 2 << 20;

type BoxedStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// The app metadata that makes a one-stream `DoPut` commit, on the stream's last message.
pub const COMMIT_MARKER: &[u8] = b"commit";

/// The result of a write statement: one row, the rows it affected.
fn count_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new(
        "count",
        DataType::Int64,
        false,
    )]))
}

/// moraine's Flight SQL service.
pub struct MoraineSqlService {
    engine: QueryEngine,
    prepared: PreparedStatements,
    txns: Arc<Transactions>,
    sql_info: SqlInfoData,
}

/// The session a request belongs to: the bearer token it carries.
fn session_of<T>(request: &Request<T>) -> Option<String> {
    let value = request.metadata().get("authorization")?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then(|| token.to_owned())
}

/// A transaction id as sent, if one was.
fn explicit_txn(id: Option<&bytes::Bytes>) -> Option<TxnId> {
    id.filter(|id| !id.is_empty())
        .map(|id| TxnId::from_bytes(id))
}

impl MoraineSqlService {
    /// A service answering from `engine`, writing through `txns`.
    ///
    /// # Errors
    /// When the `SqlInfo` does not build (a bug).
    pub fn new(
        engine: QueryEngine,
        txns: Arc<Transactions>,
        prepared: PreparedLimits,
    ) -> Result<Self> {
        let timeout_ms = i32::try_from(txns.config().idle_timeout.as_millis()).unwrap_or(i32::MAX);
        Ok(Self {
            engine,
            prepared: PreparedStatements::new(PreparedLimits {
                ttl: Duration::from_millis(
                    u64::try_from(metadata::PREPARED_STATEMENT_TTL_MS).unwrap_or(600_000),
                ),
                ..prepared
            }),
            sql_info: metadata::sql_info(timeout_ms)?,
            txns,
        })
    }

    /// The transactions.
    #[must_use]
    pub fn transactions(&self) -> &Transactions {
        &self.txns
    }

    /// The transaction a request runs in: the id it names, else its session's open one.
    fn txn_of(&self, explicit: Option<&bytes::Bytes>, session: Option<&str>) -> Option<TxnId> {
        explicit_txn(explicit).or_else(|| session.and_then(|s| self.txns.of_session(s)))
    }

    /// The transaction a prepared statement runs in. A handle prepared in a transaction that
    /// has since ended follows its session to the session's current one: ADBC keeps using a
    /// handle across `commit()`.
    fn txn_of_prepared(&self, prepared: &Prepared, session: Option<&str>) -> Option<TxnId> {
        let current = || session.and_then(|s| self.txns.of_session(s));
        match &prepared.txn {
            Some(id) if self.txns.is_open(id) => Some(id.clone()),
            Some(id) => current().or_else(|| Some(id.clone())),
            None => current(),
        }
    }

    /// What a request in `txn` reads.
    async fn view(&self, txn: Option<&TxnId>) -> Result<CatalogSnapshot> {
        match txn {
            Some(id) => self.txns.view(id).await,
            None => self.engine.catalog().snapshot().await,
        }
    }

    /// Stages `ops` in `txn`, or commits them at once outside a transaction; the rows they
    /// affect.
    async fn apply(
        &self,
        ops: Vec<Op>,
        txn: Option<&TxnId>,
        base: Option<CatalogSnapshot>,
    ) -> Result<i64> {
        if ops.is_empty() {
            return Ok(0);
        }
        let affected = match txn {
            Some(id) => self.txns.stage(id, ops).await?,
            None => self.txns.autocommit(ops, base).await?.affected.iter().sum(),
        };
        Ok(i64::try_from(affected).unwrap_or(i64::MAX))
    }

    /// Runs a write statement in `txn` (or on its own) and returns the rows it affected.
    async fn run_write(
        &self,
        write: &WriteStatement,
        params: Vec<datafusion::common::ScalarValue>,
        txn: Option<&TxnId>,
    ) -> Result<i64> {
        let view = self.view(txn).await?;
        let ops = self.engine.write_ops(&view, write, params).await?;
        self.apply(ops, txn, Some(view)).await
    }

    /// The `FlightInfo` of a write statement that has run: its count as `total_records`, and
    /// a ticket streaming that count.
    fn affected_info(rows: i64, descriptor: FlightDescriptor) -> Result<FlightInfo> {
        let info = Self::ticket_info(&TicketKind::Affected { rows }, &count_schema(), descriptor)?;
        Ok(info.with_total_records(rows))
    }

    /// The `FlightInfo` of a query read in `txn`.
    async fn query_info(
        &self,
        sql: String,
        params: Vec<datafusion::common::ScalarValue>,
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
        Self::ticket_info(&ticket, &schema, descriptor)
    }

    /// A one-stream plain-Flight upload to `path`: one atomic batch, staged as it is read and
    /// committed only when the stream's last message carries [`COMMIT_MARKER`]. Returns the
    /// put result's JSON.
    pub(crate) async fn plain_put(&self, path: &[String], upload: Upload) -> Result<String> {
        let (shape, missing) = match path {
            [name] if name == "ducklake_mapping" => (RowShape::MappingLoad, MissingColumns::Refuse),
            [name] if name == "ducklake_commit" => (RowShape::Commit, MissingColumns::Null),
            [name] if name == CatalogTable::DataFile.name() => (
                RowShape::Table(CatalogTable::DataFile),
                MissingColumns::Refuse,
            ),
            _ => {
                return Err(Error::NotFound {
                    what: format!(
                        "upload path {:?} (accepted: [\"ducklake_mapping\"] with rows in the shape of DuckLake's mapping load query, [\"ducklake_data_file\"] with data-file rows, [\"ducklake_commit\"] with both)",
                        crate::error::excerpt(&path.join("/")),
                    ),
                });
            }
        };
        let (changes, tally) = upload.changes(shape, missing);
        let marker = tally.clone();
        let report = self
            .txns
            .autocommit_stream(changes, None, move || {
                if marker.last_metadata().as_ref() == COMMIT_MARKER {
                    return Ok(());
                }
                Err(Error::NotCommitted {
                    reason: format!(
                        "upload to {path:?} not committed: the stream ended without the commit marker (app_metadata {:?} on its last message); nothing of its {} rows was written",
                        String::from_utf8_lossy(COMMIT_MARKER),
                        marker.rows()
                    ),
                })
            })
            .await?;
        Ok(format!(
            "{{\"committed\": true, \"rows\": {}, \"mappings\": {}, \"data_files\": {}}}",
            tally.rows(),
            report.summary.mappings_created,
            report.summary.files_created
        ))
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
            TicketKind::Statement { sql, params, txn } => {
                let view = self
                    .view(txn.map(|id| TxnId::from_bytes(id.as_bytes())).as_ref())
                    .await?;
                self.engine.execute_at(&view, &sql, params).await
            }
            TicketKind::Table { table, table_id } => self.engine.scan_table(table, table_id).await,
            TicketKind::Affected { rows } => {
                let batch = RecordBatch::try_new(
                    count_schema(),
                    vec![Arc::new(Int64Array::from(vec![rows]))],
                )
                .map_err(|err| Error::InvalidRequest {
                    reason: format!("count result does not build: {err}"),
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
            other => to_status(&Error::Internal {
                context: "encoding a result stream",
                reason: other.to_string(),
            }),
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
        .map_err(|err: datafusion::arrow::error::ArrowError| {
            to_status(&Error::Internal {
                context: "encoding a schema",
                reason: err.to_string(),
            })
        })?;
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
        request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<BoxedStream<HandshakeResponse>>, Status> {
        // No authentication: any credentials (or none) open a session. The token identifies
        // the session, so that requests without a transaction id (ADBC's ingest) join the
        // session's open transaction. A client that already holds a token keeps it.
        let token = session_of(&request).unwrap_or_else(random_token);
        let response = HandshakeResponse {
            protocol_version: 0,
            payload: token.clone().into_bytes().into(),
        };
        let mut response = Response::new(
            Box::pin(futures::stream::once(async { Ok(response) })) as BoxedStream<_>
        );
        let header = format!("Bearer {token}").parse().map_err(|_| {
            to_status(&Error::Internal {
                context: "answering a handshake",
                reason: "the session token is not a valid header value".into(),
            })
        })?;
        response.metadata_mut().insert("authorization", header);
        Ok(response)
    }

    async fn get_flight_info_statement(
        &self,
        query: CommandStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let session = session_of(&request);
        let txn = self.txn_of(query.transaction_id.as_ref(), session.as_deref());
        let descriptor = request.into_inner();
        let info = match status(self.engine.write_statement(&query.query))? {
            Some(write) => match self.run_write(&write, Vec::new(), txn.as_ref()).await {
                Ok(rows) => Self::affected_info(rows, descriptor),
                Err(err) => Err(err),
            },
            None => {
                self.query_info(query.query, Vec::new(), txn, descriptor)
                    .await
            }
        };
        status(info).map(Response::new)
    }

    async fn get_flight_info_prepared_statement(
        &self,
        cmd: CommandPreparedStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let prepared = status(self.prepared.get(&cmd.prepared_statement_handle))?;
        let session = session_of(&request);
        let txn = self.txn_of_prepared(&prepared, session.as_deref());
        let descriptor = request.into_inner();
        // A write runs here: the DoGet may never come (DB-API clients run every statement
        // through a prepared statement and read the count from `total_records`).
        let info = match &prepared.write {
            Some(write) => match self
                .run_write(write, prepared.bound.clone(), txn.as_ref())
                .await
            {
                Ok(rows) => Self::affected_info(rows, descriptor),
                Err(err) => Err(err),
            },
            None => {
                self.query_info(prepared.sql, prepared.bound, txn, descriptor)
                    .await
            }
        };
        status(info).map(Response::new)
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
        if prepared.write.is_some() {
            return Err(to_status(&Error::InvalidRequest {
                reason: "a write statement runs at GetFlightInfo; read its count through the ticket that returns".into(),
            }));
        }
        let session = session_of(&_request);
        let txn = self.txn_of_prepared(&prepared, session.as_deref());
        let view = status(self.view(txn.as_ref()).await)?;
        let stream = status(
            self.engine
                .execute_at(&view, &prepared.sql, prepared.bound)
                .await,
        )?;
        Ok(Response::new(flight_stream(stream.schema(), stream)))
    }

    async fn do_action_create_prepared_statement(
        &self,
        query: ActionCreatePreparedStatementRequest,
        request: Request<Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        let session = session_of(&request);
        let txn = self.txn_of(query.transaction_id.as_ref(), session.as_deref());
        let (schema, parameters, write) =
            if let Some(write) = status(self.engine.write_statement(&query.query))? {
                let parameters = status(self.engine.write_parameters(&write).await)?;
                (count_schema(), parameters, Some(write))
            } else {
                let shape = status(self.engine.shape(&query.query).await)?;
                (shape.schema, shape.parameters, None)
            };
        let handle = status(self.prepared.insert(
            Prepared {
                sql: query.query,
                parameters: Arc::clone(&parameters),
                bound: Vec::new(),
                write,
                txn,
            },
            session.as_deref(),
        ))?;
        Ok(ActionCreatePreparedStatementResult {
            prepared_statement_handle: handle.into(),
            dataset_schema: schema_bytes(&schema)?.into(),
            parameter_schema: schema_bytes(&parameters)?.into(),
        })
    }

    async fn do_put_prepared_statement_update(
        &self,
        cmd: CommandPreparedStatementUpdate,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        let prepared = status(self.prepared.get(&cmd.prepared_statement_handle))?;
        let session = session_of(&request);
        let txn = self.txn_of_prepared(&prepared, session.as_deref());
        let Some(write) = prepared.write else {
            return Err(to_status(&Error::InvalidRequest {
                reason: "a query is not an update; execute it as a query".into(),
            }));
        };
        // Each parameter row runs the statement once; no rows runs it once with what is bound.
        let mut upload = Upload::new(request.into_inner());
        let mut rows = Vec::new();
        while let Some(batch) = status(upload.next_batch().await)? {
            for row in 0..batch.num_rows() {
                rows.push(status(params_of_row(&batch, row))?);
            }
        }
        if rows.is_empty() {
            rows.push(prepared.bound);
        }
        // Every parameter row is one statement of one request, all of them found against the
        // same view and applied together: all rows land or none does, and inside a
        // transaction a refused row leaves the transaction as it was.
        let view = status(self.view(txn.as_ref()).await)?;
        let mut ops = Vec::new();
        for params in rows {
            ops.extend(status(self.engine.write_ops(&view, &write, params).await)?);
        }
        status(self.apply(ops, txn.as_ref(), Some(view)).await)
    }

    async fn do_put_statement_update(
        &self,
        cmd: CommandStatementUpdate,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        // The statement is in the descriptor; the one message carries no data.
        let session = session_of(&request);
        let txn = self.txn_of(cmd.transaction_id.as_ref(), session.as_deref());
        let Some(write) = status(self.engine.write_statement(&cmd.query))? else {
            return Err(to_status(&Error::Query {
                kind: crate::error::QueryErrorKind::Invalid,
                message: "not an INSERT, UPDATE or DELETE of a catalog table; the SQL surface accepts no DDL or other statements".into(),
            }));
        };
        status(self.run_write(&write, Vec::new(), txn.as_ref()).await)
    }

    async fn do_put_statement_ingest(
        &self,
        cmd: CommandStatementIngest,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        let session = session_of(&request);
        let table = status(ingest_target(&cmd))?;
        let txn = self.txn_of(cmd.transaction_id.as_ref(), session.as_deref());
        let upload = Upload::new(request.into_inner());
        let (changes, tally) = upload.changes(RowShape::Table(table), MissingColumns::Refuse);
        // Staged batch by batch as the stream is read; a stream that fails stages nothing.
        if let Some(id) = txn {
            status(self.txns.stage_stream(&id, changes).await)?;
        } else {
            status(self.txns.autocommit_stream(changes, None, || Ok(())).await)?;
        }
        Ok(i64::try_from(tally.rows()).unwrap_or(i64::MAX))
    }

    async fn do_action_begin_transaction(
        &self,
        _query: ActionBeginTransactionRequest,
        request: Request<Action>,
    ) -> Result<ActionBeginTransactionResult, Status> {
        let session = session_of(&request);
        let id = status(self.txns.begin(session.as_deref()))?;
        Ok(ActionBeginTransactionResult {
            transaction_id: id.as_bytes().to_vec().into(),
        })
    }

    async fn do_action_end_transaction(
        &self,
        query: ActionEndTransactionRequest,
        _request: Request<Action>,
    ) -> Result<(), Status> {
        let id = TxnId::from_bytes(&query.transaction_id);
        match EndTransaction::try_from(query.action) {
            Ok(EndTransaction::Commit) => status(self.txns.commit(&id).await).map(|_| ()),
            Ok(EndTransaction::Rollback) => status(self.txns.rollback(&id)),
            _ => Err(to_status(&Error::InvalidRequest {
                reason: format!(
                    "EndTransaction action {} is neither COMMIT nor ROLLBACK",
                    query.action
                ),
            })),
        }
    }

    async fn do_put_prepared_statement_query(
        &self,
        cmd: CommandPreparedStatementQuery,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<DoPutPreparedStatementResult, Status> {
        let handle = cmd.prepared_statement_handle;
        let prepared = status(self.prepared.get(&handle))?;
        let mut stream = super::upload::decoded(
            request.into_inner().map_err(FlightError::from),
            Arc::default(),
        );
        // A query binds one row: a stream of more is refused as soon as it shows, unread.
        let mut batches: Vec<RecordBatch> = Vec::new();
        while let Some(batch) = stream.try_next().await.map_err(|err| {
            to_status(&Error::InvalidRequest {
                reason: format!("parameter batch does not decode: {err}"),
            })
        })? {
            batches.push(batch);
            if batches.iter().map(RecordBatch::num_rows).sum::<usize>() > 1 {
                break;
            }
        }
        let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
        let values = match batches.iter().find(|b| b.num_rows() > 0) {
            Some(batch) if rows == 1 => status(params_of_row(batch, 0))?,
            Some(_) => {
                return Err(to_status(&Error::InvalidRequest {
                    reason: format!("a query binds one row of parameters, got {rows}"),
                }));
            }
            None => Vec::new(),
        };
        if values.len() != prepared.parameters.fields().len() {
            return Err(to_status(&Error::InvalidRequest {
                reason: format!(
                    "statement takes {} parameters, {} were bound",
                    prepared.parameters.fields().len(),
                    values.len()
                ),
            }));
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
        let schema = query.clone().into_builder(&self.sql_info).schema();
        command_info(&query, &schema, request.into_inner())
    }

    async fn do_get_sql_info(
        &self,
        query: CommandGetSqlInfo,
        _request: Request<Ticket>,
    ) -> Result<Response<BoxedStream<arrow_flight::FlightData>>, Status> {
        let batch = query.into_builder(&self.sql_info).build().map_err(|err| {
            to_status(&Error::Internal {
                context: "building a metadata result",
                reason: err.to_string(),
            })
        })?;
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
            .map_err(|err| {
                to_status(&Error::Internal {
                    context: "building a metadata result",
                    reason: err.to_string(),
                })
            })?;
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
        mut request: Request<PeekableFlightDataStream>,
        message: Any,
    ) -> Result<Response<BoxedStream<arrow_flight::PutResult>>, Status> {
        // A path descriptor (plain Flight) arrives here: it is no Flight SQL command.
        let path = match request.get_mut().peek().await {
            Some(Ok(first)) => first
                .flight_descriptor
                .as_ref()
                .filter(|d| d.r#type() == arrow_flight::flight_descriptor::DescriptorType::Path)
                .map(|d| d.path.clone()),
            _ => None,
        };
        let Some(path) = path else {
            return Err(unsupported(&message.type_url));
        };
        let upload = Upload::new(request.into_inner());
        let result = status(self.plain_put(&path, upload).await)?;
        Ok(Response::new(Box::pin(futures::stream::once(async move {
            Ok(arrow_flight::PutResult {
                app_metadata: result.into_bytes().into(),
            })
        }))))
    }

    async fn do_action_fallback(
        &self,
        request: Request<Action>,
    ) -> Result<Response<BoxedStream<arrow_flight::Result>>, Status> {
        if request.get_ref().r#type == "CloseSession" {
            // The session is over: its open transaction, if any, is rolled back.
            if let Some(session) = session_of(&request) {
                self.txns.close_session(&session);
            }
            // CloseSessionResult { status: CLOSED }.
            let closed = arrow_flight::Result {
                body: vec![0x08, 0x01].into(),
            };
            return Ok(Response::new(Box::pin(futures::stream::once(async {
                Ok(closed)
            }))));
        }
        Err(unsupported(&request.into_inner().r#type))
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
}

/// The table an ingest appends to, after checking what it asks for.
fn ingest_target(cmd: &CommandStatementIngest) -> Result<CatalogTable> {
    use arrow_flight::sql::{TableExistsOption, TableNotExistOption};
    if cmd.temporary {
        return Err(Error::InvalidRequest {
            reason: format!(
                "cannot ingest into a temporary table {}",
                crate::error::excerpt(&cmd.table)
            ),
        });
    }
    let catalog_ok = cmd
        .catalog
        .as_deref()
        .is_none_or(|c| c.is_empty() || c.eq_ignore_ascii_case(crate::query::CATALOG_NAME));
    let schema_ok = cmd
        .schema
        .as_deref()
        .is_none_or(|s| s.is_empty() || s.eq_ignore_ascii_case(crate::query::SCHEMA_NAME));
    let options = cmd.table_definition_options.unwrap_or_default();
    let table = CatalogTable::from_name(&cmd.table).filter(|_| catalog_ok && schema_ok);
    let Some(table) = table else {
        if TableNotExistOption::try_from(options.if_not_exist) == Ok(TableNotExistOption::Create) {
            return Err(Error::Unsupported {
                what: format!(
                    "cannot create table {}: the catalog tables are fixed ({})",
                    crate::error::excerpt(&cmd.table),
                    CatalogTable::ALL.map(CatalogTable::name).join(", ")
                ),
            });
        }
        return Err(Error::NotFound {
            what: format!(
                "table {} (ingest appends to {})",
                crate::error::excerpt(&cmd.table),
                CatalogTable::ALL.map(CatalogTable::name).join(", ")
            ),
        });
    };
    match TableExistsOption::try_from(options.if_exists) {
        Ok(TableExistsOption::Append | TableExistsOption::Unspecified) | Err(_) => Ok(table),
        Ok(TableExistsOption::Fail) => Err(Error::AlreadyExists {
            what: format!("table {table} exists; ingest into it with mode append"),
        }),
        Ok(TableExistsOption::Replace) => Err(Error::Unsupported {
            what: format!(
                "replacing table {table} is not supported; DELETE its rows and append instead"
            ),
        }),
    }
}

fn unsupported(what: &str) -> Status {
    to_status(&Error::Unsupported {
        what: format!("{what} is not supported by this server"),
    })
}
