//! Authentication, roles, per-session isolation and TLS, through arrow-flight's Flight SQL
//! client over real gRPC: logins, tokens (expired, revoked), what each role may do, what
//! one session can do with another's transactions, prepared statements and tickets, and
//! TLS with and without client certificates, with a CA made in the test.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arrow_flight::error::FlightError;
use arrow_flight::sql::client::FlightSqlServiceClient;
use arrow_flight::sql::{
    ActionClosePreparedStatementRequest, ActionCreatePreparedStatementRequest,
    ActionCreatePreparedStatementResult, Any, CommandPreparedStatementQuery, EndTransaction,
    ProstMessageExt,
};
use arrow_flight::{Action, FlightDescriptor, FlightInfo, Ticket};
use bytes::Bytes;
use datafusion::arrow::array::RecordBatch;
use futures::TryStreamExt as _;
use moraine::auth::{Authenticator, Role, SessionLimits};
use moraine::catalog::Catalog;
use moraine::server::{Access, Limits, RunningServer};
use moraine::tls::{Tls, TlsFiles};
use prost::Message as _;
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

use crate::flight_sql::code_of;
use crate::flight_writes::{registration, stage};
use crate::harness::{Backend, CatalogRows, TestStore, catalog_rows};

const PASSWORD: &str = "correct horse battery staple";

/// A server on an empty redb store whose credentials file lists `reader`, `writer` and
/// `admin` (password [`PASSWORD`]) and a reader token.
struct Secured {
    running: RunningServer,
    catalog: Catalog,
    _store: TestStore,
    dir: tempfile::TempDir,
    reader_token: String,
    scheme: &'static str,
}

impl Secured {
    async fn start() -> Self {
        Self::start_with(None).await
    }

    async fn start_with(tls: Option<Arc<Tls>>) -> Self {
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("auth");
        for (name, role) in [
            ("reader", Role::Reader),
            ("writer", Role::Writer),
            ("admin", Role::Admin),
        ] {
            moraine::auth::add_user(&file, name, role, PASSWORD).expect("user");
        }
        let reader_token =
            moraine::auth::create_token(&file, "ci", Role::Reader, None).expect("token");
        let auth =
            Authenticator::from_file(file, SessionLimits::default()).expect("credentials load");
        let store = Backend::Redb.open().await;
        let catalog = store.catalog();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let running = moraine::server::start_secured(
            catalog.clone(),
            "127.0.0.1:0".parse().expect("addr"),
            Limits::default(),
            Access {
                auth: Arc::new(auth),
                tls,
                ticket_key: None,
            },
        )
        .await
        .expect("server starts");
        Self {
            running,
            catalog,
            _store: store,
            dir,
            reader_token,
            scheme,
        }
    }

    fn auth_file(&self) -> PathBuf {
        self.dir.path().join("auth")
    }

    async fn anonymous(&self) -> FlightSqlServiceClient<Channel> {
        let channel = Channel::from_shared(format!("http://{}", self.running.addr()))
            .expect("uri")
            .connect()
            .await
            .expect("connect");
        FlightSqlServiceClient::new(channel)
    }

    /// A client logged in as `user` (a session of its own).
    async fn login(&self, user: &str) -> FlightSqlServiceClient<Channel> {
        let mut client = self.anonymous().await;
        client.handshake(user, PASSWORD).await.expect("login");
        assert!(
            client.token().is_some_and(|t| t.starts_with("mrs_")),
            "a session token came back"
        );
        client
    }

    async fn with_token(&self, token: &str) -> FlightSqlServiceClient<Channel> {
        let mut client = self.anonymous().await;
        client.set_token(token.to_owned());
        client
    }

    async fn rows(&self) -> CatalogRows {
        catalog_rows(&self.catalog).await
    }
}

async fn count_mappings(
    client: &mut FlightSqlServiceClient<Channel>,
) -> Result<usize, FlightError> {
    query(client, "SELECT * FROM ducklake_column_mapping", None)
        .await
        .map(|batches| batches.iter().map(RecordBatch::num_rows).sum())
}

async fn query(
    client: &mut FlightSqlServiceClient<Channel>,
    sql: &str,
    txn: Option<Bytes>,
) -> Result<Vec<RecordBatch>, FlightError> {
    let info = client.execute(sql.to_owned(), txn).await?;
    fetch(client, &info).await
}

async fn fetch(
    client: &mut FlightSqlServiceClient<Channel>,
    info: &FlightInfo,
) -> Result<Vec<RecordBatch>, FlightError> {
    let mut batches = Vec::new();
    for endpoint in &info.endpoint {
        let ticket = endpoint.ticket.clone().expect("ticket");
        let stream = client.do_get(ticket).await?;
        batches.extend(stream.try_collect::<Vec<_>>().await?);
    }
    Ok(batches)
}

/// `GetFlightInfo` for `cmd`, with the client's session token.
async fn info_for(
    client: &mut FlightSqlServiceClient<Channel>,
    cmd: impl ProstMessageExt,
) -> Result<FlightInfo, FlightError> {
    let mut request = tonic::Request::new(FlightDescriptor::new_cmd(cmd.as_any().encode_to_vec()));
    if let Some(token) = client.token() {
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("header value"),
        );
    }
    let info = client
        .inner_mut()
        .get_flight_info(request)
        .await
        .map_err(FlightError::from)?;
    Ok(info.into_inner())
}

fn assert_code(result: Result<impl std::fmt::Debug, FlightError>, code: Code, context: &str) {
    match result {
        Ok(ok) => panic!("{context}: expected {code:?}, got {ok:?}"),
        Err(err) => assert_eq!(code_of(&err), code, "{context}: {err}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logins_and_tokens_get_sessions_and_bad_credentials_are_unauthenticated() {
    let server = Secured::start().await;
    let mut writer = server.login("writer").await;
    assert_eq!(count_mappings(&mut writer).await.expect("reads"), 0);

    // arrow-flight's client reports a failed handshake as an Arrow error with the status in
    // its text.
    let mut wrong = server.anonymous().await;
    for (user, password) in [("writer", "not the password"), ("nobody", PASSWORD)] {
        let err = wrong.handshake(user, password).await.expect_err("refused");
        let text = err.to_string();
        assert!(
            text.contains("valid authentication credentials")
                && text.contains("wrong username or password"),
            "{user}: {text}"
        );
    }
    assert_code(
        count_mappings(&mut server.anonymous().await).await,
        Code::Unauthenticated,
        "no credentials",
    );
    assert_code(
        count_mappings(&mut server.with_token("mrs_made-up").await).await,
        Code::Unauthenticated,
        "a made-up token",
    );

    // A pre-issued token works as a bearer header without a login.
    let mut token = server.with_token(&server.reader_token).await;
    assert_eq!(count_mappings(&mut token).await.expect("reads"), 0);

    // Revoked: refused after the reload, and so is a removed user's session.
    assert!(moraine::auth::remove(&server.auth_file(), "ci", true).expect("revoked"));
    assert!(moraine::auth::remove(&server.auth_file(), "writer", false).expect("removed"));
    assert_eq!(count_mappings(&mut token).await.expect("still in force"), 0);
    server.running.reload().expect("reloads");
    assert_code(
        count_mappings(&mut token).await,
        Code::Unauthenticated,
        "a revoked token",
    );
    assert_code(
        count_mappings(&mut writer).await,
        Code::Unauthenticated,
        "the session of a removed user",
    );

    // Expired: a token whose expiry has passed is refused.
    let expired = moraine::auth::create_token(
        &server.auth_file(),
        "short",
        Role::Writer,
        Some(Duration::ZERO),
    )
    .expect("token");
    server.running.reload().expect("reloads");
    let err = count_mappings(&mut server.with_token(&expired).await)
        .await
        .expect_err("expired");
    assert_eq!(code_of(&err), Code::Unauthenticated, "{err}");
    assert!(err.to_string().contains("expired"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_role_may_do_its_calls_and_a_readers_write_changes_nothing() {
    let server = Secured::start().await;
    let mut writer = server.login("writer").await;
    let txn = writer.begin_transaction().await.expect("a writer begins");
    let first = registration(1, 10);
    stage(&mut writer, &first, Some(&txn)).await;
    writer
        .end_transaction(txn, EndTransaction::Commit)
        .await
        .expect("commits");
    let before = server.rows().await;
    assert_eq!(before, first.clone().sorted());

    for mut reader in [
        server.login("reader").await,
        server.with_token(&server.reader_token).await,
    ] {
        assert_eq!(
            count_mappings(&mut reader).await.expect("a reader reads"),
            1
        );
        let denied = |result: Result<_, FlightError>, what: &str| {
            let err = result.expect_err(what);
            assert_eq!(code_of(&err), Code::PermissionDenied, "{what}: {err}");
            assert!(err.to_string().contains("has role reader"), "{what}: {err}");
        };
        denied(
            reader.begin_transaction().await.map(drop),
            "a reader's transaction",
        );
        denied(
            reader
                .execute_update("DELETE FROM ducklake_data_file".into(), None)
                .await
                .map(drop),
            "a reader's DELETE",
        );
        denied(
            reader
                .execute("DELETE FROM ducklake_data_file".into(), None)
                .await
                .map(drop),
            "a reader's DELETE as a query",
        );
        denied(
            crate::flight_writes::put(
                &mut reader,
                "ducklake_data_file",
                crate::flight_writes::file_batch(&registration(2, 20).data_files),
                None,
            )
            .await
            .map(drop),
            "a reader's ingest",
        );
        let mut prepared = reader
            .prepare("DELETE FROM ducklake_data_file".into(), None)
            .await
            .expect("preparing is a read");
        denied(
            prepared.execute_update().await.map(drop),
            "a reader's prepared DELETE",
        );
    }
    assert_eq!(
        server.rows().await,
        before,
        "nothing a reader sent was written"
    );

    let mut admin = server.login("admin").await;
    let deleted = admin
        .execute_update(
            "DELETE FROM ducklake_data_file WHERE data_file_id = 11".into(),
            None,
        )
        .await
        .expect("an admin writes");
    assert_eq!(deleted, 1);
}

/// Creates a prepared statement in `txn` through the raw action, returning its handle.
async fn prepare_raw(
    client: &mut FlightSqlServiceClient<Channel>,
    sql: &str,
    txn: Option<Bytes>,
) -> Bytes {
    let request = ActionCreatePreparedStatementRequest {
        query: sql.to_owned(),
        transaction_id: txn,
    };
    let action = Action {
        r#type: "CreatePreparedStatement".into(),
        body: request.as_any().encode_to_vec().into(),
    };
    let result = client.do_action(action).await.expect("prepare");
    let result: Vec<arrow_flight::Result> = result.try_collect().await.expect("result");
    let any = Any::decode(result[0].body.as_ref()).expect("any");
    any.unpack::<ActionCreatePreparedStatementResult>()
        .expect("unpacks")
        .expect("a result")
        .prepared_statement_handle
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    clippy::too_many_lines,
    reason = "one scenario: each of A's handles tried by B, then used by A"
)]
async fn a_session_cannot_touch_anothers_transactions_statements_or_tickets() {
    let server = Secured::start().await;
    // Two sessions of the same user: isolation is per session, not per user.
    let mut a = server.login("writer").await;
    let mut b = server.login("writer").await;
    let txn = a.begin_transaction().await.expect("begin");
    let staged = registration(3, 30);
    stage(&mut a, &staged, Some(&txn)).await;
    let handle = prepare_raw(
        &mut a,
        "SELECT * FROM ducklake_column_mapping",
        Some(txn.clone()),
    )
    .await;
    let info = a
        .execute(
            "SELECT * FROM ducklake_column_mapping".into(),
            Some(txn.clone()),
        )
        .await
        .expect("a query in A's transaction");
    let ticket = info.endpoint[0].ticket.clone().expect("ticket");

    // B, with A's ids: each is not found, and changes nothing.
    assert_code(
        b.end_transaction(txn.clone(), EndTransaction::Commit).await,
        Code::NotFound,
        "B commits A's transaction",
    );
    assert_code(
        b.end_transaction(txn.clone(), EndTransaction::Rollback)
            .await,
        Code::NotFound,
        "B rolls back A's transaction",
    );
    assert_code(
        query(
            &mut b,
            "SELECT * FROM ducklake_column_mapping",
            Some(txn.clone()),
        )
        .await,
        Code::NotFound,
        "B reads in A's transaction",
    );
    assert_code(
        crate::flight_writes::put(
            &mut b,
            "ducklake_data_file",
            crate::flight_writes::file_batch(&registration(3, 40).data_files),
            Some(&txn),
        )
        .await,
        Code::NotFound,
        "B stages into A's transaction",
    );
    assert_code(
        b.do_get(ticket.clone()).await.map(drop),
        Code::NotFound,
        "B redeems A's ticket",
    );
    let prepared = CommandPreparedStatementQuery {
        prepared_statement_handle: handle.clone(),
    };
    assert_code(
        info_for(&mut b, prepared.clone()).await,
        Code::NotFound,
        "B executes A's prepared statement",
    );
    let close = Action {
        r#type: "ClosePreparedStatement".into(),
        body: ActionClosePreparedStatementRequest {
            prepared_statement_handle: handle.clone(),
        }
        .as_any()
        .encode_to_vec()
        .into(),
    };
    assert_code(
        b.do_action(close.clone()).await.map(drop),
        Code::NotFound,
        "B closes A's statement",
    );

    // A forged ticket is refused before anything in it is read.
    let mut forged = ticket.ticket.to_vec();
    let last = forged.len() - 1;
    forged[last] ^= 1;
    assert_code(
        b.do_get(Ticket::new(forged)).await.map(drop),
        Code::InvalidArgument,
        "a forged ticket",
    );

    // A's transaction, statement and ticket are as they were.
    assert_eq!(
        server.rows().await,
        CatalogRows::default(),
        "nothing committed"
    );
    let through_ticket: Vec<RecordBatch> = a
        .do_get(ticket)
        .await
        .expect("A's ticket")
        .try_collect()
        .await
        .expect("rows");
    assert_eq!(
        through_ticket
            .iter()
            .map(RecordBatch::num_rows)
            .sum::<usize>(),
        1
    );
    let info = info_for(&mut a, prepared).await.expect("A's statement");
    assert_eq!(
        fetch(&mut a, &info)
            .await
            .expect("rows")
            .iter()
            .map(RecordBatch::num_rows)
            .sum::<usize>(),
        1
    );
    a.do_action(close).await.expect("A closes its statement");
    a.end_transaction(txn, EndTransaction::Commit)
        .await
        .expect("A commits");
    assert_eq!(server.rows().await, staged.sorted());
}

/// A CA and the certificates the TLS tests use, as PEM files in `dir`.
pub(crate) struct Pki {
    pub(crate) ca: String,
    pub(crate) client_cert: String,
    pub(crate) client_key: String,
}

/// A CA, a server certificate for `localhost` and `127.0.0.1` (its files in `dir`) and a
/// client certificate, all made here.
pub(crate) fn make_pki(dir: &Path, name: &str) -> (Pki, TlsFiles) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca_key = KeyPair::generate().expect("key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("moraine test CA {name}"));
    let ca = ca_params.self_signed(&ca_key).expect("CA");
    let issue = |names: Vec<String>| {
        let key = KeyPair::generate().expect("key");
        let cert = CertificateParams::new(names)
            .expect("params")
            .signed_by(&key, &ca, &ca_key)
            .expect("signed");
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = issue(vec!["localhost".into(), "127.0.0.1".into()]);
    let (client_cert, client_key) = issue(vec!["client.example".into()]);
    let write = |file: &str, text: &str| {
        let path = dir.join(file);
        std::fs::write(&path, text).expect("write");
        path
    };
    let files = TlsFiles {
        cert: write(&format!("server-{name}.pem"), &server_cert),
        key: write(&format!("server-{name}.key"), &server_key),
        client_ca: None,
    };
    (
        Pki {
            ca: ca.pem(),
            client_cert,
            client_key,
        },
        files,
    )
}

async fn tls_client(
    addr: std::net::SocketAddr,
    ca: &str,
    identity: Option<(&str, &str)>,
) -> Result<FlightSqlServiceClient<Channel>, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let channel = Channel::from_shared(format!("https://{addr}"))
        .expect("uri")
        .tls_config(tls)?
        .connect()
        .await?;
    Ok(FlightSqlServiceClient::new(channel))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_trusting_clients_refuses_plaintext_and_reloads_its_certificate() {
    let dir = tempfile::tempdir().expect("dir");
    let (first, files) = make_pki(dir.path(), "one");
    let tls = Arc::new(Tls::load(files.clone()).expect("loads"));
    let server = Secured::start_with(Some(tls)).await;
    assert_eq!(server.scheme, "https");
    let addr = server.running.addr();

    let mut client = tls_client(addr, &first.ca, None).await.expect("connects");
    client
        .handshake("reader", PASSWORD)
        .await
        .expect("login over TLS");
    assert_eq!(count_mappings(&mut client).await.expect("reads"), 0);

    // Plaintext against the TLS port: a clean transport error, and the server stays up.
    // Which one depends on what the client reads first: the closed connection (UNAVAILABLE,
    // UNKNOWN, CANCELLED), or the server's TLS alert, which the client's HTTP/2 layer takes
    // for a malformed frame (INTERNAL, "h2 protocol error"). Never an answer of the service.
    let mut plain = server.anonymous().await;
    let err = count_mappings(&mut plain).await.expect_err("plaintext");
    let code = code_of(&err);
    assert!(
        matches!(code, Code::Unavailable | Code::Unknown | Code::Cancelled)
            || (code == Code::Internal && err.to_string().contains("h2 protocol error")),
        "{err}"
    );
    assert_eq!(count_mappings(&mut client).await.expect("still serving"), 0);

    // A new certificate from another CA, in the same files: new connections use it.
    let (second, replacement) = make_pki(dir.path(), "two");
    std::fs::copy(&replacement.cert, &files.cert).expect("copy");
    std::fs::copy(&replacement.key, &files.key).expect("copy");
    server.running.reload().expect("reloads");
    let mut renewed = tls_client(addr, &second.ca, None).await.expect("connects");
    renewed.handshake("reader", PASSWORD).await.expect("login");
    assert_eq!(count_mappings(&mut renewed).await.expect("reads"), 0);
    let stale = match tls_client(addr, &first.ca, None).await {
        Err(err) => err.to_string(),
        Ok(mut client) => client
            .handshake("reader", PASSWORD)
            .await
            .expect_err("the old CA no longer vouches for the server")
            .to_string(),
    };
    assert!(!stale.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_requires_a_client_certificate_from_the_ca() {
    let dir = tempfile::tempdir().expect("dir");
    let (pki, mut files) = make_pki(dir.path(), "m");
    let ca_file = dir.path().join("client-ca.pem");
    std::fs::write(&ca_file, &pki.ca).expect("write");
    files.client_ca = Some(ca_file);
    let tls = Arc::new(Tls::load(files).expect("loads"));
    assert!(tls.requires_client_certificates());
    let server = Secured::start_with(Some(tls)).await;
    let addr = server.running.addr();

    let mut with_cert = tls_client(addr, &pki.ca, Some((&pki.client_cert, &pki.client_key)))
        .await
        .expect("connects");
    with_cert
        .handshake("reader", PASSWORD)
        .await
        .expect("login");
    assert_eq!(count_mappings(&mut with_cert).await.expect("reads"), 0);

    let refused = match tls_client(addr, &pki.ca, None).await {
        Err(err) => Err(err.to_string()),
        Ok(mut client) => client
            .handshake("reader", PASSWORD)
            .await
            .map(drop)
            .map_err(|err| err.to_string()),
    };
    assert!(refused.is_err(), "a client without a certificate got in");

    // A certificate from another CA is refused too.
    let (other, _) = make_pki(dir.path(), "other");
    let refused =
        match tls_client(addr, &pki.ca, Some((&other.client_cert, &other.client_key))).await {
            Err(err) => Err(err.to_string()),
            Ok(mut client) => client
                .handshake("reader", PASSWORD)
                .await
                .map(drop)
                .map_err(|err| err.to_string()),
        };
    assert!(refused.is_err(), "a certificate from another CA got in");
}
