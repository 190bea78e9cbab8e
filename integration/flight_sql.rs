//! The Flight SQL server in-process on a free port, queried through arrow-flight's Flight SQL
//! client over real gRPC: DuckLake's queries, prepared statements, metadata, error codes,
//! plain Flight paths, and a table large enough to span many pages and batches.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::error::FlightError;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::sql::client::FlightSqlServiceClient;
use arrow_flight::sql::{CommandGetDbSchemas, CommandGetPrimaryKeys, CommandGetTables, SqlInfo};
use arrow_flight::{Action, Criteria, FlightDescriptor, FlightInfo, Ticket};
use datafusion::arrow::array::{Array, AsArray as _, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::arrow::util::display::array_value_to_string;
use futures::TryStreamExt as _;
use moraine::catalog::Catalog;
use moraine::server::RunningServer;
use moraine::write::commit_batch;
use tonic::Code;
use tonic::transport::Channel;

use crate::ducklake_fixture;
use crate::harness::{Backend, CatalogRows, TestStore};

/// A server over a store holding the whole DuckLake fixture.
pub struct Fixture {
    pub server: RunningServer,
    pub expected: CatalogRows,
    pub _store: TestStore,
}

impl Fixture {
    pub async fn start() -> Self {
        let store = Backend::Redb.open().await;
        let catalog = store.catalog();
        let mut expected = CatalogRows::default();
        for step in ducklake_fixture::steps() {
            commit_batch(&catalog, &step.batch)
                .await
                .expect("fixture commits");
            expected = step.expected;
        }
        Self::serve(store, catalog, expected).await
    }

    pub async fn serve(store: TestStore, catalog: Catalog, expected: CatalogRows) -> Self {
        let server = moraine::server::start(catalog, "127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("server starts");
        Self {
            server,
            expected,
            _store: store,
        }
    }

    /// The server's URI, as `moraine export --server` takes it.
    pub fn server_uri(&self) -> String {
        format!("grpc://{}", self.server.addr())
    }

    pub async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.server.addr()))
            .expect("uri")
            .connect()
            .await
            .expect("connect")
    }

    pub async fn client(&self) -> FlightSqlServiceClient<Channel> {
        FlightSqlServiceClient::new(self.channel().await)
    }
}

/// Every batch of every endpoint of `info`, each endpoint through a fresh connection.
async fn fetch(fixture: &Fixture, info: &FlightInfo) -> Vec<RecordBatch> {
    let mut batches = Vec::new();
    for endpoint in &info.endpoint {
        let ticket = endpoint.ticket.clone().expect("ticket");
        let mut client = fixture.client().await;
        let stream = client.do_get(ticket).await.expect("do_get");
        let got: Vec<RecordBatch> = stream.try_collect().await.expect("stream");
        batches.extend(got);
    }
    batches
}

pub async fn query(fixture: &Fixture, sql: &str) -> (Schema, Vec<RecordBatch>) {
    let mut client = fixture.client().await;
    let info = client.execute(sql.to_owned(), None).await.expect("execute");
    let schema = info.clone().try_decode_schema().expect("schema");
    let batches = fetch(fixture, &info).await;
    for batch in &batches {
        assert_eq!(
            batch.schema().as_ref(),
            &schema,
            "stream schema equals FlightInfo schema for {sql}"
        );
    }
    (schema, batches)
}

/// Rows as text tuples, NULL as "NULL", for comparing with expected rows.
pub fn rows_of(batches: &[RecordBatch]) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    for batch in batches {
        for row in 0..batch.num_rows() {
            rows.push(
                batch
                    .columns()
                    .iter()
                    .map(|c| {
                        if c.is_null(row) {
                            "NULL".to_owned()
                        } else {
                            array_value_to_string(c, row).expect("value")
                        }
                    })
                    .collect(),
            );
        }
    }
    rows
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "NULL".to_owned(), |v| v.to_string())
}

/// DuckLake's mapping load join, computed from the expected rows.
fn expected_join(expected: &CatalogRows, cursor: Option<i64>) -> Vec<Vec<String>> {
    let maps: BTreeMap<i64, _> = expected
        .column_mappings
        .iter()
        .map(|m| (m.mapping_id.expect("id"), m))
        .collect();
    let mut rows = Vec::new();
    for name in &expected.name_mappings {
        let id = name.mapping_id.expect("id");
        if cursor.is_some_and(|c| id < c) {
            continue;
        }
        let Some(map) = maps.get(&id) else { continue };
        rows.push(vec![
            id.to_string(),
            opt(map.table_id),
            opt(map.map_type.clone()),
            opt(name.column_id),
            opt(name.source_name.clone()),
            opt(name.target_field_id),
            opt(name.parent_column),
            opt(name.is_partition),
        ]);
    }
    rows
}

const MAPPING_LOAD: &str = "SELECT mapping_id, table_id, type, column_id, source_name, target_field_id, parent_column, is_partition \
FROM ducklake_column_mapping JOIN ducklake_name_mapping USING (mapping_id) ORDER BY mapping_id, parent_column NULLS FIRST";

fn sorted(mut rows: Vec<Vec<String>>) -> Vec<Vec<String>> {
    rows.sort();
    rows
}

/// The ordering DuckLake relies on: by mapping id, and parents (NULL first) before children.
fn assert_load_order(rows: &[Vec<String>]) {
    let key = |r: &Vec<String>| {
        let parent = if r[6] == "NULL" {
            None
        } else {
            Some(r[6].parse::<i64>().expect("int"))
        };
        (r[0].parse::<i64>().expect("int"), parent)
    };
    assert!(
        rows.windows(2).all(|w| key(&w[0]) <= key(&w[1])),
        "ORDER BY mapping_id, parent_column NULLS FIRST"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ducklake_mapping_load_runs_verbatim_cold_and_with_cursor() {
    let fixture = Fixture::start().await;
    let (_, batches) = query(&fixture, MAPPING_LOAD).await;
    let rows = rows_of(&batches);
    assert_load_order(&rows);
    assert_eq!(
        sorted(rows.clone()),
        sorted(expected_join(&fixture.expected, None))
    );
    assert_eq!(
        rows.len(),
        58,
        "all name rows of the seven fixture mappings"
    );

    let with_cursor = MAPPING_LOAD.replace("ORDER BY", "WHERE mapping_id >= 10 ORDER BY");
    let (_, batches) = query(&fixture, &with_cursor).await;
    let rows = rows_of(&batches);
    assert_load_order(&rows);
    assert_eq!(
        sorted(rows),
        sorted(expected_join(&fixture.expected, Some(10)))
    );
    // Schema-qualified names answer too.
    let qualified = MAPPING_LOAD
        .replace(
            "FROM ducklake_column_mapping",
            "FROM main.ducklake_column_mapping",
        )
        .replace(
            "JOIN ducklake_name_mapping",
            "JOIN moraine.main.ducklake_name_mapping",
        );
    let (_, batches) = query(&fixture, &qualified).await;
    assert_eq!(rows_of(&batches).len(), 58);
    fixture.server.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_file_query_at_a_snapshot_returns_ducklakes_rows() {
    let fixture = Fixture::start().await;
    for snapshot in [3_i64, 14, 15, 20] {
        let sql = format!(
            "SELECT data_file_id, table_id, begin_snapshot, end_snapshot, file_order, path, path_is_relative, \
             file_format, record_count, file_size_bytes, footer_size, row_id_start, partition_id, encryption_key, \
             partial_file_info, mapping_id FROM ducklake_data_file \
             WHERE table_id = 1 AND {snapshot} >= begin_snapshot AND ({snapshot} < end_snapshot OR end_snapshot IS NULL)"
        );
        let (schema, batches) = query(&fixture, &sql).await;
        assert!(!schema.field(0).is_nullable() && schema.field(1).is_nullable());
        let expected: Vec<Vec<String>> = fixture
            .expected
            .data_files
            .iter()
            .filter(|f| f.table_id == Some(1))
            .filter(|f| f.begin_snapshot.is_some_and(|b| snapshot >= b))
            .filter(|f| f.end_snapshot.is_none_or(|e| snapshot < e))
            .map(|f| {
                vec![
                    opt(f.data_file_id),
                    opt(f.table_id),
                    opt(f.begin_snapshot),
                    opt(f.end_snapshot),
                    opt(f.file_order),
                    opt(f.path.clone()),
                    opt(f.path_is_relative),
                    opt(f.file_format.clone()),
                    opt(f.record_count),
                    opt(f.file_size_bytes),
                    opt(f.footer_size),
                    opt(f.row_id_start),
                    opt(f.partition_id),
                    opt(f.encryption_key.clone()),
                    opt(f.partial_file_info.clone()),
                    opt(f.mapping_id),
                ]
            })
            .collect();
        assert!(!expected.is_empty());
        assert_eq!(
            sorted(rows_of(&batches)),
            sorted(expected),
            "snapshot {snapshot}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_statements_bind_positional_parameters() {
    let fixture = Fixture::start().await;
    let mut client = fixture.client().await;
    for sql in [
        "SELECT mapping_id FROM ducklake_column_mapping WHERE table_id = $1 ORDER BY mapping_id",
        "SELECT mapping_id FROM ducklake_column_mapping WHERE table_id = ? ORDER BY mapping_id",
    ] {
        let mut prepared = client.prepare(sql.to_owned(), None).await.expect("prepare");
        let params = prepared
            .parameter_schema()
            .expect("parameter schema")
            .clone();
        assert_eq!(params.fields().len(), 1, "{sql}");
        assert_eq!(params.field(0).name(), "0");
        for (table_id, want) in [(2_i64, vec![13_i64]), (1, vec![0, 3, 5, 7, 10, 16])] {
            let batch = RecordBatch::try_new(
                Arc::new(Schema::new(vec![Field::new("0", DataType::Int64, true)])),
                vec![Arc::new(datafusion::arrow::array::Int64Array::from(vec![
                    table_id,
                ]))],
            )
            .expect("batch");
            prepared.set_parameters(batch).expect("bind");
            let info = prepared.execute().await.expect("execute");
            let batches = fetch(&fixture, &info).await;
            let got: Vec<i64> = batches
                .iter()
                .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
                .collect();
            assert_eq!(got, want, "{sql} with {table_id}");
        }
        prepared.close().await.expect("close");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_commands_describe_the_served_tables() {
    let fixture = Fixture::start().await;
    let mut client = fixture.client().await;

    let info = client.get_catalogs().await.expect("catalogs");
    assert_eq!(
        rows_of(&fetch(&fixture, &info).await),
        vec![vec!["moraine".to_owned()]]
    );

    let info = client
        .get_db_schemas(CommandGetDbSchemas {
            catalog: None,
            db_schema_filter_pattern: None,
        })
        .await
        .expect("schemas");
    assert_eq!(
        rows_of(&fetch(&fixture, &info).await),
        vec![vec!["moraine".to_owned(), "main".to_owned()]]
    );

    let info = client
        .get_tables(CommandGetTables {
            include_schema: true,
            ..CommandGetTables::default()
        })
        .await
        .expect("tables");
    let batches = fetch(&fixture, &info).await;
    let names: Vec<String> = rows_of(&batches)
        .into_iter()
        .map(|r| r[2].clone())
        .collect();
    assert_eq!(
        names,
        [
            "ducklake_column_mapping",
            "ducklake_data_file",
            "ducklake_name_mapping"
        ]
    );
    assert_eq!(
        batches[0].num_columns(),
        5,
        "include_schema adds table_schema"
    );

    let info = client.get_table_types().await.expect("types");
    assert_eq!(
        rows_of(&fetch(&fixture, &info).await),
        vec![vec!["TABLE".to_owned()]]
    );

    let info = client
        .get_sql_info(vec![
            SqlInfo::FlightSqlServerName,
            SqlInfo::FlightSqlServerTransaction,
        ])
        .await
        .expect("sql info");
    let rows = rows_of(&fetch(&fixture, &info).await);
    assert_eq!(rows.len(), 2);
    assert!(rows[0][1].contains("moraine"), "{rows:?}");

    let info = client
        .get_xdbc_type_info(arrow_flight::sql::CommandGetXdbcTypeInfo { data_type: None })
        .await
        .expect("types");
    let types: Vec<String> = rows_of(&fetch(&fixture, &info).await)
        .into_iter()
        .map(|r| r[0].clone())
        .collect();
    // Sorted by XDBC type code, as Flight SQL specifies.
    assert_eq!(types, ["BOOLEAN", "BIGINT", "VARCHAR"]);

    let info = client
        .get_primary_keys(CommandGetPrimaryKeys {
            catalog: None,
            db_schema: None,
            table: "ducklake_data_file".into(),
        })
        .await
        .expect("primary keys");
    let rows = rows_of(&fetch(&fixture, &info).await);
    assert_eq!(rows[0][3], "data_file_id");
}

pub fn code_of(err: &FlightError) -> Code {
    match err {
        FlightError::Tonic(status) => status.code(),
        other => panic!("expected a gRPC status, got {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_carry_the_right_codes() {
    let fixture = Fixture::start().await;
    let mut client = fixture.client().await;
    let err = client
        .execute("SELEC nonsense".into(), None)
        .await
        .expect_err("bad SQL");
    assert_eq!(code_of(&err), Code::InvalidArgument);
    let err = client
        .execute("SELECT * FROM no_such_table".into(), None)
        .await
        .expect_err("unknown table");
    assert_eq!(code_of(&err), Code::InvalidArgument);
    for refused in [
        "DROP TABLE ducklake_data_file",
        "CREATE TABLE x (a INT)",
        "CREATE EXTERNAL TABLE x STORED AS CSV LOCATION '/etc/passwd'",
        "COPY ducklake_data_file TO '/tmp/x.csv'",
        "SET datafusion.execution.batch_size = 1",
    ] {
        let err = client
            .execute(refused.into(), None)
            .await
            .expect_err(refused);
        assert_eq!(code_of(&err), Code::InvalidArgument, "{refused}: {err}");
    }
    let err = client
        .get_exported_keys(arrow_flight::sql::CommandGetExportedKeys {
            catalog: None,
            db_schema: None,
            table: "x".into(),
        })
        .await
        .expect_err("unsupported command");
    assert_eq!(code_of(&err), Code::Unimplemented);
    let err = client
        .do_action(Action {
            r#type: "NoSuchAction".into(),
            body: Vec::new().into(),
        })
        .await
        .expect_err("unknown action");
    assert_eq!(code_of(&err), Code::Unimplemented);
    let err = client
        .do_get(Ticket {
            ticket: b"garbage".to_vec().into(),
        })
        .await
        .expect_err("bad ticket");
    assert!(
        matches!(code_of(&err), Code::InvalidArgument | Code::Unimplemented),
        "{err}"
    );
    // The data is all still there.
    let (_, batches) = query(&fixture, "SELECT count(*) FROM ducklake_data_file").await;
    assert_eq!(
        rows_of(&batches),
        vec![vec![fixture.expected.data_files.len().to_string()]]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tickets_work_on_other_connections_and_concurrently() {
    let fixture = Fixture::start().await;
    let mut client = fixture.client().await;
    let info = client
        .execute(MAPPING_LOAD.into(), None)
        .await
        .expect("execute");
    let ticket = info.endpoint[0].ticket.clone().expect("ticket");
    let reads: Vec<_> = (0..6)
        .map(|_| {
            let ticket = ticket.clone();
            let channel = fixture.channel();
            async move {
                let mut client = FlightSqlServiceClient::new(channel.await);
                let batches: Vec<RecordBatch> = client
                    .do_get(ticket)
                    .await
                    .expect("do_get")
                    .try_collect()
                    .await
                    .expect("stream");
                rows_of(&batches)
            }
        })
        .collect();
    let results = futures::future::join_all(reads).await;
    assert!(results.iter().all(|r| r.len() == 58 && *r == results[0]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_flight_paths_stream_tables() {
    let fixture = Fixture::start().await;
    let mut client = FlightServiceClient::new(fixture.channel().await);
    let infos: Vec<FlightInfo> = client
        .list_flights(Criteria::default())
        .await
        .expect("list")
        .into_inner()
        .try_collect()
        .await
        .expect("infos");
    let paths: Vec<Vec<String>> = infos
        .iter()
        .map(|i| i.flight_descriptor.clone().expect("descriptor").path)
        .collect();
    assert_eq!(
        paths,
        [
            ["ducklake_column_mapping"],
            ["ducklake_name_mapping"],
            ["ducklake_data_file"]
        ]
        .map(|p| p.map(str::to_owned).to_vec())
    );
    for (path, want) in [
        (
            vec!["ducklake_name_mapping"],
            fixture.expected.name_mappings.len(),
        ),
        (
            vec!["ducklake_data_file", "2"],
            fixture
                .expected
                .data_files
                .iter()
                .filter(|f| f.table_id == Some(2))
                .count(),
        ),
        (vec!["ducklake_column_mapping", "1"], 6),
    ] {
        let descriptor = FlightDescriptor::new_path(path.iter().map(|s| (*s).to_owned()).collect());
        let info = client
            .get_flight_info(descriptor)
            .await
            .expect("info")
            .into_inner();
        let schema = info.clone().try_decode_schema().expect("schema");
        let ticket = info.endpoint[0].ticket.clone().expect("ticket");
        let stream = client.do_get(ticket).await.expect("do_get").into_inner();
        let batches: Vec<RecordBatch> =
            FlightRecordBatchStream::new_from_flight_data(stream.map_err(FlightError::from))
                .try_collect()
                .await
                .expect("batches");
        assert!(batches.iter().all(|b| b.schema().as_ref() == &schema));
        assert_eq!(
            batches.iter().map(RecordBatch::num_rows).sum::<usize>(),
            want,
            "{path:?}"
        );
    }
    let err = client
        .get_flight_info(FlightDescriptor::new_path(vec!["nope".into()]))
        .await
        .expect_err("unknown table");
    assert_eq!(err.code(), Code::NotFound);
    assert!(err.message().contains("nope"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_table_streams_in_many_batches() {
    use moraine::model::{ColumnMappingRow, NameMappingRow};
    use moraine::write::{Insert, Op, StagedBatch};
    let store = Backend::Redb.open().await;
    let catalog = store.catalog();
    let mappings = 3000_i64;
    let mut batch = StagedBatch::new();
    batch.push(Op::Insert(Insert::column_mappings(
        &(0..mappings)
            .map(|id| ColumnMappingRow {
                mapping_id: Some(id),
                table_id: Some(id % 7),
                map_type: Some("map_by_name".into()),
            })
            .collect::<Vec<_>>(),
    )));
    batch.push(Op::Insert(Insert::name_mappings(
        &(0..mappings)
            .flat_map(|id| {
                (0..17).map(move |c| NameMappingRow {
                    mapping_id: Some(id),
                    column_id: Some(c),
                    source_name: Some(format!("col{c}")),
                    target_field_id: Some(c + 1),
                    parent_column: (c > 0).then_some(0),
                    is_partition: Some(false),
                })
            })
            .collect::<Vec<_>>(),
    )));
    commit_batch(&catalog, &batch).await.expect("load");
    let fixture = Fixture::serve(store, catalog, CatalogRows::default()).await;
    let (_, batches) = query(
        &fixture,
        "SELECT mapping_id, column_id FROM ducklake_name_mapping",
    )
    .await;
    assert_eq!(
        batches.iter().map(RecordBatch::num_rows).sum::<usize>(),
        51_000
    );
    assert!(
        batches.len() > 3,
        "streamed in several batches, got {}",
        batches.len()
    );
    let (_, batches) = query(
        &fixture,
        "SELECT count(*) FROM ducklake_column_mapping WHERE table_id IN (1, 3)",
    )
    .await;
    let want = (0..mappings)
        .filter(|id| id % 7 == 1 || id % 7 == 3)
        .count();
    assert_eq!(rows_of(&batches), vec![vec![want.to_string()]]);
    let (_, batches) = query(&fixture, MAPPING_LOAD).await;
    let rows = rows_of(&batches);
    assert_eq!(rows.len(), 51_000);
    assert_load_order(&rows);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_do_get_stops_the_scan() {
    use moraine::model::{ColumnMappingRow, NameMappingRow};
    use moraine::write::{Insert, Op, StagedBatch};
    let store = Backend::Redb.open().await;
    let catalog = store.catalog();
    let mappings = 160_000_i64;
    let mut batch = StagedBatch::new();
    batch.push(Op::Insert(Insert::column_mappings(
        &(0..mappings)
            .map(|id| ColumnMappingRow {
                mapping_id: Some(id),
                table_id: Some(1),
                map_type: Some("map_by_name".into()),
            })
            .collect::<Vec<_>>(),
    )));
    batch.push(Op::Insert(Insert::name_mappings(
        &(0..mappings)
            .map(|id| NameMappingRow {
                mapping_id: Some(id),
                column_id: Some(0),
                source_name: Some("c".into()),
                target_field_id: Some(1),
                parent_column: None,
                is_partition: Some(false),
            })
            .collect::<Vec<_>>(),
    )));
    commit_batch(&catalog, &batch).await.expect("load");
    let reads = Arc::clone(&store.reads);
    let fixture = Fixture::serve(store, catalog, CatalogRows::default()).await;
    let mut client = fixture.client().await;
    // Not a whole-table read, whose snapshot is held for its endpoints beyond one stream.
    let info = client
        .execute(
            "SELECT mapping_id, source_name FROM ducklake_name_mapping".into(),
            None,
        )
        .await
        .expect("execute");
    let ticket = info.endpoint[0].ticket.clone().expect("ticket");

    let before = reads.pages();
    let mut stream = client.do_get(ticket).await.expect("do_get");
    let first = stream
        .try_next()
        .await
        .expect("first batch")
        .expect("a batch");
    assert!(first.num_rows() > 0);
    assert!(reads.live_snapshots() > 0, "the scan holds its snapshot");
    drop(stream);
    // Once the server has let go of the scan's snapshot, no page can be read any more.
    reads
        .until("the server drops the scan's snapshot", |reads| {
            reads.live_snapshots() == 0
        })
        .await;
    let after_drop = reads.pages();
    let whole_scan =
        usize::try_from(mappings).expect("small") / moraine::kv::PageSize::default().rows;
    assert!(
        after_drop - before < whole_scan / 2,
        "the scan stopped early: {} of {whole_scan} pages read",
        after_drop - before
    );
}
