//! A Flight client of a moraine server, for the commands that talk to one (`moraine export`,
//! `moraine import --from`): the connection (plaintext, TLS, or mutual TLS), the login (a
//! Handshake with Basic credentials, whose answer carries the session's token, or a bearer
//! token), and the few calls those commands make. Every failure is an [`Error::Remote`]
//! naming the call and the server's status code, or an [`Error::Config`] naming the flag.
//!
//! It serves nothing and knows no storage: the server's side of these calls is `flight`.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::sql::{
    ActionBeginTransactionRequest, ActionBeginTransactionResult, ActionEndTransactionRequest, Any,
    CommandStatementIngest, DoPutUpdateResult, EndTransaction, ProstMessageExt as _,
    TableDefinitionOptions, TableExistsOption, TableNotExistOption,
};
use arrow_flight::{Action, FlightData, FlightDescriptor, FlightInfo, HandshakeRequest, Ticket};
use base64::Engine as _;
use bytes::Bytes;
use datafusion::arrow::record_batch::RecordBatch;
use futures::stream::BoxStream;
use futures::{StreamExt as _, TryStreamExt as _};
use prost::Message as _;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Request, Status};

use crate::config::ClientConfig;
use crate::error::{Error, Result};
use crate::model::CatalogTable;

/// Largest message accepted from the server (it sends at most 16 MiB).
const MAX_DECODING_MESSAGE: usize = 64 << 20;
/// Largest message sent; the server accepts 64 MiB, and uploads are cut far below it.
const MAX_ENCODING_MESSAGE: usize = 64 << 20;
/// Largest Flight data message an upload is cut into.
const MAX_FLIGHT_DATA: usize = 2 << 20;
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What a call says when it names the credentials.
const CREDENTIALS_ADVICE: &str = "; give --username NAME (the password in MORAINE_PASSWORD, \
                                  else on standard input) or --token (MORAINE_TOKEN)";

/// What the first call says when the connection did not come up.
const CONNECT_ADVICE: &str = "; check that a moraine server listens there, and for grpc+tls:// \
                              that --tls-ca holds its CA and, if it requires client \
                              certificates, that --tls-cert and --tls-key are given";

/// Adds the session's `authorization` header to every call.
#[derive(Debug, Clone)]
struct Authorization(Option<MetadataValue<Ascii>>);

impl Interceptor for Authorization {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

type Flight = FlightServiceClient<InterceptedService<Channel, Authorization>>;

/// A logged-in connection to a moraine server. Clones share the connection and the session.
#[derive(Debug, Clone)]
pub struct Client {
    flight: Flight,
}

/// `err` and its causes, joined: tonic's transport errors say little on their own.
fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        source = cause.source();
    }
    text
}

/// The error of `call` refused with `status`.
#[must_use]
pub fn refused(call: impl Into<String>, status: &Status) -> Error {
    let advice = match status.code() {
        Code::Unauthenticated => CREDENTIALS_ADVICE,
        Code::PermissionDenied => "; use credentials of a role that may make this call",
        _ => "",
    };
    let mut message = status.message().to_owned();
    if message.is_empty() {
        status.code().description().clone_into(&mut message);
    }
    // A status made of a transport failure says what failed only in its source.
    if let Some(source) = std::error::Error::source(status) {
        let cause = chain(source);
        if !message.contains(&cause) {
            message = format!("{message}: {cause}");
        }
    }
    Error::Remote {
        call: call.into(),
        code: crate::metrics::code_name(status.code()),
        message,
        advice,
    }
}

/// The error of the first call to `uri`: a refusal, or a connection that did not come up.
fn connect_failed(uri: &str, status: &Status) -> Error {
    match refused(format!("Handshake with {uri}"), status) {
        Error::Remote {
            call,
            code,
            message,
            advice: "",
        } if matches!(
            status.code(),
            Code::Cancelled | Code::Unavailable | Code::Unknown | Code::Internal
        ) =>
        {
            Error::Remote {
                call,
                code,
                message,
                advice: CONNECT_ADVICE,
            }
        }
        other => other,
    }
}

/// The error of `call` failing with `err` inside arrow-flight (a status, or a stream that
/// does not decode).
fn flight_failed(call: impl Into<String>, err: &FlightError) -> Error {
    match err {
        FlightError::Tonic(status) => refused(call, status),
        other => Error::Remote {
            call: call.into(),
            code: "decode",
            message: chain(other),
            advice: "",
        },
    }
}

fn setting(setting: &'static str, reason: impl Into<String>) -> Error {
    Error::Config {
        setting,
        reason: reason.into(),
    }
}

fn read_pem(flag: &'static str, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|err| setting(flag, format!("{}: {err}", path.display())))
}

/// The HTTP URL of a Flight URI, and whether it uses TLS.
fn http_url(uri: &str) -> Result<(String, bool)> {
    let (scheme, rest) = uri.split_once("://").ok_or_else(|| {
        setting(
            "server",
            format!("{uri:?} is not a URI: give grpc://HOST:PORT or grpc+tls://HOST:PORT"),
        )
    })?;
    let tls = match scheme.to_ascii_lowercase().as_str() {
        "grpc" | "grpc+tcp" => false,
        "grpc+tls" => true,
        _ => {
            return Err(setting(
                "server",
                format!("{uri:?}: scheme {scheme:?} is not grpc, grpc+tcp or grpc+tls"),
            ));
        }
    };
    let authority = rest.trim_end_matches('/');
    if authority.is_empty() || authority.contains('/') {
        return Err(setting(
            "server",
            format!("{uri:?}: give HOST:PORT after the scheme, and nothing else"),
        ));
    }
    let scheme = if tls { "https" } else { "http" };
    Ok((format!("{scheme}://{authority}"), tls))
}

/// The endpoint for `uri`, with TLS as `config` asks.
fn endpoint(uri: &str, config: &ClientConfig) -> Result<Endpoint> {
    let (url, tls) = http_url(uri)?;
    let endpoint = Endpoint::from_shared(url)
        .map_err(|err| setting("server", format!("{uri:?}: {}", chain(&err))))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true);
    if !tls {
        if config.tls_ca.is_some() || config.tls_cert.is_some() {
            return Err(setting(
                "tls-ca",
                format!("TLS settings are for a grpc+tls:// server, not {uri}"),
            ));
        }
        return Ok(endpoint);
    }
    let ca = config.tls_ca.as_deref().ok_or_else(|| {
        setting(
            "tls-ca",
            format!(
                "{uri} needs --tls-ca FILE: the PEM certificates of the CA that signed the \
                 server's certificate"
            ),
        )
    })?;
    let mut tls =
        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read_pem("tls-ca", ca)?));
    if let (Some(cert), Some(key)) = (&config.tls_cert, &config.tls_key) {
        tls = tls.identity(Identity::from_pem(
            read_pem("tls-cert", cert)?,
            read_pem("tls-key", key)?,
        ));
    }
    endpoint
        .tls_config(tls)
        .map_err(|err| setting("tls-ca", chain(&err)))
}

/// The password for `--username`: `MORAINE_PASSWORD`, else the first line of standard
/// input.
fn password() -> Result<String> {
    if let Ok(password) = std::env::var("MORAINE_PASSWORD") {
        return Ok(password);
    }
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).map_err(|err| {
        setting(
            "username",
            format!("reading the password from stdin: {err}"),
        )
    })?;
    Ok(line.trim_end_matches(['\r', '\n']).to_owned())
}

fn header(value: &str) -> Result<MetadataValue<Ascii>> {
    value.parse().map_err(|_| {
        setting(
            "token",
            "the credentials hold characters an HTTP header cannot carry",
        )
    })
}

impl Client {
    /// Connects to `uri` (`grpc://HOST:PORT`, `grpc+tls://HOST:PORT`) and logs in as
    /// `config` says: with `--username`, a Handshake with Basic credentials whose answer's
    /// `authorization: Bearer …` header is the session's token from then on; with a token,
    /// that token; with neither, the session an unauthenticated server opens at the
    /// Handshake. The Handshake is made in every case, so that bad or missing credentials
    /// fail here, before anything is read or written.
    ///
    /// # Errors
    /// [`Error::Config`] for a URI or TLS file that cannot be used; [`Error::Remote`] when
    /// the server cannot be reached or refuses the login.
    pub async fn connect(uri: &str, config: &ClientConfig) -> Result<Self> {
        let channel = endpoint(uri, config)?
            .connect()
            .await
            .map_err(|err| Error::Remote {
                call: format!("connecting to {uri}"),
                code: "transport",
                message: chain(&err),
                advice: "",
            })?;
        let login = match (&config.username, &config.token) {
            (Some(user), _) => {
                let basic = base64::engine::general_purpose::STANDARD
                    .encode(format!("{user}:{}", password()?));
                Some(header(&format!("Basic {basic}"))?)
            }
            (None, Some(token)) => Some(header(&format!("Bearer {}", token.trim()))?),
            (None, None) => None,
        };
        let mut handshake = Request::new(futures::stream::iter([HandshakeRequest::default()]));
        if let Some(value) = &login {
            handshake
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        let response = FlightServiceClient::new(channel.clone())
            .handshake(handshake)
            .await
            .map_err(|status| connect_failed(uri, &status))?;
        let issued = response
            .metadata()
            .get("authorization")
            .and_then(|value| value.to_str().ok())
            .filter(|value| value.starts_with("Bearer "))
            .map(header)
            .transpose()?;
        let _: Vec<_> = response
            .into_inner()
            .try_collect()
            .await
            .map_err(|status| refused("Handshake", &status))?;
        let authorization = match (issued, config.username.is_some()) {
            (Some(session), _) => Some(session),
            // Basic credentials on every call would open a session each time, and a
            // transaction would not be found by the next call.
            (None, true) => {
                return Err(Error::Remote {
                    call: "Handshake".into(),
                    code: "OK",
                    message: "the answer to the login carries no session token".into(),
                    advice: "; log in with --token instead",
                });
            }
            (None, false) => login,
        };
        let flight = FlightServiceClient::with_interceptor(channel, Authorization(authorization))
            .max_decoding_message_size(MAX_DECODING_MESSAGE)
            .max_encoding_message_size(MAX_ENCODING_MESSAGE);
        Ok(Self { flight })
    }

    /// `GetFlightInfo` of a path descriptor.
    ///
    /// # Errors
    /// [`Error::Remote`] when the server refuses it.
    pub async fn flight_info(&mut self, path: Vec<String>) -> Result<FlightInfo> {
        let call = format!("GetFlightInfo {path:?}");
        self.flight
            .get_flight_info(FlightDescriptor::new_path(path))
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| refused(call, &status))
    }

    /// The record batches `ticket` streams; every message's bytes are added to `wire` as
    /// they arrive.
    ///
    /// # Errors
    /// [`Error::Remote`] when the server refuses the ticket; the stream's items fail the
    /// same way when the stream breaks off or does not decode.
    pub async fn read(
        &mut self,
        ticket: Ticket,
        what: &str,
        wire: Arc<AtomicU64>,
    ) -> Result<BoxStream<'static, Result<RecordBatch>>> {
        let call = format!("DoGet ({what})");
        let messages = self
            .flight
            .do_get(ticket)
            .await
            .map_err(|status| refused(call.clone(), &status))?
            .into_inner()
            .map_ok(move |message: FlightData| {
                let bytes = message.data_header.len() + message.data_body.len();
                wire.fetch_add(u64::try_from(bytes).unwrap_or(u64::MAX), Ordering::Relaxed);
                message
            })
            .map_err(FlightError::from);
        Ok(FlightRecordBatchStream::new_from_flight_data(messages)
            .map_err(move |err| flight_failed(call.clone(), &err))
            .boxed())
    }

    /// Opens a Flight SQL transaction; its id.
    ///
    /// # Errors
    /// [`Error::Remote`] when the server refuses it or answers something else.
    pub async fn begin_transaction(&mut self) -> Result<Bytes> {
        const CALL: &str = "BeginTransaction";
        let action = Action::new(
            "BeginTransaction",
            ActionBeginTransactionRequest {}.as_any().encode_to_vec(),
        );
        let results: Vec<arrow_flight::Result> = self
            .flight
            .do_action(action)
            .await
            .map_err(|status| refused(CALL, &status))?
            .into_inner()
            .try_collect()
            .await
            .map_err(|status| refused(CALL, &status))?;
        let begun = results
            .first()
            .and_then(|result| Any::decode(&*result.body).ok())
            .and_then(|any| any.unpack::<ActionBeginTransactionResult>().ok().flatten())
            .filter(|begun| !begun.transaction_id.is_empty());
        begun
            .map(|begun| begun.transaction_id)
            .ok_or_else(|| Error::Remote {
                call: CALL.into(),
                code: "OK",
                message: "the answer holds no transaction id".into(),
                advice: "",
            })
    }

    /// Ingests `batch` into `table` in transaction `txn` (Flight SQL's
    /// `CommandStatementIngest`, appending); the rows the server read.
    ///
    /// # Errors
    /// [`Error::Remote`] when the server refuses the rows.
    pub async fn ingest(
        &mut self,
        table: CatalogTable,
        txn: &Bytes,
        batch: RecordBatch,
    ) -> Result<i64> {
        let call = format!("ingest into {table}");
        let command = CommandStatementIngest {
            table_definition_options: Some(TableDefinitionOptions {
                if_not_exist: TableNotExistOption::Fail.into(),
                if_exists: TableExistsOption::Append.into(),
            }),
            table: table.name().to_owned(),
            schema: None,
            catalog: None,
            temporary: false,
            transaction_id: Some(txn.clone()),
            options: std::collections::HashMap::default(),
        };
        let descriptor = FlightDescriptor::new_cmd(command.as_any().encode_to_vec());
        // The rows are in memory already: encoded before the call, so an encoding failure is
        // not mistaken for the server's.
        let messages: Vec<FlightData> = FlightDataEncoderBuilder::new()
            .with_flight_descriptor(Some(descriptor))
            .with_max_flight_data_size(MAX_FLIGHT_DATA)
            .build(futures::stream::iter([Ok(batch)]))
            .try_collect()
            .await
            .map_err(|err| Error::Internal {
                context: "encoding rows to upload",
                reason: chain(&err),
            })?;
        let mut answers = self
            .flight
            .do_put(futures::stream::iter(messages))
            .await
            .map_err(|status| refused(call.clone(), &status))?
            .into_inner();
        let answer = answers
            .message()
            .await
            .map_err(|status| refused(call.clone(), &status))?;
        // Read to its end, so that a refusal after the answer is not missed.
        while answers
            .message()
            .await
            .map_err(|status| refused(call.clone(), &status))?
            .is_some()
        {}
        let count = answer
            .and_then(|answer| DoPutUpdateResult::decode(&*answer.app_metadata).ok())
            .map(|result| result.record_count);
        count.ok_or_else(|| Error::Remote {
            call,
            code: "OK",
            message: "the answer holds no row count".into(),
            advice: "",
        })
    }

    /// Commits or rolls back transaction `txn`.
    ///
    /// # Errors
    /// [`Error::Remote`] when the server refuses it: for a commit, nothing of the
    /// transaction was written unless the message says the outcome is unknown.
    pub async fn end_transaction(&mut self, txn: &Bytes, end: EndTransaction) -> Result<()> {
        let call = match end {
            EndTransaction::Commit => "commit",
            EndTransaction::Rollback | EndTransaction::Unspecified => "rollback",
        };
        let action = Action::new(
            "EndTransaction",
            ActionEndTransactionRequest {
                transaction_id: txn.clone(),
                action: end.into(),
            }
            .as_any()
            .encode_to_vec(),
        );
        let _: Vec<arrow_flight::Result> = self
            .flight
            .do_action(action)
            .await
            .map_err(|status| refused(call, &status))?
            .into_inner()
            .try_collect()
            .await
            .map_err(|status| refused(call, &status))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flight_uris_become_http_urls() {
        let url = |uri| http_url(uri).map_err(|err| err.to_string());
        assert_eq!(
            url("grpc://127.0.0.1:50051"),
            Ok(("http://127.0.0.1:50051".into(), false))
        );
        assert_eq!(
            url("grpc+tls://db1:50051/"),
            Ok(("https://db1:50051".into(), true))
        );
        assert_eq!(url("grpc+tcp://db1:1"), Ok(("http://db1:1".into(), false)));
        for bad in ["db1:50051", "http://db1:1", "grpc://", "grpc://db1:1/x"] {
            assert!(url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn tls_settings_need_a_tls_uri_and_a_tls_uri_needs_a_ca() {
        let with_ca = ClientConfig {
            tls_ca: Some("/nonexistent/ca.pem".into()),
            ..ClientConfig::default()
        };
        let err = endpoint("grpc://db1:1", &with_ca).expect_err("plaintext with a CA");
        assert!(err.to_string().contains("grpc+tls://"), "{err}");
        let err = endpoint("grpc+tls://db1:1", &ClientConfig::default()).expect_err("no CA");
        assert!(err.to_string().contains("--tls-ca"), "{err}");
        let err = endpoint("grpc+tls://db1:1", &with_ca).expect_err("a missing file");
        assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
    }

    #[test]
    fn refusals_name_the_call_the_code_and_what_to_do() {
        let err = refused(
            "GetFlightInfo [\"ducklake_data_file\"]",
            &Status::unauthenticated("unauthenticated: this server needs credentials"),
        );
        let text = err.to_string();
        assert!(text.starts_with("GetFlightInfo"), "{text}");
        assert!(text.contains("UNAUTHENTICATED"), "{text}");
        assert!(text.contains("--token"), "{text}");
    }
}
