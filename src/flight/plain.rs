//! Plain Arrow Flight for clients that know no Flight SQL (pyarrow.flight notebooks):
//! `list_flights` lists the served tables; a path descriptor `[table]` or
//! `[table, "<table_id>"]` names a table, or one DuckLake table's rows of it. Every other
//! call goes to the Flight SQL service.

use std::pin::Pin;
use std::sync::Arc;

use arrow_flight::flight_descriptor::DescriptorType;
use arrow_flight::flight_service_server::FlightService;
use arrow_flight::{
    Action, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo, HandshakeRequest, PollInfo,
    SchemaResult, Ticket,
};
use futures::Stream;
use tonic::{Request, Response, Status, Streaming};

use super::service::MoraineSqlService;
use super::status::to_status;
use super::tickets::TicketKind;
use crate::batch::table_schema;
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

fn table_info(
    sql: &MoraineSqlService,
    ticket: &TicketKind,
    descriptor: FlightDescriptor,
) -> Result<FlightInfo> {
    let TicketKind::Table { table, .. } = ticket else {
        return Err(Error::WrongCall("not a table ticket"));
    };
    sql.ticket_info(ticket, &table_schema(*table), descriptor)
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
        if request.get_ref().r#type() != DescriptorType::Path {
            check_message(&request.get_ref().cmd, Carrier::Descriptor)
                .map_err(|err| to_status(&err))?;
            return FlightService::get_flight_info(&*self.sql, request).await;
        }
        let descriptor = request.into_inner();
        table_of_path(&descriptor.path)
            .and_then(|ticket| table_info(&self.sql, &ticket, descriptor))
            .map(Response::new)
            .map_err(|err| to_status(&err))
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
        if request.get_ref().r#type() != DescriptorType::Path {
            return FlightService::get_schema(&*self.sql, request).await;
        }
        let result = table_of_path(&request.get_ref().path).and_then(|ticket| match ticket {
            TicketKind::Table { table, .. } => {
                SchemaResult::try_from(arrow_flight::SchemaAsIpc::new(
                    &table_schema(table),
                    &datafusion::arrow::ipc::writer::IpcWriteOptions::default(),
                ))
                .map_err(|err| Error::Internal {
                    context: "encoding a table's schema",
                    reason: err.to_string(),
                })
            }
            TicketKind::Statement { .. } | TicketKind::Affected { .. } => {
                Err(Error::WrongCall("not a table path"))
            }
        });
        result.map(Response::new).map_err(|err| to_status(&err))
    }

    async fn do_get(
        &self,
        request: Request<Ticket>,
    ) -> Result<Response<Self::DoGetStream>, Status> {
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
