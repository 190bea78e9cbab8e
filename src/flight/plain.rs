//! Plain Arrow Flight for clients that know no Flight SQL (pyarrow.flight notebooks):
//! `list_flights` lists the served tables; a path descriptor `[table]` names a table (read
//! through parallel endpoints at one held snapshot), `[table, "<table_id>"]` one DuckLake
//! table's rows of it, and `[table, "@<snapshot>"]` a table at a snapshot an earlier
//! `GetFlightInfo` holds. Every other call goes to the Flight SQL service.

use std::pin::Pin;
use std::sync::Arc;

use arrow_flight::flight_descriptor::DescriptorType;
use arrow_flight::flight_service_server::FlightService;
use arrow_flight::{
    Action, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo, HandshakeRequest, PollInfo,
    SchemaResult, Ticket,
};
use datafusion::execution::SendableRecordBatchStream;
use futures::Stream;
use tonic::{Request, Response, Status, Streaming};

use super::encode::PartsAt;
use super::held::HeldId;
use super::service::MoraineSqlService;
use super::status::to_status;
use super::tickets::TicketKind;
use crate::batch::served_schema;
use crate::error::{Error, Named, Part, Result};
use crate::model::CatalogTable;

type Inner = MoraineSqlService;

/// The Flight service moraine serves.
#[derive(Clone)]
pub struct MoraineFlightService {
    sql: Arc<MoraineSqlService>,
}

impl MoraineFlightService {
    /// Serves `sql` and the plain-Flight surface over the same engine.
    #[must_use]
    pub fn new(sql: MoraineSqlService) -> Self {
        Self { sql: Arc::new(sql) }
    }
}

/// The table (and table id) a path descriptor names.
fn table_of_path(path: &[String]) -> Result<TicketKind> {
    let unknown = || Error::NotFound {
        what: Named::Table(path.first().cloned().unwrap_or_default()),
    };
    match path {
        [table] => Ok(TicketKind::Table {
            table: CatalogTable::from_name(table).ok_or_else(unknown)?,
            table_id: None,
        }),
        [table, table_id] => {
            let table = CatalogTable::from_name(table).ok_or_else(unknown)?;
            if table == CatalogTable::NameMapping {
                return Err(Error::InvalidRequest {
                    reason: "ducklake_name_mapping has no table_id column; use a path of the table name alone".into(),
                });
            }
            let table_id = table_id.parse().map_err(|_| Error::InvalidRequest {
                reason: format!("table id {table_id:?} in the path is not an integer"),
            })?;
            Ok(TicketKind::Table {
                table,
                table_id: Some(table_id),
            })
        }
        _ => Err(Error::InvalidRequest {
            reason: format!(
                "a path descriptor is [table] or [table, table_id]; got {} elements",
                path.len()
            ),
        }),
    }
}

/// The table and held snapshot a path `[table, "@<snapshot>"]` names, if it is one.
fn held_path(path: &[String]) -> Option<Result<(CatalogTable, HeldId)>> {
    let [table, held] = path else {
        return None;
    };
    let hex = held.strip_prefix('@')?;
    let Some(table) = CatalogTable::from_name(table) else {
        return Some(Err(Error::NotFound {
            what: Named::Table(table.clone()),
        }));
    };
    let id = crate::key_range::unhex(hex)
        .and_then(|bytes| HeldId::try_from(bytes).ok())
        .ok_or_else(|| Error::Malformed {
            part: Part::Descriptor,
            problem: format!(
                "path names snapshot {}, which is not 32 hex digits",
                crate::error::excerpt(hex)
            ),
        });
    Some(id.map(|id| (table, id)))
}

/// The metrics label of the Flight SQL message `bytes` hold.
fn label_of_message(bytes: &[u8]) -> &'static str {
    use prost::Message as _;
    arrow_flight::sql::Any::decode(bytes)
        .map_or("other", |any| crate::metrics::command_label(&any.type_url))
}

/// Notes, for the call's metrics, what a descriptor names.
fn note_descriptor<T>(request: &Request<T>, descriptor: &FlightDescriptor) {
    let command = if descriptor.r#type() == DescriptorType::Path {
        "path"
    } else {
        label_of_message(&descriptor.cmd)
    };
    crate::metrics::note_command(request.extensions(), command);
}

/// Where client bytes that should hold a Flight SQL message came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Carrier {
    Descriptor,
    Ticket,
    Action,
}

/// Checks that `bytes` decode as the Flight SQL message they must be, before arrow-flight's
/// dispatch decodes them again: bytes that do not decode are the client's error, named as
/// such (the dispatch would report them as an internal error), and a message of an unknown
/// type in a descriptor is a command this server does not serve.
fn check_message(bytes: &[u8], carrier: Carrier) -> Result<()> {
    use arrow_flight::sql::{Any, Command};
    use prost::Message as _;

    let part = match carrier {
        Carrier::Descriptor => Part::Descriptor,
        Carrier::Ticket => Part::Ticket,
        Carrier::Action => Part::ActionBody,
    };
    let any = Any::decode(bytes).map_err(|err| Error::Malformed {
        part: part.clone(),
        problem: format!("is not a Flight SQL message: {err}"),
    })?;
    match Command::try_from(any) {
        Err(err) => Err(Error::Malformed {
            part: part.clone(),
            problem: format!("does not decode: {err}"),
        }),
        Ok(Command::Unknown(any)) => match carrier {
            Carrier::Descriptor => Err(Error::Unsupported {
                what: format!(
                    "command {} is not supported by this server",
                    crate::error::excerpt(&any.type_url)
                ),
            }),
            Carrier::Ticket => Err(Error::Malformed {
                part: part.clone(),
                problem: "is not one this server issued".into(),
            }),
            // Actions of other kinds are refused by name by the dispatch.
            Carrier::Action => Ok(()),
        },
        Ok(_) => Ok(()),
    }
}

/// A `DoGet` ticket that streams a statement's rows, which
/// [`DirectGet`](super::wire::DirectGet) sends itself.
pub(super) enum RowsTicket {
    /// A statement's ticket, signed by this server.
    Statement(arrow_flight::sql::TicketStatementQuery),
    /// A prepared read statement's.
    Prepared(arrow_flight::sql::CommandPreparedStatementQuery),
}

impl RowsTicket {
    /// The ticket `bytes` hold, when it is one that streams a statement's rows. Any other
    /// bytes (other commands, bytes that do not decode) are for the Flight service.
    pub(super) fn of(bytes: &[u8]) -> Option<Self> {
        use arrow_flight::sql::{Any, Command};
        use prost::Message as _;
        match Command::try_from(Any::decode(bytes).ok()?).ok()? {
            Command::TicketStatementQuery(ticket) => Some(Self::Statement(ticket)),
            Command::CommandPreparedStatementQuery(command) => Some(Self::Prepared(command)),
            _ => None,
        }
    }
}

impl MoraineFlightService {
    /// The rows a `DoGet` of `ticket` streams: what `do_get` answers, before the rows are
    /// encoded.
    pub(super) async fn ticket_rows(
        &self,
        ticket: RowsTicket,
        request: Request<Ticket>,
    ) -> Result<SendableRecordBatchStream, Status> {
        use arrow_flight::sql::{
            CommandPreparedStatementQuery, ProstMessageExt as _, TicketStatementQuery,
        };
        let type_url = match &ticket {
            RowsTicket::Statement(_) => TicketStatementQuery::type_url(),
            RowsTicket::Prepared(_) => CommandPreparedStatementQuery::type_url(),
        };
        crate::metrics::note_command(
            request.extensions(),
            crate::metrics::command_label(type_url),
        );
        match ticket {
            RowsTicket::Statement(ticket) => self.sql.statement_rows(ticket, &request).await,
            RowsTicket::Prepared(command) => self.sql.prepared_rows(command, &request).await,
        }
    }
}

fn table_info(
    sql: &MoraineSqlService,
    ticket: &TicketKind,
    descriptor: FlightDescriptor,
) -> Result<FlightInfo> {
    let TicketKind::Table { table, .. } = ticket else {
        return Err(Error::WrongCall("not a table ticket"));
    };
    sql.ticket_info(
        ticket,
        &served_schema(sql.engine.catalog().ducklake(), *table),
        descriptor,
    )
}

#[tonic::async_trait]
impl FlightService for MoraineFlightService {
    type HandshakeStream = <Inner as FlightService>::HandshakeStream;
    type ListFlightsStream =
        Pin<Box<dyn Stream<Item = Result<FlightInfo, Status>> + Send + 'static>>;
    type DoGetStream = <Inner as FlightService>::DoGetStream;
    type DoPutStream = <Inner as FlightService>::DoPutStream;
    type DoExchangeStream = <Inner as FlightService>::DoExchangeStream;
    type DoActionStream = <Inner as FlightService>::DoActionStream;
    type ListActionsStream = <Inner as FlightService>::ListActionsStream;

    async fn handshake(
        &self,
        request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        FlightService::handshake(&*self.sql, request).await
    }

    async fn list_flights(
        &self,
        _request: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        let infos: Vec<Result<FlightInfo, Status>> = CatalogTable::ALL
            .into_iter()
            .map(|table| {
                let ticket = TicketKind::Table {
                    table,
                    table_id: None,
                };
                table_info(
                    &self.sql,
                    &ticket,
                    FlightDescriptor::new_path(vec![table.name().to_owned()]),
                )
                .map_err(|err| to_status(&err))
            })
            .collect();
        Ok(Response::new(Box::pin(futures::stream::iter(infos))))
    }

    async fn get_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        note_descriptor(&request, request.get_ref());
        if request.get_ref().r#type() != DescriptorType::Path {
            check_message(&request.get_ref().cmd, Carrier::Descriptor)
                .map_err(|err| to_status(&err))?;
            return FlightService::get_flight_info(&*self.sql, request).await;
        }
        let session = super::session::caller(&request)?;
        let owner = session.owner().map(str::to_owned);
        let descriptor = request.into_inner();
        let info = match held_path(&descriptor.path) {
            Some(held) => match held {
                Ok((table, id)) => {
                    self.sql
                        .parts_info(table, PartsAt::Held { id, owner }, descriptor)
                        .await
                }
                Err(err) => Err(err),
            },
            None => match table_of_path(&descriptor.path) {
                Ok(TicketKind::Table {
                    table,
                    table_id: None,
                }) => match self.sql.engine.catalog().snapshot().await {
                    Ok(view) => {
                        self.sql
                            .parts_info(table, PartsAt::Fresh { view, owner: None }, descriptor)
                            .await
                    }
                    Err(err) => Err(err),
                },
                Ok(ticket) => table_info(&self.sql, &ticket, descriptor),
                Err(err) => Err(err),
            },
        };
        info.map(Response::new).map_err(|err| to_status(&err))
    }

    async fn poll_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        FlightService::poll_flight_info(&*self.sql, request).await
    }

    async fn get_schema(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<SchemaResult>, Status> {
        note_descriptor(&request, request.get_ref());
        if request.get_ref().r#type() != DescriptorType::Path {
            return FlightService::get_schema(&*self.sql, request).await;
        }
        let path = &request.get_ref().path;
        let table = match held_path(path) {
            Some(held) => held.map(|(table, _)| table),
            None => table_of_path(path).and_then(|ticket| match ticket {
                TicketKind::Table { table, .. } | TicketKind::Part { table, .. } => Ok(table),
                TicketKind::Statement { .. } | TicketKind::Affected { .. } => {
                    Err(Error::WrongCall("not a table path"))
                }
            }),
        };
        let result = table.and_then(|table| {
            SchemaResult::try_from(arrow_flight::SchemaAsIpc::new(
                &served_schema(self.sql.engine.catalog().ducklake(), table),
                &datafusion::arrow::ipc::writer::IpcWriteOptions::default(),
            ))
            .map_err(|err| Error::Internal {
                context: "encoding a table's schema",
                reason: err.to_string(),
            })
        });
        result.map(Response::new).map_err(|err| to_status(&err))
    }

    async fn do_get(
        &self,
        request: Request<Ticket>,
    ) -> Result<Response<Self::DoGetStream>, Status> {
        crate::metrics::note_command(
            request.extensions(),
            label_of_message(&request.get_ref().ticket),
        );
        check_message(&request.get_ref().ticket, Carrier::Ticket).map_err(|err| to_status(&err))?;
        FlightService::do_get(&*self.sql, request).await
    }

    async fn do_put(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        FlightService::do_put(&*self.sql, request).await
    }

    async fn do_exchange(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        FlightService::do_exchange(&*self.sql, request).await
    }

    async fn do_action(
        &self,
        request: Request<Action>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        crate::metrics::note_command(
            request.extensions(),
            crate::metrics::command_label(&request.get_ref().r#type),
        );
        if super::admin::is_admin_action(&request.get_ref().r#type) {
            // JSON bodies, not Flight SQL messages.
            let session = super::session::caller(&request)?;
            let action = request.get_ref();
            let body = self
                .sql
                .admin_action(&action.r#type, &action.body, &session)
                .await
                .map_err(|err| to_status(&err))?;
            let result = arrow_flight::Result { body: body.into() };
            return Ok(Response::new(Box::pin(futures::stream::once(async {
                Ok(result)
            }))));
        }
        check_message(&request.get_ref().body, Carrier::Action).map_err(|err| to_status(&err))?;
        FlightService::do_action(&*self.sql, request).await
    }

    async fn list_actions(
        &self,
        request: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        FlightService::list_actions(&*self.sql, request).await
    }
}
