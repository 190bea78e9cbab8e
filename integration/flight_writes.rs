//! Writes over Flight, through arrow-flight's own clients over real gRPC against a server on
//! a redb store: transactions with explicit ids, session-bound ingest, DML statements,
//! read-your-writes, expiry, limits, conflicts and the one-stream plain-Flight upload.

use std::sync::Arc;
use std::time::Duration;

use arrow_flight::error::FlightError;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::sql::client::FlightSqlServiceClient;
use arrow_flight::sql::{
    CommandStatementIngest, EndTransaction, TableDefinitionOptions, TableExistsOption,
    TableNotExistOption,
};
use arrow_flight::{FlightData, FlightDescriptor, PutResult};
use bytes::Bytes;
use datafusion::arrow::array::{ArrayRef, BooleanArray, Int64Array, RecordBatch, StringArray};
use futures::TryStreamExt as _;
use moraine::catalog::Catalog;
use moraine::clock::Clock;
use moraine::model::{ColumnMappingRow, DataFileRow, NameMappingRow};
use moraine::server::{Limits, RunningServer};
use moraine::txn::TxnConfig;
use tonic::Code;
use tonic::transport::Channel;

use crate::ducklake_fixture;
use crate::flight_sql::code_of;
use crate::harness::{Backend, CatalogRows, TestStore, catalog_rows};

const LOAD_QUERY: &str = "SELECT mapping_id, table_id, type, column_id, source_name, target_field_id, parent_column, is_partition FROM ducklake_column_mapping JOIN ducklake_name_mapping USING (mapping_id) ORDER BY mapping_id, parent_column NULLS FIRST";

struct Server {
    running: RunningServer,
    catalog: Catalog,
    store: TestStore,
}

impl Server {
    /// A server on an empty redb store.
    async fn empty(config: TxnConfig) -> Self {
        Self::empty_on(Backend::Redb, config).await
    }

    /// A server on an empty store of `backend`.
    async fn empty_on(backend: Backend, config: TxnConfig) -> Self {
        Self::start(backend, Limits::of_transactions(config)).await
    }

    /// A server on an empty redb store whose transaction timeouts read `clock`.
    async fn timed(config: TxnConfig, clock: Clock) -> Self {
        Self::start(
            Backend::Redb,
            Limits {
                clock,
                ..Limits::of_transactions(config)
            },
        )
        .await
    }

    async fn start(backend: Backend, limits: Limits) -> Self {
        let store = backend.open().await;
        let catalog = store.catalog();
        let server = moraine::server::start_limited(
            catalog.clone(),
            "127.0.0.1:0".parse().expect("addr"),
            limits,
        )
        .await
        .expect("server starts");
        Self {
            running: server,
            catalog,
            store,
        }
    }

    /// A server on a redb store holding DuckLake's fixture.
    async fn with_fixture() -> (Self, CatalogRows) {
        let server = Self::empty(TxnConfig::default()).await;
        let mut expected = CatalogRows::default();
        for step in ducklake_fixture::steps() {
            moraine::write::commit_batch(&server.catalog, &step.batch)
                .await
                .expect("fixture commits");
            expected = step.expected;
        }
        (server, expected)
    }

    async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.running.addr()))
            .expect("uri")
            .connect()
            .await
            .expect("connect")
    }

    async fn client(&self) -> FlightSqlServiceClient<Channel> {
        FlightSqlServiceClient::new(self.channel().await)
    }

    async fn rows(&self) -> CatalogRows {
        catalog_rows(&self.catalog).await
    }
}

fn count(n: usize) -> i64 {
    i64::try_from(n).expect("a count fits i64")
}

fn mapping_batch(rows: &[ColumnMappingRow]) -> RecordBatch {
    RecordBatch::try_from_iter([
        (
            "mapping_id",
            Arc::new(rows.iter().map(|r| r.mapping_id).collect::<Int64Array>()) as ArrayRef,
        ),
        (
            "table_id",
            Arc::new(rows.iter().map(|r| r.table_id).collect::<Int64Array>()),
        ),
        (
            "type",
            Arc::new(
                rows.iter()
                    .map(|r| r.map_type.clone())
                    .collect::<StringArray>(),
            ),
        ),
    ])
    .expect("batch")
}

fn name_batch(rows: &[NameMappingRow]) -> RecordBatch {
    RecordBatch::try_from_iter([
        (
            "mapping_id",
            Arc::new(rows.iter().map(|r| r.mapping_id).collect::<Int64Array>()) as ArrayRef,
        ),
        (
            "column_id",
            Arc::new(rows.iter().map(|r| r.column_id).collect::<Int64Array>()),
        ),
        (
            "source_name",
            Arc::new(
                rows.iter()
                    .map(|r| r.source_name.clone())
                    .collect::<StringArray>(),
            ),
        ),
        (
            "target_field_id",
            Arc::new(
                rows.iter()
                    .map(|r| r.target_field_id)
                    .collect::<Int64Array>(),
            ),
        ),
        (
            "parent_column",
            Arc::new(rows.iter().map(|r| r.parent_column).collect::<Int64Array>()),
        ),
        (
            "is_partition",
            Arc::new(
                rows.iter()
                    .map(|r| r.is_partition)
                    .collect::<BooleanArray>(),
            ),
        ),
    ])
    .expect("batch")
}

pub(crate) fn file_batch(rows: &[DataFileRow]) -> RecordBatch {
    let int = |f: fn(&DataFileRow) -> Option<i64>| -> ArrayRef {
        Arc::new(rows.iter().map(f).collect::<Int64Array>())
    };
    let text = |f: fn(&DataFileRow) -> Option<String>| -> ArrayRef {
        Arc::new(rows.iter().map(f).collect::<StringArray>())
    };
    RecordBatch::try_from_iter([
        ("data_file_id", int(|r| r.data_file_id)),
        ("table_id", int(|r| r.table_id)),
        ("begin_snapshot", int(|r| r.begin_snapshot)),
        ("end_snapshot", int(|r| r.end_snapshot)),
        ("file_order", int(|r| r.file_order)),
        ("path", text(|r| r.path.clone())),
        (
            "path_is_relative",
            Arc::new(
                rows.iter()
                    .map(|r| r.path_is_relative)
                    .collect::<BooleanArray>(),
            ),
        ),
        ("file_format", text(|r| r.file_format.clone())),
        ("record_count", int(|r| r.record_count)),
        ("file_size_bytes", int(|r| r.file_size_bytes)),
        ("footer_size", int(|r| r.footer_size)),
        ("row_id_start", int(|r| r.row_id_start)),
        ("partition_id", int(|r| r.partition_id)),
        ("encryption_key", text(|r| r.encryption_key.clone())),
        ("partial_file_info", text(|r| r.partial_file_info.clone())),
        ("mapping_id", int(|r| r.mapping_id)),
    ])
    .expect("batch")
}

/// One registered file's worth of rows: mapping `mapping_id` of `table_id` (a struct with two
/// children) and data file `mapping_id + 1` using it.
pub(crate) fn registration(table_id: i64, mapping_id: i64) -> CatalogRows {
    let name = |column_id, source: &str, parent| NameMappingRow {
        mapping_id: Some(mapping_id),
        column_id: Some(column_id),
        source_name: Some(source.into()),
        target_field_id: Some(column_id + 1),
        parent_column: parent,
        is_partition: Some(false),
    };
    CatalogRows {
        column_mappings: vec![ColumnMappingRow {
            mapping_id: Some(mapping_id),
            table_id: Some(table_id),
            map_type: Some("map_by_name".into()),
        }],
        name_mappings: vec![
            name(0, "s", None),
            name(1, "a", Some(0)),
            name(2, "b", Some(0)),
        ],
        data_files: vec![DataFileRow {
            data_file_id: Some(mapping_id + 1),
            table_id: Some(table_id),
            begin_snapshot: Some(2),
            path: Some(format!("/lake/t{table_id}/f{mapping_id}.parquet")),
            path_is_relative: Some(false),
            file_format: Some("parquet".into()),
            record_count: Some(10),
            file_size_bytes: Some(1000),
            footer_size: Some(100),
            row_id_start: Some(0),
            mapping_id: Some(mapping_id),
            ..DataFileRow::default()
        }],
    }
}

fn ingest(table: &str, txn: Option<&Bytes>) -> CommandStatementIngest {
    CommandStatementIngest {
        table_definition_options: Some(TableDefinitionOptions {
            if_not_exist: TableNotExistOption::Fail as i32,
            if_exists: TableExistsOption::Append as i32,
        }),
        table: table.into(),
        schema: None,
        catalog: None,
        temporary: false,
        transaction_id: txn.cloned(),
        options: std::collections::HashMap::default(),
    }
}

pub(crate) async fn put(
    client: &mut FlightSqlServiceClient<Channel>,
    table: &str,
    batch: RecordBatch,
    txn: Option<&Bytes>,
) -> Result<i64, FlightError> {
    client
        .execute_ingest(ingest(table, txn), futures::stream::iter([Ok(batch)]))
        .await
}

pub(crate) async fn stage(
    client: &mut FlightSqlServiceClient<Channel>,
    rows: &CatalogRows,
    txn: Option<&Bytes>,
) {
    let counts = [
        put(
            client,
            "ducklake_column_mapping",
            mapping_batch(&rows.column_mappings),
            txn,
        )
        .await,
        put(
            client,
            "ducklake_name_mapping",
            name_batch(&rows.name_mappings),
            txn,
        )
        .await,
        put(
            client,
            "ducklake_data_file",
            file_batch(&rows.data_files),
            txn,
        )
        .await,
    ];
    let counts: Vec<i64> = counts.into_iter().map(|c| c.expect("ingest")).collect();
    assert_eq!(
        counts,
        vec![
            count(rows.column_mappings.len()),
            count(rows.name_mappings.len()),
            count(rows.data_files.len())
        ]
    );
}

/// Every row of `sql` read in `txn`, as `i64`/text cells rendered to strings.
async fn read(
    client: &mut FlightSqlServiceClient<Channel>,
    sql: &str,
    txn: Option<&Bytes>,
) -> Vec<Vec<String>> {
    let info = client
        .execute(sql.into(), txn.cloned())
        .await
        .expect("execute");
    let mut rows = Vec::new();
    for endpoint in info.endpoint {
        let batches: Vec<RecordBatch> = client
            .do_get(endpoint.ticket.expect("ticket"))
            .await
            .expect("do_get")
            .try_collect()
            .await
            .expect("stream");
        for batch in batches {
            for row in 0..batch.num_rows() {
                rows.push(
                    batch
                        .columns()
                        .iter()
                        .map(|c| {
                            datafusion::arrow::util::display::array_value_to_string(c, row)
                                .expect("cell")
                        })
                        .collect(),
                );
            }
        }
    }
    rows
}

fn merged(a: &CatalogRows, b: &CatalogRows) -> CatalogRows {
    let mut all = a.clone();
    all.column_mappings.extend(b.column_mappings.clone());
    all.name_mappings.extend(b.name_mappings.clone());
    all.data_files.extend(b.data_files.clone());
    all.sorted()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_transaction_reads_its_writes_and_commits_them_atomically() {
    let server = Server::empty(TxnConfig::default()).await;
    let mut writer = server.client().await;
    let mut other = server.client().await;
    let txn = writer.begin_transaction().await.expect("begin");
    let first = registration(7, 10);
    stage(&mut writer, &first, Some(&txn)).await;

    // The transaction sees its staged rows through DuckLake's own query; nobody else does,
    // and nothing is in the store.
    let inside = read(&mut writer, LOAD_QUERY, Some(&txn)).await;
    assert_eq!(inside.len(), first.name_mappings.len(), "{inside:?}");
    assert_eq!(inside[0][..5], ["10", "7", "map_by_name", "0", "s"]);
    assert!(read(&mut other, LOAD_QUERY, None).await.is_empty());
    assert_eq!(server.rows().await, CatalogRows::default());

    // A delete inside the transaction is visible to it at once.
    let deleted = writer
        .execute_update(
            "DELETE FROM ducklake_data_file WHERE data_file_id IN (11, 999)".into(),
            Some(txn.clone()),
        )
        .await
        .expect("delete");
    assert_eq!(deleted, 1);
    assert!(
        read(&mut writer, "SELECT * FROM ducklake_data_file", Some(&txn))
            .await
            .is_empty()
    );
    put(
        &mut writer,
        "ducklake_data_file",
        file_batch(&first.data_files),
        Some(&txn),
    )
    .await
    .expect("re-insert after delete");

    writer
        .end_transaction(txn.clone(), EndTransaction::Commit)
        .await
        .expect("commit");
    assert_eq!(server.rows().await, first.clone().sorted());
    assert_eq!(read(&mut other, LOAD_QUERY, None).await, inside);

    // The transaction is over: a late call is refused and names what became of it.
    let err = put(
        &mut writer,
        "ducklake_data_file",
        file_batch(&first.data_files),
        Some(&txn),
    )
    .await
    .expect_err("late ingest");
    assert_eq!(code_of(&err), Code::FailedPrecondition, "{err}");
    assert!(err.to_string().contains("committed"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_and_refused_statements_leave_nothing() {
    let server = Server::empty(TxnConfig::default()).await;
    let mut client = server.client().await;
    let txn = client.begin_transaction().await.expect("begin");
    stage(&mut client, &registration(1, 20), Some(&txn)).await;
    client
        .end_transaction(txn.clone(), EndTransaction::Rollback)
        .await
        .expect("rollback");
    assert_eq!(server.rows().await, CatalogRows::default());

    // A statement that breaks a constraint no later statement can mend is refused at once,
    // naming the mapping; the transaction goes on without it.
    let txn = client.begin_transaction().await.expect("begin");
    let good = registration(1, 30);
    let mut bad_names = good.name_mappings.clone();
    bad_names[2].column_id = Some(1);
    put(
        &mut client,
        "ducklake_column_mapping",
        mapping_batch(&good.column_mappings),
        Some(&txn),
    )
    .await
    .expect("mapping staged");
    let err = put(
        &mut client,
        "ducklake_name_mapping",
        name_batch(&bad_names),
        Some(&txn),
    )
    .await
    .expect_err("duplicate column_id");
    assert_eq!(code_of(&err), Code::InvalidArgument, "{err}");
    assert!(
        err.to_string()
            .contains("mapping 30 has column_id 1 more than once"),
        "{err}"
    );
    put(
        &mut client,
        "ducklake_name_mapping",
        name_batch(&good.name_mappings),
        Some(&txn),
    )
    .await
    .expect("good names staged");

    // What a later statement could still mend waits for the commit: a file of a mapping the
    // transaction never stages fails the commit, and nothing at all is written.
    let mut orphan_file = good.data_files.clone();
    orphan_file[0].mapping_id = Some(99);
    put(
        &mut client,
        "ducklake_data_file",
        file_batch(&orphan_file),
        Some(&txn),
    )
    .await
    .expect("pending violation staged");
    let err = client
        .end_transaction(txn.clone(), EndTransaction::Commit)
        .await
        .expect_err("commit refused");
    assert_eq!(code_of(&err), Code::InvalidArgument, "{err}");
    assert!(err.to_string().contains("references mapping 99"), "{err}");
    assert_eq!(server.rows().await, CatalogRows::default());
    // Rolling back after a refused commit is harmless (ADBC may do it).
    client
        .end_transaction(txn, EndTransaction::Rollback)
        .await
        .expect("rollback after refused commit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_transactions_creating_one_mapping_cannot_both_commit() {
    two_transactions_race(Backend::Redb).await;
}

/// The same race on TiKV, where the loser is refused by the cluster's own insert-if-absent
/// check at prewrite.
#[cfg(feature = "tikv")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_transactions_creating_one_mapping_cannot_both_commit_on_tikv() {
    two_transactions_race(Backend::Tikv).await;
}

async fn two_transactions_race(backend: Backend) {
    let server = Server::empty_on(backend, TxnConfig::default()).await;
    let mut a = server.client().await;
    let mut b = server.client().await;
    let ta = a.begin_transaction().await.expect("begin a");
    let tb = b.begin_transaction().await.expect("begin b");
    let rows = registration(3, 40);
    stage(&mut a, &rows, Some(&ta)).await;
    stage(&mut b, &rows, Some(&tb)).await;
    a.end_transaction(ta, EndTransaction::Commit)
        .await
        .expect("first commit wins");
    let err = b
        .end_transaction(tb, EndTransaction::Commit)
        .await
        .expect_err("second commit loses");
    assert_eq!(code_of(&err), Code::Aborted, "{err}");
    assert!(err.to_string().contains("conflict"), "{err}");
    assert!(
        err.to_string().contains("mapping 40") || err.to_string().contains("data file 41"),
        "{err}"
    );
    assert_eq!(server.rows().await, rows.sorted());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_tables_end_transition_runs_in_a_transaction_with_counts() {
    let (server, expected) = Server::with_fixture().await;
    let mut client = server.client().await;
    let live: Vec<i64> = expected
        .data_files
        .iter()
        .filter(|f| f.end_snapshot.is_none() && f.table_id == Some(1))
        .filter_map(|f| f.data_file_id)
        .collect();
    assert!(!live.is_empty(), "the fixture has live files of table 1");

    // DROP TABLE's end transition, in a transaction, through a prepared statement with
    // parameters.
    let txn = client.begin_transaction().await.expect("begin");
    let mut ended = client
        .prepare(
            "UPDATE ducklake_data_file SET end_snapshot = ? WHERE end_snapshot IS NULL AND table_id IN (?)".into(),
            Some(txn.clone()),
        )
        .await
        .expect("prepare");
    ended
        .set_parameters(
            RecordBatch::try_from_iter([
                ("0", Arc::new(Int64Array::from(vec![99])) as ArrayRef),
                ("1", Arc::new(Int64Array::from(vec![1]))),
            ])
            .expect("params"),
        )
        .expect("bind");
    assert_eq!(
        ended.execute_update().await.expect("update"),
        count(live.len())
    );
    let in_txn = read(
        &mut client,
        "SELECT count(*) FROM ducklake_data_file WHERE table_id = 1 AND end_snapshot = 99",
        Some(&txn),
    )
    .await;
    assert_eq!(in_txn, vec![vec![live.len().to_string()]]);
    assert_eq!(
        server.rows().await,
        expected,
        "nothing written before the commit"
    );
    // Running it again ends nothing more: the files are no longer live in the view.
    assert_eq!(ended.execute_update().await.expect("update"), 0);
    client
        .end_transaction(txn, EndTransaction::Commit)
        .await
        .expect("commit");
    let after = server.rows().await;
    for file in &after.data_files {
        if live.contains(&file.data_file_id.unwrap_or_default()) {
            assert_eq!(file.end_snapshot, Some(99));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ducklake_expiry_deletes_commit_statement_by_statement() {
    let (server, after) = Server::with_fixture().await;
    let mut client = server.client().await;
    let live: Vec<i64> = after
        .data_files
        .iter()
        .filter(|f| f.table_id == Some(1))
        .filter_map(|f| f.data_file_id)
        .collect();
    // Snapshot expiry outside a transaction: each statement commits on its own.
    let deleted = client
        .execute_update(
            format!(
                "DELETE FROM ducklake_data_file WHERE data_file_id IN ({})",
                live.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            None,
        )
        .await
        .expect("delete files");
    assert_eq!(deleted, count(live.len()));
    let mappings_of_1 = after
        .column_mappings
        .iter()
        .filter(|m| m.table_id == Some(1))
        .count();
    let deleted = client
        .execute_update(
            "DELETE FROM ducklake_column_mapping WHERE table_id IN (1)".into(),
            None,
        )
        .await
        .expect("delete mappings");
    assert_eq!(deleted, count(mappings_of_1));
    let swept = client
        .execute_update("DELETE FROM ducklake_name_mapping tbl WHERE NOT EXISTS (SELECT 1 FROM ducklake_column_mapping m WHERE m.mapping_id = tbl.mapping_id)".into(), None)
        .await
        .expect("orphan sweep");
    assert_eq!(swept, 0);
    let rows = server.rows().await;
    assert!(rows.column_mappings.iter().all(|m| m.table_id != Some(1)));
    assert!(
        rows.data_files
            .iter()
            .all(|f| !live.contains(&f.data_file_id.unwrap_or_default()))
    );

    // Mappings are immutable; other data-file updates are refused; nothing changes.
    for refused in [
        "UPDATE ducklake_name_mapping SET source_name = 'x'",
        "UPDATE ducklake_data_file SET path = 'x' WHERE data_file_id = 1",
        "DELETE FROM ducklake_name_mapping WHERE mapping_id IN (SELECT mapping_id FROM ducklake_column_mapping)",
    ] {
        let err = client
            .execute_update(refused.into(), None)
            .await
            .expect_err(refused);
        assert_eq!(code_of(&err), Code::InvalidArgument, "{refused}: {err}");
    }
    assert_eq!(server.rows().await, rows);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untagged_ingest_joins_its_sessions_transaction() {
    let server = Server::empty(TxnConfig::default()).await;
    let mut client = server.client().await;
    let payload = client
        .handshake("anyone", "anything")
        .await
        .expect("handshake");
    assert!(
        client
            .token()
            .is_some_and(|t| t.as_bytes() == payload.as_ref()),
        "bearer token returned"
    );
    let txn = client.begin_transaction().await.expect("begin");
    let rows = registration(5, 50);
    // No transaction id, as ADBC sends it: the session's bearer token binds it.
    stage(&mut client, &rows, None).await;
    assert_eq!(
        server.rows().await,
        CatalogRows::default(),
        "staged, not committed"
    );
    client
        .end_transaction(txn, EndTransaction::Commit)
        .await
        .expect("commit");
    assert_eq!(server.rows().await, rows.clone().sorted());

    // Outside a transaction an ingest is its own atomic batch: a mapping without its name
    // rows is refused, a file of a stored mapping commits at once.
    let mut plain = server.client().await;
    let more = registration(5, 60);
    let err = put(
        &mut plain,
        "ducklake_column_mapping",
        mapping_batch(&more.column_mappings),
        None,
    )
    .await
    .expect_err("a mapping alone");
    assert_eq!(code_of(&err), Code::InvalidArgument, "{err}");
    assert!(
        err.to_string()
            .contains("mapping 60 of table 5 has no ducklake_name_mapping rows"),
        "{err}"
    );
    let mut file = more.data_files.clone();
    file[0].mapping_id = Some(50);
    put(&mut plain, "ducklake_data_file", file_batch(&file), None)
        .await
        .expect("file of a stored mapping");
    let expected = merged(
        &rows,
        &CatalogRows {
            data_files: file,
            ..CatalogRows::default()
        },
    );
    assert_eq!(server.rows().await, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_transaction_expires_and_late_calls_say_so() {
    let clock = Clock::manual();
    let timeout = Duration::from_mins(5);
    let server = Server::timed(
        TxnConfig {
            idle_timeout: timeout,
            ..TxnConfig::default()
        },
        clock.clone(),
    )
    .await;
    let mut client = server.client().await;
    let txn = client.begin_transaction().await.expect("begin");
    stage(&mut client, &registration(2, 70), Some(&txn)).await;
    // Idle means idle: used more often than the timeout, it lives on well past it, each
    // use starting its idle time over.
    let almost = timeout.saturating_sub(Duration::from_secs(1));
    for _ in 0..3 {
        clock.advance(almost);
        client
            .execute("SELECT 1".into(), Some(txn.clone()))
            .await
            .expect("a busy transaction stays open");
    }
    clock.advance(timeout);
    let err = client
        .end_transaction(txn.clone(), EndTransaction::Commit)
        .await
        .expect_err("expired");
    assert_eq!(code_of(&err), Code::FailedPrecondition, "{err}");
    assert!(err.to_string().contains("expired"), "{err}");
    let err = client
        .execute("SELECT 1".into(), Some(txn))
        .await
        .expect_err("expired read");
    assert_eq!(code_of(&err), Code::FailedPrecondition, "{err}");
    assert_eq!(server.rows().await, CatalogRows::default());
}

/// Staging is incremental: a statement reads from the store what its own rows need, however
/// much the transaction has staged before it. Statements 1 and 100 (three ingests each, one
/// mapping with its names and file) read the same keys; were staged rows evaluated again per
/// statement, the 100th would read about a hundred times more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hundredth_statement_reads_what_the_first_did() {
    let server = Server::empty(TxnConfig::default()).await;
    // Something in the base snapshot, so that the statements' look-ups find data there.
    let mut seeder = server.client().await;
    let seed = seeder.begin_transaction().await.expect("begin");
    for i in 0..50 {
        stage(&mut seeder, &registration(1, 10 * i), Some(&seed)).await;
    }
    seeder
        .end_transaction(seed, EndTransaction::Commit)
        .await
        .expect("seed commits");
    let reads = || {
        let store = &server.store;
        store.reads.keys() + store.reads.pages()
    };
    let mut client = server.client().await;
    let txn = client.begin_transaction().await.expect("begin");
    let mut costs = Vec::new();
    let mut all = CatalogRows::default();
    for i in 0..100 {
        let mut rows = registration(2 + i % 3, 10_000 + 10 * i);
        // And a file of table 1 on a mapping the base holds.
        let mut file = registration(1, 10 * (i % 50)).data_files.remove(0);
        file.data_file_id = Some(10_000 + 10 * i + 2);
        rows.data_files.push(file);
        let before = reads();
        stage(&mut client, &rows, Some(&txn)).await;
        costs.push(reads() - before);
        all = merged(&all, &rows);
    }
    assert!(costs[0] > 0, "a statement looks its keys up in the store");
    assert!(
        costs[99] <= costs[0] + 2,
        "statement 100 read {} keys, statement 1 read {}: {costs:?}",
        costs[99],
        costs[0]
    );
    assert!(costs.iter().max() <= Some(&(costs[0] + 2)), "{costs:?}");
    client
        .end_transaction(txn, EndTransaction::Commit)
        .await
        .expect("commit");
    let stored = server.rows().await;
    assert_eq!(stored.column_mappings.len(), 150);
    assert_eq!(stored.data_files.len(), 250);
    assert!(
        all.column_mappings
            .iter()
            .all(|row| stored.column_mappings.contains(row))
            && all
                .data_files
                .iter()
                .all(|row| stored.data_files.contains(row))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staging_limits_refuse_the_request_and_keep_the_transaction() {
    let server = Server::empty(TxnConfig {
        max_rows: 4,
        ..TxnConfig::default()
    })
    .await;
    let mut client = server.client().await;
    let txn = client.begin_transaction().await.expect("begin");
    let rows = registration(2, 80);
    put(
        &mut client,
        "ducklake_column_mapping",
        mapping_batch(&rows.column_mappings),
        Some(&txn),
    )
    .await
    .expect("1 row fits");
    put(
        &mut client,
        "ducklake_name_mapping",
        name_batch(&rows.name_mappings),
        Some(&txn),
    )
    .await
    .expect("4 rows fit");
    let err = put(
        &mut client,
        "ducklake_data_file",
        file_batch(&rows.data_files),
        Some(&txn),
    )
    .await
    .expect_err("5 rows do not");
    assert_eq!(code_of(&err), Code::ResourceExhausted, "{err}");
    assert!(err.to_string().contains("--txn-max-rows"), "{err}");
    client
        .end_transaction(txn, EndTransaction::Commit)
        .await
        .expect("what fitted commits");
    let stored = server.rows().await;
    assert_eq!(stored.column_mappings, rows.column_mappings);
    assert!(stored.data_files.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_checks_the_table_and_its_columns() {
    let server = Server::empty(TxnConfig::default()).await;
    let mut client = server.client().await;
    let rows = registration(2, 90);
    let wrong = RecordBatch::try_from_iter([
        (
            "mapping_id",
            Arc::new(StringArray::from(vec!["90"])) as ArrayRef,
        ),
        ("table_id", Arc::new(Int64Array::from(vec![2]))),
        ("type", Arc::new(StringArray::from(vec!["map_by_name"]))),
    ])
    .expect("batch");
    let err = put(&mut client, "ducklake_column_mapping", wrong, None)
        .await
        .expect_err("utf8 id");
    assert_eq!(code_of(&err), Code::InvalidArgument, "{err}");
    assert!(err.to_string().contains("column mapping_id"), "{err}");
    let err = put(
        &mut client,
        "no_such_table",
        mapping_batch(&rows.column_mappings),
        None,
    )
    .await
    .expect_err("unknown table");
    assert_eq!(code_of(&err), Code::NotFound, "{err}");
    for (if_not_exist, if_exists, code) in [
        (
            TableNotExistOption::Create,
            TableExistsOption::Fail,
            Code::AlreadyExists,
        ),
        (
            TableNotExistOption::Create,
            TableExistsOption::Replace,
            Code::Unimplemented,
        ),
    ] {
        let mut command = ingest("ducklake_column_mapping", None);
        command.table_definition_options = Some(TableDefinitionOptions {
            if_not_exist: if_not_exist as i32,
            if_exists: if_exists as i32,
        });
        let err = client
            .execute_ingest(
                command,
                futures::stream::iter([Ok(mapping_batch(&rows.column_mappings))]),
            )
            .await
            .expect_err("mode refused");
        assert_eq!(code_of(&err), code, "{err}");
    }
    assert_eq!(server.rows().await, CatalogRows::default());
}

/// Sends a plain-Flight upload of `batches` to `path`, with `last_metadata` on a final
/// metadata-only message when given.
async fn plain_upload(
    server: &Server,
    path: &str,
    batches: Vec<RecordBatch>,
    last_metadata: Option<&'static [u8]>,
) -> Result<Vec<PutResult>, tonic::Status> {
    send_upload(server, upload_messages(path, batches, last_metadata).await).await
}

/// The messages of a plain-Flight upload of `batches` to `path`: the schema, a message per
/// batch, and a final metadata-only message with `last_metadata` when given.
async fn upload_messages(
    path: &str,
    batches: Vec<RecordBatch>,
    last_metadata: Option<&'static [u8]>,
) -> Vec<FlightData> {
    let schema = batches[0].schema();
    let mut messages: Vec<FlightData> = arrow_flight::encode::FlightDataEncoderBuilder::new()
        .with_schema(schema)
        .with_flight_descriptor(Some(FlightDescriptor::new_path(vec![path.into()])))
        .build(futures::stream::iter(batches.into_iter().map(Ok)))
        .try_collect()
        .await
        .expect("encode");
    if let Some(metadata) = last_metadata {
        messages.push(FlightData {
            app_metadata: Bytes::from_static(metadata),
            ..FlightData::default()
        });
    }
    messages
}

async fn send_upload(
    server: &Server,
    messages: Vec<FlightData>,
) -> Result<Vec<PutResult>, tonic::Status> {
    let mut client = FlightServiceClient::new(server.channel().await);
    let response = client.do_put(futures::stream::iter(messages)).await?;
    response.into_inner().try_collect().await
}

/// A record batch whose body is shorter than its header says (a client bug, or a hostile
/// one) is refused as `INVALID_ARGUMENT` naming the body; the Arrow decoder, which slices the
/// body where the header points, never sees it. Nothing is stored, and the next upload works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_whose_body_is_cut_short_is_refused() {
    let server = Server::empty(TxnConfig::default()).await;
    let rows = registration(4, 100);
    let whole = upload_messages(
        "ducklake_mapping",
        vec![mapping_load_batch(&rows)],
        Some(b"commit"),
    )
    .await;
    for keep in [0, 1, 8, 64] {
        let mut messages = whole.clone();
        let batch = &mut messages[1];
        assert!(batch.data_body.len() > keep, "the batch has a body");
        batch.data_body = batch.data_body.slice(..keep);
        let err = send_upload(&server, messages)
            .await
            .expect_err("a cut body is refused");
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
        assert!(err.message().contains("body"), "{err}");
        assert_eq!(server.rows().await, CatalogRows::default());
    }
    send_upload(&server, whole)
        .await
        .expect("the whole upload commits");
    assert_eq!(server.rows().await.column_mappings, rows.column_mappings);
}

fn mapping_load_batch(rows: &CatalogRows) -> RecordBatch {
    let mapping = &rows.column_mappings[0];
    let n = rows.name_mappings.len();
    let names = name_batch(&rows.name_mappings);
    RecordBatch::try_from_iter([
        (
            "mapping_id",
            Arc::new(Int64Array::from(vec![mapping.mapping_id; n])) as ArrayRef,
        ),
        (
            "table_id",
            Arc::new(Int64Array::from(vec![mapping.table_id; n])),
        ),
        (
            "type",
            Arc::new(StringArray::from(vec![mapping.map_type.clone(); n])),
        ),
        ("column_id", Arc::clone(names.column(1))),
        ("source_name", Arc::clone(names.column(2))),
        ("target_field_id", Arc::clone(names.column(3))),
        ("parent_column", Arc::clone(names.column(4))),
        ("is_partition", Arc::clone(names.column(5))),
    ])
    .expect("batch")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_upload_commits_only_with_its_commit_marker() {
    let server = Server::empty(TxnConfig::default()).await;
    let rows = registration(4, 100);

    let err = plain_upload(
        &server,
        "ducklake_mapping",
        vec![mapping_load_batch(&rows)],
        None,
    )
    .await
    .expect_err("no marker");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(err.message().contains("commit marker"), "{err}");
    assert_eq!(server.rows().await, CatalogRows::default());

    let results = plain_upload(
        &server,
        "ducklake_mapping",
        vec![mapping_load_batch(&rows)],
        Some(b"commit"),
    )
    .await
    .expect("committed");
    let reply: serde_json::Value = serde_json::from_slice(&results[0].app_metadata).expect("json");
    assert_eq!(reply["committed"], true);
    assert_eq!(reply["rows"], 3);
    assert_eq!(reply["mappings"], 1);
    let results = plain_upload(
        &server,
        "ducklake_data_file",
        vec![file_batch(&rows.data_files)],
        Some(b"commit"),
    )
    .await
    .expect("committed");
    let reply: serde_json::Value = serde_json::from_slice(&results[0].app_metadata).expect("json");
    assert_eq!(reply["data_files"], 1);
    assert_eq!(server.rows().await, rows.clone().sorted());

    // A batch breaking a constraint commits nothing, even with the marker.
    let mut again = registration(4, 110);
    again.name_mappings[1].parent_column = Some(2);
    let err = plain_upload(
        &server,
        "ducklake_mapping",
        vec![mapping_load_batch(&again)],
        Some(b"commit"),
    )
    .await
    .expect_err("parent after child");
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(err.message().contains("mapping 110"), "{err}");
    assert_eq!(server.rows().await, rows.sorted());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_cut_off_midway_commits_nothing() {
    let server = Server::empty(TxnConfig::default()).await;
    let cut = registration(4, 120);
    let messages = upload_messages("ducklake_mapping", vec![mapping_load_batch(&cut)], None).await;
    // The client sends its batch, then is cut off before its commit marker.
    let (tx, rx) = futures::channel::mpsc::unbounded::<FlightData>();
    for message in messages {
        tx.unbounded_send(message).expect("queued");
    }
    let before = server.store.reads.keys();
    let mut client = FlightServiceClient::new(server.channel().await);
    let call =
        tokio::spawn(async move { client.do_put(rx).await.map(tonic::Response::into_inner) });
    // The server has the batch: staging it has looked up the keys it would create.
    server
        .store
        .reads
        .until("the server looks up the upload's keys", |reads| {
            reads.keys() > before
        })
        .await;
    call.abort();
    drop(tx);
    let _ = call.await;
    // The same upload of another mapping, whole and with its marker, commits; what the store
    // then holds is that one alone.
    let whole = registration(4, 130);
    send_upload(
        &server,
        upload_messages(
            "ducklake_mapping",
            vec![mapping_load_batch(&whole)],
            Some(b"commit"),
        )
        .await,
    )
    .await
    .expect("the whole upload commits");
    let stored = server.rows().await;
    assert_eq!(stored.column_mappings, whole.column_mappings);
    assert_eq!(stored.name_mappings, whole.clone().sorted().name_mappings);
}
