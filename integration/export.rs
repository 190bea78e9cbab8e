//! `moraine export` and `moraine import --from`: the binary run against servers in this
//! process over real gRPC. An export imported into an empty server and exported again gives
//! the same files; an export that does not match its manifest is refused before anything is
//! staged; a refused batch stops the import, says how many batches landed, and the import
//! resumes after them; credentials and TLS work as for any client.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::Arc;

use arrow_flight::sql::client::FlightSqlServiceClient;
use moraine::auth::{Authenticator, Role, SessionLimits};
use moraine::catalog::Catalog;
use moraine::export::Manifest;
use moraine::model::{ColumnMappingRow, DataFileRow, NameMappingRow};
use moraine::server::{Access, Limits, RunningServer};
use moraine::tls::Tls;
use moraine::write::{Insert, Op, StagedBatch, commit_batch};
use tonic::transport::Channel;

use crate::ducklake_fixture;
use crate::harness::{Backend, CatalogRows, TestStore, catalog_rows};

const PASSWORD: &str = "export and import";

/// A server on its own redb store.
struct Server {
    running: RunningServer,
    catalog: Catalog,
    _store: TestStore,
    scheme: &'static str,
}

impl Server {
    /// An unauthenticated server on an empty store.
    async fn empty() -> Self {
        Self::start(Access::default()).await
    }

    async fn start(access: Access) -> Self {
        let store = Backend::Redb.open().await;
        let catalog = store.catalog();
        let scheme = if access.tls.is_some() {
            "grpc+tls"
        } else {
            "grpc"
        };
        // Endpoints of 256 bytes: every table of the catalog below reads as several.
        let limits = Limits {
            parts: moraine::server::PartLimits {
                division: moraine::kv::Division {
                    span_bytes: 256,
                    max_spans: 64,
                },
                ..moraine::server::PartLimits::default()
            },
            ..Limits::default()
        };
        let running = moraine::server::start_secured(
            catalog.clone(),
            "127.0.0.1:0".parse().expect("addr"),
            limits,
            access,
        )
        .await
        .expect("server starts");
        Self {
            running,
            catalog,
            _store: store,
            scheme,
        }
    }

    /// A server holding DuckLake's fixture and [`more_rows`].
    async fn with_catalog() -> Self {
        let server = Self::empty().await;
        server.load().await;
        server
    }

    /// Commits DuckLake's fixture and [`more_rows`].
    async fn load(&self) {
        for step in ducklake_fixture::steps() {
            commit_batch(&self.catalog, &step.batch)
                .await
                .expect("fixture commits");
        }
        let more = more_rows();
        let mut batch = StagedBatch::new();
        batch
            .push(Op::Insert(Insert::column_mappings(&more.column_mappings)))
            .push(Op::Insert(Insert::name_mappings(&more.name_mappings)))
            .push(Op::Insert(Insert::data_files(&more.data_files)));
        commit_batch(&self.catalog, &batch)
            .await
            .expect("more rows commit");
    }

    fn uri(&self) -> String {
        format!("{}://{}", self.scheme, self.running.addr())
    }

    async fn rows(&self) -> CatalogRows {
        catalog_rows(&self.catalog).await
    }

    async fn sql_client(&self) -> FlightSqlServiceClient<Channel> {
        let channel = Channel::from_shared(format!("http://{}", self.running.addr()))
            .expect("uri")
            .connect()
            .await
            .expect("connect");
        FlightSqlServiceClient::new(channel)
    }
}

/// Mappings of several tables with nested name rows (a struct in a struct, a partition
/// column), their data files, and data files of no mapping.
fn more_rows() -> CatalogRows {
    let mut rows = CatalogRows::default();
    for table_id in 20..24_i64 {
        for k in 0..3_i64 {
            let mapping_id = 1000 + table_id * 10 + k;
            rows.column_mappings.push(ColumnMappingRow {
                mapping_id: Some(mapping_id),
                table_id: Some(table_id),
                map_type: Some("map_by_name".into()),
            });
            let name =
                |column_id: i64, source: &str, parent: Option<i64>, partition| NameMappingRow {
                    mapping_id: Some(mapping_id),
                    column_id: Some(column_id),
                    source_name: Some(source.into()),
                    target_field_id: Some(column_id + 100),
                    parent_column: parent,
                    is_partition: Some(partition),
                };
            rows.name_mappings.extend([
                name(0, "id", None, false),
                name(1, "outer", None, false),
                name(2, "inner", Some(1), false),
                name(3, "leaf", Some(2), false),
                name(4, "other", Some(1), false),
                name(5, "part", None, true),
            ]);
            let file = |data_file_id: i64, mapping_id: Option<i64>| DataFileRow {
                data_file_id: Some(data_file_id),
                table_id: Some(table_id),
                begin_snapshot: Some(3),
                end_snapshot: (data_file_id % 2 == 0).then_some(7),
                file_order: Some(k),
                path: Some(format!("t{table_id}/part=x/f{data_file_id}.parquet")),
                path_is_relative: Some(true),
                file_format: Some("parquet".into()),
                record_count: Some(100 + data_file_id),
                file_size_bytes: Some(4096),
                footer_size: Some(512),
                row_id_start: Some(0),
                partition_id: None,
                encryption_key: None,
                partial_file_info: None,
                partial_max: None,
                row_group_count: None,
                mapping_id,
            };
            rows.data_files
                .push(file(5000 + mapping_id, Some(mapping_id)));
            rows.data_files.push(file(7000 + mapping_id, None));
        }
    }
    rows
}

/// Runs the `moraine` binary with `args` (and `env`), with nothing on standard input.
async fn moraine(args: Vec<String>, env: Vec<(&'static str, String)>) -> Output {
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_moraine"))
            .args(&args)
            .env_remove("MORAINE_TOKEN")
            .env_remove("MORAINE_PASSWORD")
            .env_remove("MORAINE_SERVER")
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .envs(env)
            .stdin(Stdio::null())
            .output()
            .expect("moraine runs")
    })
    .await
    .expect("joined")
}

pub(crate) fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

pub(crate) fn succeeded(output: &Output, what: &str) {
    assert!(
        output.status.success(),
        "{what} failed: {}\n{}",
        output.status,
        stderr(output)
    );
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// `moraine export --server URI --out DIR EXTRA…`.
pub(crate) async fn export(uri: &str, out: &Path, extra: &[&str]) -> Output {
    let mut list = args(&["export", "--server", uri, "--out", &path(out)]);
    list.extend(args(extra));
    moraine(list, Vec::new()).await
}

/// `moraine import --server URI --from DIR EXTRA…`.
pub(crate) async fn import(uri: &str, from: &Path, extra: &[&str]) -> Output {
    let mut list = args(&["import", "--server", uri, "--from", &path(from)]);
    list.extend(args(extra));
    moraine(list, Vec::new()).await
}

pub(crate) fn manifest(dir: &Path) -> Manifest {
    Manifest::read(dir).expect("a manifest")
}

/// `(file, rows, sha256)` per table.
fn checksums(manifest: &Manifest) -> Vec<(String, u64, String)> {
    manifest
        .files
        .iter()
        .map(|f| (f.file.clone(), f.rows, f.sha256.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_imported_into_an_empty_server_exports_the_same_files() {
    let source = Server::with_catalog().await;
    let expected = source.rows().await;
    assert!(
        expected.data_files.iter().any(|f| f.mapping_id.is_none())
            && expected
                .name_mappings
                .iter()
                .any(|n| n.parent_column.is_some())
            && expected
                .column_mappings
                .iter()
                .filter_map(|m| m.table_id)
                .collect::<std::collections::BTreeSet<_>>()
                .len()
                > 3,
        "the catalog has files of no mapping, nested name rows and several tables"
    );
    for table in ["ducklake_name_mapping", "ducklake_data_file"] {
        let info = source
            .sql_client()
            .await
            .execute(format!("SELECT * FROM {table}"), None)
            .await
            .expect("GetFlightInfo");
        assert!(
            info.endpoint.len() > 1,
            "{table} reads as several endpoints"
        );
    }
    let dir = tempfile::tempdir().expect("dir");
    for format in ["parquet", "arrow"] {
        let first = dir.path().join(format!("first-{format}"));
        succeeded(
            &export(
                &source.uri(),
                &first,
                &["--format", format, "--parallel", "2"],
            )
            .await,
            "export",
        );
        let exported = manifest(&first);
        let rows: Vec<u64> = exported.files.iter().map(|f| f.rows).collect();
        let count = |n: usize| u64::try_from(n).expect("fits");
        assert_eq!(
            rows,
            vec![
                count(expected.column_mappings.len()),
                count(expected.name_mappings.len()),
                count(expected.data_files.len())
            ]
        );
        assert_eq!(exported.server, source.uri());
        assert!(
            exported.snapshot.as_ref().is_some_and(|s| s.len() == 32),
            "the export read one held snapshot: {:?}",
            exported.snapshot
        );

        // Small batches: several transactions of mappings, then of files.
        let target = Server::empty().await;
        let imported = import(&target.uri(), &first, &["--batch", "4"]).await;
        succeeded(&imported, "import");
        assert_eq!(target.rows().await, expected, "{format}");

        let second = dir.path().join(format!("second-{format}"));
        succeeded(
            &export(&target.uri(), &second, &["--format", format]).await,
            "export",
        );
        assert_eq!(
            checksums(&manifest(&second)),
            checksums(&exported),
            "{format}: the same files, byte for byte"
        );
        for file in &exported.files {
            assert_eq!(
                std::fs::read(first.join(&file.file)).expect("read"),
                std::fs::read(second.join(&file.file)).expect("read"),
                "{}",
                file.file
            );
        }
    }

    // A directory that holds an export is not written over.
    let again = export(&source.uri(), &dir.path().join("first-parquet"), &[]).await;
    assert!(!again.status.success());
    assert!(
        stderr(&again).contains("holds an export already"),
        "{}",
        stderr(&again)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_that_does_not_match_its_manifest_is_refused_and_nothing_is_staged() {
    let source = Server::with_catalog().await;
    let dir = tempfile::tempdir().expect("dir");
    let out = dir.path().join("export");
    succeeded(&export(&source.uri(), &out, &[]).await, "export");
    let target = Server::empty().await;

    // One byte changed in the last file: the checks run before anything is staged, so not
    // even the mappings, whose files are intact, are imported.
    let damaged = out.join("ducklake_data_file.parquet");
    let mut bytes = std::fs::read(&damaged).expect("read");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x55;
    std::fs::write(&damaged, &bytes).expect("write");
    let refused = import(&target.uri(), &out, &[]).await;
    assert!(!refused.status.success());
    let text = stderr(&refused);
    assert!(
        text.contains("ducklake_data_file.parquet") && text.contains("does not match the manifest"),
        "{text}"
    );
    assert_eq!(
        target.rows().await,
        CatalogRows::default(),
        "nothing staged"
    );

    // A missing file and a missing manifest are refused too, naming them.
    std::fs::remove_file(&damaged).expect("remove");
    let refused = import(&target.uri(), &out, &[]).await;
    assert!(
        stderr(&refused).contains("ducklake_data_file.parquet"),
        "{}",
        stderr(&refused)
    );
    std::fs::remove_file(out.join("manifest.json")).expect("remove");
    let refused = import(&target.uri(), &out, &[]).await;
    assert!(
        stderr(&refused).contains("manifest.json"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(
        target.rows().await,
        CatalogRows::default(),
        "nothing staged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_batch_stops_the_import_which_resumes_after_the_batches_that_landed() {
    let source = Server::with_catalog().await;
    let expected = source.rows().await;
    let dir = tempfile::tempdir().expect("dir");
    let out = dir.path().join("export");
    succeeded(&export(&source.uri(), &out, &[]).await, "export");

    // The target already holds a mapping of the export's second batch of four.
    let target = Server::empty().await;
    let mappings = &expected.column_mappings;
    let taken = mappings
        .iter()
        .rfind(|m| m.table_id == Some(20))
        .cloned()
        .expect("a mapping of table 20");
    let position = {
        let mut keys: Vec<_> = mappings
            .iter()
            .map(|m| (m.table_id, m.mapping_id))
            .collect();
        keys.sort();
        keys.iter()
            .position(|k| *k == (taken.table_id, taken.mapping_id))
            .expect("listed")
    };
    let batch_of_taken = position / 4 + 1;
    assert!(batch_of_taken > 1, "a batch lands before the refused one");
    let mut batch = StagedBatch::new();
    let names: Vec<NameMappingRow> = expected
        .name_mappings
        .iter()
        .filter(|n| n.mapping_id == taken.mapping_id)
        .cloned()
        .collect();
    batch
        .push(Op::Insert(Insert::column_mappings(std::slice::from_ref(
            &taken,
        ))))
        .push(Op::Insert(Insert::name_mappings(&names)));
    commit_batch(&target.catalog, &batch)
        .await
        .expect("commits");

    let stopped = import(&target.uri(), &out, &["--batch", "4"]).await;
    assert!(!stopped.status.success());
    let text = stderr(&stopped);
    let landed = batch_of_taken - 1;
    for says in [
        format!("import stopped at batch {batch_of_taken}: mappings"),
        "ALREADY_EXISTS".to_owned(),
        format!("mapping {}", taken.mapping_id.expect("id")),
        "Nothing of it was written".to_owned(),
        format!("--skip-mappings {}", 4 * landed),
    ] {
        assert!(text.contains(&says), "{says:?} in {text}");
    }
    let rows = target.rows().await;
    assert_eq!(
        rows.column_mappings.len(),
        4 * landed + 1,
        "the batches before the refused one stay committed"
    );
    assert!(rows.data_files.is_empty(), "no file before every mapping");

    // Once the conflict is gone, the import goes on after the batches that landed.
    let mut client = target.sql_client().await;
    client
        .execute_update(
            format!(
                "DELETE FROM ducklake_column_mapping WHERE mapping_id = {}",
                taken.mapping_id.expect("id")
            ),
            None,
        )
        .await
        .expect("delete");
    // In batches of another size.
    let skip = (4 * landed).to_string();
    succeeded(
        &import(
            &target.uri(),
            &out,
            &["--batch", "3", "--skip-mappings", &skip],
        )
        .await,
        "resumed import",
    );
    assert_eq!(target.rows().await, expected);
}

/// A credentials file with a reader and a writer, and a token of each role; the tokens.
fn credentials(dir: &Path) -> (PathBuf, String, String) {
    let file = dir.join("auth");
    moraine::auth::add_user(&file, "reader", Role::Reader, PASSWORD).expect("user");
    let reader = moraine::auth::create_token(&file, "export", Role::Reader, None).expect("token");
    let writer = moraine::auth::create_token(&file, "import", Role::Writer, None).expect("token");
    (file, reader, writer)
}

fn secured(file: PathBuf, tls: Option<Arc<Tls>>) -> Access {
    Access {
        auth: Arc::new(
            Authenticator::from_file(file, SessionLimits::default()).expect("credentials"),
        ),
        tls,
        ticket_key: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_and_imports_need_the_credentials_of_an_authenticated_server() {
    let dir = tempfile::tempdir().expect("dir");
    let (file, reader, writer) = credentials(dir.path());
    let source = Server::start(secured(file.clone(), None)).await;
    source.load().await;
    let expected = source.rows().await;

    let refused = export(&source.uri(), &dir.path().join("none"), &[]).await;
    assert!(!refused.status.success());
    let text = stderr(&refused);
    assert!(
        text.contains("UNAUTHENTICATED") && text.contains("--token") && text.contains("--username"),
        "{text}"
    );
    assert!(
        !dir.path().join("none").exists(),
        "no export without credentials"
    );
    let wrong = export(
        &source.uri(),
        &dir.path().join("wrong"),
        &["--token", "mrt_not-a-token"],
    )
    .await;
    assert!(
        stderr(&wrong).contains("UNAUTHENTICATED"),
        "{}",
        stderr(&wrong)
    );

    let with_token = dir.path().join("token");
    succeeded(
        &export(&source.uri(), &with_token, &["--token", &reader]).await,
        "export with a token",
    );
    // The token from the environment, and a login with the password from the environment.
    let from_env = dir.path().join("env");
    succeeded(
        &moraine(
            args(&[
                "export",
                "--server",
                &source.uri(),
                "--out",
                &path(&from_env),
            ]),
            vec![("MORAINE_TOKEN", reader.clone())],
        )
        .await,
        "export with MORAINE_TOKEN",
    );
    let login = dir.path().join("login");
    succeeded(
        &moraine(
            args(&[
                "export",
                "--server",
                &source.uri(),
                "--out",
                &path(&login),
                "--username",
                "reader",
            ]),
            vec![("MORAINE_PASSWORD", PASSWORD.to_owned())],
        )
        .await,
        "export with a login",
    );
    let exported = checksums(&manifest(&with_token));
    assert_eq!(checksums(&manifest(&from_env)), exported);
    assert_eq!(checksums(&manifest(&login)), exported);

    // Importing takes a writer: a reader is refused at its first transaction.
    let target = Server::start(secured(file, None)).await;
    let refused = import(&target.uri(), &with_token, &["--token", &reader]).await;
    let text = stderr(&refused);
    assert!(
        text.contains("PERMISSION_DENIED") && text.contains("Nothing was committed before it"),
        "{text}"
    );
    succeeded(
        &import(&target.uri(), &with_token, &["--token", &writer]).await,
        "import with a writer's token",
    );
    assert_eq!(target.rows().await, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_run_over_mutual_tls() {
    let dir = tempfile::tempdir().expect("dir");
    let (pki, mut files) = crate::auth::make_pki(dir.path(), "export");
    let write = |name: &str, text: &str| {
        let file = dir.path().join(name);
        std::fs::write(&file, text).expect("write");
        path(&file)
    };
    let ca = write("ca.pem", &pki.ca);
    let cert = write("client.pem", &pki.client_cert);
    let key = write("client.key", &pki.client_key);
    files.client_ca = Some(dir.path().join("ca.pem"));
    let tls = Arc::new(Tls::load(files).expect("TLS loads"));
    let (auth, reader, _) = credentials(dir.path());
    let source = Server::start(secured(auth, Some(tls))).await;
    source.load().await;
    assert!(source.uri().starts_with("grpc+tls://127.0.0.1:"));

    let out = dir.path().join("export");
    succeeded(
        &export(
            &source.uri(),
            &out,
            &[
                "--token",
                &reader,
                "--tls-ca",
                &ca,
                "--tls-cert",
                &cert,
                "--tls-key",
                &key,
            ],
        )
        .await,
        "export over mutual TLS",
    );
    assert_eq!(manifest(&out).files.len(), 3);

    // Without the client certificate the server does not let the connection in; without
    // the CA the client does not trust the server.
    let refused = export(
        &source.uri(),
        &dir.path().join("no-cert"),
        &["--token", &reader, "--tls-ca", &ca],
    )
    .await;
    assert!(
        stderr(&refused).contains("--tls-cert"),
        "{}",
        stderr(&refused)
    );
    let refused = export(
        &source.uri(),
        &dir.path().join("no-ca"),
        &["--token", &reader],
    )
    .await;
    assert!(
        stderr(&refused).contains("--tls-ca"),
        "{}",
        stderr(&refused)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_arguments_are_one_import_or_the_other() {
    let dir = tempfile::tempdir().expect("dir");
    let export = path(dir.path());
    for (list, says) in [
        (vec!["import", "--from", &export], "--server"),
        (
            vec!["import", "dump.json", "--server", "grpc://127.0.0.1:1"],
            "cannot be used with",
        ),
        (vec!["import"], "<FILE|--from <FROM>>"),
        (vec!["import", "dump.json", "--batch", "5"], "--batch"),
    ] {
        let output = moraine(args(&list), Vec::new()).await;
        assert!(!output.status.success(), "{list:?}");
        assert!(
            stderr(&output).contains(says),
            "{list:?}: {}",
            stderr(&output)
        );
    }
}

mod contract {
    //! A Flight server that serves tables the way the endpoint contract describes (several
    //! endpoints per table, a snapshot named in the `FlightInfo`, the later tables asked for
    //! at it, a volume per endpoint), so that the exporter's side of it is tested before the
    //! server's side lands.

    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use arrow_flight::encode::FlightDataEncoderBuilder;
    use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
    use arrow_flight::{
        Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightEndpoint,
        FlightInfo, HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaResult, Ticket,
    };
    use datafusion::arrow::record_batch::RecordBatch;
    use futures::stream::BoxStream;
    use futures::{StreamExt as _, TryStreamExt as _};
    use tokio::sync::Semaphore;
    use tonic::{Request, Response, Status, Streaming};

    pub const SNAPSHOT: &str = "00112233445566778899aabbccddeeff";

    /// What the server serves and what it was asked.
    pub struct Contract {
        /// Per table, per endpoint, its batches.
        pub tables: BTreeMap<String, Vec<Vec<RecordBatch>>>,
        /// `DoGet` of this table's endpoints fails as an expired snapshot does.
        pub expired: Option<String>,
        /// The first endpoint of this table is held until its last one has been streamed.
        pub held: Option<String>,
        /// The paths `GetFlightInfo` was asked for, in order.
        pub asked: Mutex<Vec<Vec<String>>>,
        /// Whether a held endpoint waited in vain.
        pub hold_timed_out: AtomicBool,
        last_streamed: Semaphore,
    }

    impl Contract {
        pub fn new(tables: BTreeMap<String, Vec<Vec<RecordBatch>>>) -> Self {
            Self {
                tables,
                expired: None,
                held: None,
                asked: Mutex::new(Vec::new()),
                hold_timed_out: AtomicBool::new(false),
                last_streamed: Semaphore::new(0),
            }
        }
    }

    #[derive(Clone)]
    pub struct Service(pub Arc<Contract>);

    type Stream<T> = BoxStream<'static, Result<T, Status>>;

    fn ticket(table: &str, index: usize) -> Ticket {
        Ticket::new(format!("{table}\u{0}{index}"))
    }

    #[tonic::async_trait]
    impl FlightService for Service {
        type HandshakeStream = Stream<HandshakeResponse>;
        type ListFlightsStream = Stream<FlightInfo>;
        type DoGetStream = Stream<FlightData>;
        type DoPutStream = Stream<PutResult>;
        type DoExchangeStream = Stream<FlightData>;
        type DoActionStream = Stream<arrow_flight::Result>;
        type ListActionsStream = Stream<ActionType>;

        async fn handshake(
            &self,
            _request: Request<Streaming<HandshakeRequest>>,
        ) -> Result<Response<Self::HandshakeStream>, Status> {
            Ok(Response::new(
                futures::stream::iter([Ok(HandshakeResponse::default())]).boxed(),
            ))
        }

        async fn list_flights(
            &self,
            _request: Request<Criteria>,
        ) -> Result<Response<Self::ListFlightsStream>, Status> {
            Err(Status::unimplemented("list_flights"))
        }

        async fn get_flight_info(
            &self,
            request: Request<FlightDescriptor>,
        ) -> Result<Response<FlightInfo>, Status> {
            let path = request.into_inner().path;
            self.0.asked.lock().expect("lock").push(path.clone());
            let (table, snapshot) = match path.as_slice() {
                [table] => (table, "ffffffffffffffffffffffffffffffff"),
                [table, at] if at.strip_prefix('@') == Some(SNAPSHOT) => (table, SNAPSHOT),
                _ => return Err(Status::not_found(format!("no path {path:?}"))),
            };
            // Only the first table is asked for without a snapshot.
            let first = self.0.asked.lock().expect("lock").len() == 1;
            let snapshot = if first { SNAPSHOT } else { snapshot };
            let endpoints = self
                .0
                .tables
                .get(table)
                .ok_or_else(|| Status::not_found(table.clone()))?;
            let schema = endpoints
                .iter()
                .flatten()
                .next()
                .map(RecordBatch::schema)
                .ok_or_else(|| Status::internal("no rows"))?;
            let mut info = FlightInfo::new()
                .try_with_schema(&schema)
                .map_err(|err| Status::internal(err.to_string()))?
                .with_app_metadata(format!(
                    "{{\"snapshot\": \"{snapshot}\", \"expires_in_ms\": 60000}}"
                ));
            for (index, batches) in endpoints.iter().enumerate() {
                let volume: usize = batches.iter().map(RecordBatch::get_array_memory_size).sum();
                info = info.with_endpoint(
                    FlightEndpoint::new()
                        .with_ticket(ticket(table, index))
                        .with_app_metadata(format!("{{\"volume\": {volume}}}")),
                );
            }
            Ok(Response::new(info))
        }

        async fn poll_flight_info(
            &self,
            _request: Request<FlightDescriptor>,
        ) -> Result<Response<PollInfo>, Status> {
            Err(Status::unimplemented("poll_flight_info"))
        }

        async fn get_schema(
            &self,
            _request: Request<FlightDescriptor>,
        ) -> Result<Response<SchemaResult>, Status> {
            Err(Status::unimplemented("get_schema"))
        }

        async fn do_get(
            &self,
            request: Request<Ticket>,
        ) -> Result<Response<Self::DoGetStream>, Status> {
            let ticket = String::from_utf8(request.into_inner().ticket.to_vec())
                .map_err(|_| Status::invalid_argument("ticket"))?;
            let (table, index) = ticket
                .split_once('\u{0}')
                .and_then(|(table, index)| Some((table.to_owned(), index.parse::<usize>().ok()?)))
                .ok_or_else(|| Status::invalid_argument("ticket"))?;
            if self.0.expired.as_deref() == Some(table.as_str()) {
                return Err(Status::failed_precondition(format!(
                    "snapshot {SNAPSHOT} has expired: it was held for 60000 ms"
                )));
            }
            let endpoints = &self.0.tables[&table];
            let batches = endpoints[index].clone();
            let held = self.0.held.as_deref() == Some(table.as_str());
            if held && index == 0 {
                let waited =
                    tokio::time::timeout(Duration::from_secs(20), self.0.last_streamed.acquire())
                        .await;
                if waited.is_err() {
                    self.0.hold_timed_out.store(true, Ordering::SeqCst);
                }
            }
            let schema = batches[0].schema();
            let encoded = FlightDataEncoderBuilder::new()
                .with_schema(schema)
                .build(futures::stream::iter(batches.into_iter().map(Ok)))
                .map_err(|err| Status::internal(err.to_string()));
            let contract = Arc::clone(&self.0);
            let last = held && index + 1 == endpoints.len();
            let end = futures::stream::once(async move {
                if last {
                    contract.last_streamed.add_permits(1);
                }
                None
            })
            .filter_map(futures::future::ready);
            Ok(Response::new(encoded.chain(end).boxed()))
        }

        async fn do_put(
            &self,
            _request: Request<Streaming<FlightData>>,
        ) -> Result<Response<Self::DoPutStream>, Status> {
            Err(Status::unimplemented("do_put"))
        }

        async fn do_exchange(
            &self,
            _request: Request<Streaming<FlightData>>,
        ) -> Result<Response<Self::DoExchangeStream>, Status> {
            Err(Status::unimplemented("do_exchange"))
        }

        async fn do_action(
            &self,
            _request: Request<Action>,
        ) -> Result<Response<Self::DoActionStream>, Status> {
            Err(Status::unimplemented("do_action"))
        }

        async fn list_actions(
            &self,
            _request: Request<Empty>,
        ) -> Result<Response<Self::ListActionsStream>, Status> {
            Err(Status::unimplemented("list_actions"))
        }
    }

    /// Serves `contract` on a free port until the test ends; its URI.
    pub async fn serve(contract: Arc<Contract>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(FlightServiceServer::new(Service(contract)))
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        );
        format!("grpc://{addr}")
    }
}

/// The rows of the export in `dir`, per table: each table split into `endpoints` endpoints
/// of contiguous rows, each endpoint into batches of `rows` rows (the last endpoint one
/// batch).
fn served_as_endpoints(
    dir: &Path,
    endpoints: usize,
    rows: usize,
) -> std::collections::BTreeMap<String, Vec<Vec<datafusion::arrow::record_batch::RecordBatch>>> {
    use datafusion::arrow::compute::concat_batches;
    let manifest = manifest(dir);
    let mut tables = std::collections::BTreeMap::new();
    for file in &manifest.files {
        let batches: Vec<_> = moraine::export::TableReader::open(
            &dir.join(&file.file),
            file.table,
            manifest.ducklake,
            manifest.file_format,
        )
        .expect("opens")
        .collect::<Result<_, _>>()
        .expect("reads");
        let all = concat_batches(&batches[0].schema(), &batches).expect("concat");
        let per = all.num_rows().div_ceil(endpoints);
        let mut split = Vec::new();
        for e in 0..endpoints {
            let start = (e * per).min(all.num_rows());
            let end = ((e + 1) * per).min(all.num_rows());
            let part = all.slice(start, end - start);
            let step = if e + 1 == endpoints {
                part.num_rows().max(1)
            } else {
                rows
            };
            let mut pieces = Vec::new();
            let mut at = 0;
            while at < part.num_rows() {
                let n = step.min(part.num_rows() - at);
                pieces.push(part.slice(at, n));
                at += n;
            }
            if pieces.is_empty() {
                pieces.push(part);
            }
            split.push(pieces);
        }
        tables.insert(file.table.name().to_owned(), split);
    }
    tables
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_read_in_parallel_are_written_in_order_at_the_snapshot_of_the_first() {
    let source = Server::with_catalog().await;
    let dir = tempfile::tempdir().expect("dir");
    let reference = dir.path().join("reference");
    succeeded(&export(&source.uri(), &reference, &[]).await, "export");

    // The same rows from three endpoints a table, in other batches; the first endpoint of
    // the mappings is held until the last one has been streamed.
    let mut served = contract::Contract::new(served_as_endpoints(&reference, 3, 5));
    served.held = Some("ducklake_column_mapping".into());
    let served = Arc::new(served);
    let uri = contract::serve(Arc::clone(&served)).await;
    let out = dir.path().join("from-endpoints");
    succeeded(&export(&uri, &out, &["--parallel", "3"]).await, "export");
    assert!(
        !served
            .hold_timed_out
            .load(std::sync::atomic::Ordering::SeqCst),
        "the last endpoint was read while the first was held"
    );
    let exported = manifest(&out);
    assert_eq!(exported.snapshot.as_deref(), Some(contract::SNAPSHOT));
    assert_eq!(checksums(&exported), checksums(&manifest(&reference)));
    let at = format!("@{}", contract::SNAPSHOT);
    assert_eq!(
        *served.asked.lock().expect("lock"),
        vec![
            vec!["ducklake_column_mapping".to_owned()],
            vec!["ducklake_name_mapping".to_owned(), at.clone()],
            vec!["ducklake_data_file".to_owned(), at],
        ],
        "every FlightInfo first, the later tables at the first one's snapshot"
    );

    // One endpoint at a time gives the same files.
    let one = dir.path().join("one-at-a-time");
    let served = Arc::new(contract::Contract::new(served_as_endpoints(
        &reference, 3, 2,
    )));
    let uri = contract::serve(served).await;
    succeeded(&export(&uri, &one, &["--parallel", "1"]).await, "export");
    assert_eq!(checksums(&manifest(&one)), checksums(&manifest(&reference)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_snapshot_fails_the_export_with_what_to_do() {
    let source = Server::with_catalog().await;
    let dir = tempfile::tempdir().expect("dir");
    let reference = dir.path().join("reference");
    succeeded(&export(&source.uri(), &reference, &[]).await, "export");
    let mut served = contract::Contract::new(served_as_endpoints(&reference, 2, 3));
    served.expired = Some("ducklake_data_file".into());
    let uri = contract::serve(Arc::new(served)).await;
    let out = dir.path().join("expired");
    let failed = export(&uri, &out, &[]).await;
    assert!(!failed.status.success());
    let text = stderr(&failed);
    assert!(
        text.contains("FAILED_PRECONDITION") && text.contains("--snapshot-ttl"),
        "{text}"
    );
    let left: Vec<String> = std::fs::read_dir(&out)
        .expect("the directory")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert!(
        !left
            .iter()
            .any(|f| f == "manifest.json" || f.ends_with(".partial")),
        "no manifest and no partial file: {left:?}"
    );
}

/// A table of many scan pages (2500 mappings, 5000 name rows, 2500 files) in one endpoint
/// comes back in key order every time: two exports, and an export of its import, are the
/// same files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_of_many_pages_exports_the_same_files_every_time() {
    let source = Server::empty().await;
    let mut batch = StagedBatch::new();
    let mappings: Vec<ColumnMappingRow> = (0..2500_i64)
        .map(|id| ColumnMappingRow {
            mapping_id: Some(id),
            table_id: Some(1),
            map_type: Some("map_by_name".into()),
        })
        .collect();
    let names: Vec<NameMappingRow> = (0..2500_i64)
        .flat_map(|id| {
            (0..2).map(move |column_id| NameMappingRow {
                mapping_id: Some(id),
                column_id: Some(column_id),
                source_name: Some(format!("c{column_id}")),
                target_field_id: Some(column_id + 1),
                parent_column: (column_id == 1).then_some(0),
                is_partition: Some(false),
            })
        })
        .collect();
    let files: Vec<DataFileRow> = (0..2500_i64)
        .map(|id| DataFileRow {
            data_file_id: Some(10_000 + id),
            table_id: Some(1),
            begin_snapshot: Some(1),
            path: Some(format!("f{id}.parquet")),
            path_is_relative: Some(true),
            file_format: Some("parquet".into()),
            record_count: Some(id),
            mapping_id: Some(id),
            ..DataFileRow::default()
        })
        .collect();
    batch
        .push(Op::Insert(Insert::column_mappings(&mappings)))
        .push(Op::Insert(Insert::name_mappings(&names)))
        .push(Op::Insert(Insert::data_files(&files)));
    commit_batch(&source.catalog, &batch).await.expect("load");
    let dir = tempfile::tempdir().expect("dir");
    let (first, again) = (dir.path().join("first"), dir.path().join("again"));
    succeeded(&export(&source.uri(), &first, &[]).await, "export");
    succeeded(&export(&source.uri(), &again, &[]).await, "export");
    assert_eq!(checksums(&manifest(&first)), checksums(&manifest(&again)));
    let target = Server::empty().await;
    succeeded(
        &import(&target.uri(), &first, &["--batch", "1000"]).await,
        "import",
    );
    assert_eq!(target.rows().await, source.rows().await);
    let second = dir.path().join("second");
    succeeded(&export(&target.uri(), &second, &[]).await, "export");
    assert_eq!(checksums(&manifest(&second)), checksums(&manifest(&first)));
}
