//! The Flight SQL service: decode, call the domain, encode. Nothing else lives here: the
//! caller's session and transaction are found in `session`, writes are orchestrated
//! in `ingest`, and results encoded in `encode`.

use std::sync::Arc;
use std::time::Duration;

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
    CommandStatementUpdate, DoPutPreparedStatementResult, EndTransaction, SqlInfo,
    TicketStatementQuery,
};
use arrow_flight::{
    Action, FlightDescriptor, FlightInfo, HandshakeRequest, HandshakeResponse, Ticket,
};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::execution::SendableRecordBatchStream;
use futures::TryStreamExt as _;
use tonic::{Request, Response, Status, Streaming};

use super::encode::{
    BoxedStream, command_info, count_schema, flight_stream, one_batch, schema_bytes,
};
use super::held::HeldSnapshots;
use super::metadata;
use super::prepared::{Prepared, PreparedLimits, PreparedStatements};
use super::session::caller;
use super::status::to_status;
use super::tickets::{TicketKey, TicketKind, params_of_row};
use super::upload::Upload;
use crate::auth::{Authenticator, Role};
use crate::error::{Error, Part, Result};
use crate::query::QueryEngine;
use crate::txn::{Transactions, TxnId};

/// moraine's Flight SQL service.
pub struct MoraineSqlService {
    pub(super) engine: QueryEngine,
    pub(super) prepared: PreparedStatements,
    pub(super) txns: Arc<Transactions>,
    sql_info: SqlInfoData,
    pub(super) auth: Arc<Authenticator>,
    pub(super) ticket_key: TicketKey,
    pub(super) held: Arc<HeldSnapshots>,
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
        auth: Arc<Authenticator>,
        ticket_key: TicketKey,
        held: HeldSnapshots,
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
            auth,
            ticket_key,
            held: Arc::new(held),
        })
    }
}

fn status<T>(result: Result<T>) -> Result<T, Status> {
    result.map_err(|err| to_status(&err))
}

impl MoraineSqlService {
    /// The rows a statement's ticket (a `TicketStatementQuery` this server signed) streams.
    pub(super) async fn statement_rows(
        &self,
        ticket: TicketStatementQuery,
        request: &Request<Ticket>,
    ) -> Result<SendableRecordBatchStream, Status> {
        let session = caller(request)?;
        let ticket = status(TicketKind::decode(
            &ticket.statement_handle,
            &self.ticket_key,
        ))?;
        status(self.stream_ticket(ticket, &session).await)
    }

    /// The rows a prepared read statement's ticket streams.
    pub(super) async fn prepared_rows(
        &self,
        cmd: CommandPreparedStatementQuery,
        request: &Request<Ticket>,
    ) -> Result<SendableRecordBatchStream, Status> {
        let session = caller(request)?;
        let prepared = status(
            self.prepared
                .get(&cmd.prepared_statement_handle, session.owner()),
        )?;
        if prepared.write.is_some() {
            return Err(to_status(&Error::WrongCall(
                "a write statement runs at GetFlightInfo; read its count through the ticket that returns",
            )));
        }
        let txn = self.txn_of_prepared(&prepared, &session);
        let view = status(self.view(txn.as_ref()).await)?;
        status(
            self.engine
                .execute_at(&view, &prepared.sql, prepared.bound)
                .await,
        )
    }
}

#[tonic::async_trait]
impl FlightSqlService for MoraineSqlService {
    type FlightService = MoraineSqlService;

    async fn do_handshake(
        &self,
        request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<BoxedStream<HandshakeResponse>>, Status> {
        // The gate has authenticated the call, and returned a new session's token in the
        // response's `authorization` header when the call opened one.
        caller(&request)?;
        let issued = request
            .extensions()
            .get::<super::gate::IssuedToken>()
            .map(|token| bytes::Bytes::from(token.0.clone().into_bytes()));
        let response = HandshakeResponse {
            protocol_version: 0,
            payload: issued.unwrap_or_default(),
        };
        Ok(Response::new(
            Box::pin(futures::stream::once(async { Ok(response) })) as BoxedStream<_>,
        ))
    }

    async fn get_flight_info_statement(
        &self,
        query: CommandStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let session = caller(&request)?;
        let txn = status(self.txn_of(query.transaction_id.as_ref(), &session))?;
        let descriptor = request.into_inner();
        let info = match status(self.engine.write_statement(&query.query))? {
            Some(write) => match self
                .run_write(&write, Vec::new(), txn.as_ref(), &session)
                .await
            {
                Ok(rows) => self.affected_info(rows, descriptor),
                Err(err) => Err(err),
            },
            None => {
                self.read_info(query.query, Vec::new(), txn, &session, descriptor)
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
        let session = caller(&request)?;
        let prepared = status(
            self.prepared
                .get(&cmd.prepared_statement_handle, session.owner()),
        )?;
        let txn = self.txn_of_prepared(&prepared, &session);
        let descriptor = request.into_inner();
        // A write runs here: the DoGet may never come (DB-API clients run every statement
        // through a prepared statement and read the count from `total_records`).
        let info = match &prepared.write {
            Some(write) => match self
                .run_write(write, prepared.bound.clone(), txn.as_ref(), &session)
                .await
            {
                Ok(rows) => self.affected_info(rows, descriptor),
                Err(err) => Err(err),
            },
            None => {
                self.read_info(prepared.sql, prepared.bound, txn, &session, descriptor)
                    .await
            }
        };
        status(info).map(Response::new)
    }

    async fn do_get_statement(
        &self,
        ticket: TicketStatementQuery,
        request: Request<Ticket>,
    ) -> Result<Response<BoxedStream<arrow_flight::FlightData>>, Status> {
        let stream = self.statement_rows(ticket, &request).await?;
        Ok(Response::new(flight_stream(&stream.schema(), stream)))
    }

    async fn do_get_prepared_statement(
        &self,
        cmd: CommandPreparedStatementQuery,
        request: Request<Ticket>,
    ) -> Result<Response<BoxedStream<arrow_flight::FlightData>>, Status> {
        let stream = self.prepared_rows(cmd, &request).await?;
        Ok(Response::new(flight_stream(&stream.schema(), stream)))
    }

    async fn do_action_create_prepared_statement(
        &self,
        query: ActionCreatePreparedStatementRequest,
        request: Request<Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        let session = caller(&request)?;
        let txn = status(self.txn_of(query.transaction_id.as_ref(), &session))?;
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
            session.id(),
            session.owner().is_some(),
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
        crate::metrics::note_command(request.extensions(), "CommandPreparedStatementUpdate");
        let session = caller(&request)?;
        status(session.require(Role::Writer, "a write statement"))?;
        let prepared = status(
            self.prepared
                .get(&cmd.prepared_statement_handle, session.owner()),
        )?;
        let txn = self.txn_of_prepared(&prepared, &session);
        let Some(write) = prepared.write else {
            return Err(to_status(&Error::WrongCall(
                "a query is not an update; execute it as a query",
            )));
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
        crate::metrics::note_command(request.extensions(), "CommandStatementUpdate");
        // The statement is in the descriptor; the one message carries no data.
        let session = caller(&request)?;
        let txn = status(self.txn_of(cmd.transaction_id.as_ref(), &session))?;
        let Some(write) = status(self.engine.write_statement(&cmd.query))? else {
            return Err(to_status(&Error::Query {
                kind: crate::error::QueryErrorKind::Invalid,
                message: "not an INSERT, UPDATE or DELETE of a catalog table; the SQL surface accepts no DDL or other statements".into(),
            }));
        };
        status(
            self.run_write(&write, Vec::new(), txn.as_ref(), &session)
                .await,
        )
    }

    async fn do_put_statement_ingest(
        &self,
        cmd: CommandStatementIngest,
        request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        crate::metrics::note_command(request.extensions(), "CommandStatementIngest");
        let session = caller(&request)?;
        let upload = Upload::new(request.into_inner());
        status(self.ingest(&cmd, upload, &session).await)
    }

    async fn do_action_begin_transaction(
        &self,
        _query: ActionBeginTransactionRequest,
        request: Request<Action>,
    ) -> Result<ActionBeginTransactionResult, Status> {
        let session = caller(&request)?;
        status(session.require(Role::Writer, "a transaction"))?;
        let id = status(self.txns.begin(session.id(), session.owner().is_some()))?;
        Ok(ActionBeginTransactionResult {
            transaction_id: id.as_bytes().to_vec().into(),
        })
    }

    async fn do_action_end_transaction(
        &self,
        query: ActionEndTransactionRequest,
        request: Request<Action>,
    ) -> Result<(), Status> {
        let session = caller(&request)?;
        status(session.require(Role::Writer, "a transaction"))?;
        let id = TxnId::from_bytes(&query.transaction_id);
        status(self.txns.check_access(&id, session.owner()))?;
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
        crate::metrics::note_command(request.extensions(), "CommandPreparedStatementQuery");
        let session = caller(&request)?;
        let handle = cmd.prepared_statement_handle;
        let prepared = status(self.prepared.get(&handle, session.owner()))?;
        let mut stream = super::upload::decoded(
            request.into_inner().map_err(FlightError::from),
            Arc::default(),
        );
        // A query binds one row: a stream of more is refused as soon as it shows, unread.
        let mut batches: Vec<RecordBatch> = Vec::new();
        while let Some(batch) = stream.try_next().await.map_err(|err| {
            to_status(&Error::Malformed {
                part: Part::Parameters,
                problem: format!("does not decode: {err}"),
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
                return Err(to_status(&Error::ParameterRows { rows }));
            }
            None => Vec::new(),
        };
        if values.len() != prepared.parameters.fields().len() {
            return Err(to_status(&Error::ParameterCount {
                takes: prepared.parameters.fields().len(),
                bound: values.len(),
            }));
        }
        status(self.prepared.bind(&handle, session.owner(), values))?;
        Ok(DoPutPreparedStatementResult {
            prepared_statement_handle: Some(handle),
        })
    }

    async fn do_action_close_prepared_statement(
        &self,
        query: ActionClosePreparedStatementRequest,
        request: Request<Action>,
    ) -> Result<(), Status> {
        let session = caller(&request)?;
        status(
            self.prepared
                .close(&query.prepared_statement_handle, session.owner()),
        )
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
        Ok(Response::new(one_batch(status(metadata::tables(
            query,
            self.engine.catalog().ducklake(),
        ))?)))
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
        crate::metrics::note_command(request.extensions(), "path");
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
        status(caller(&request)?.require(Role::Writer, "an upload"))?;
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
            if let Some(session) = caller(&request)?.id() {
                self.txns.close_session(session);
                self.auth.close_session(session);
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

    async fn list_custom_actions(&self) -> Option<Vec<Result<arrow_flight::ActionType, Status>>> {
        Some(super::admin::action_types().into_iter().map(Ok).collect())
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
}

fn unsupported(what: &str) -> Status {
    to_status(&Error::Unsupported {
        what: format!("{what} is not supported by this server"),
    })
}
