//! Whole-table reads through parallel endpoints at one held snapshot, over real gRPC.
//!
//! A random catalog (the generator of [`crate::query_paths`]) is served with endpoints sized
//! small enough that every table divides; on the fake TiKV the endpoints follow the region
//! boundaries the test splits. For each table, read by SQL and by path, the endpoints are
//! read concurrently, each on its own connection, and their union must be exactly the rows
//! of a one-stream read, each row once, each in its endpoint's range of tables, with a commit
//! made between the `GetFlightInfo` and the reads invisible to them.

use std::ops::RangeInclusive;
use std::time::Duration;

use arrow_flight::FlightInfo;
use arrow_flight::client::FlightClient;
use arrow_flight::error::FlightError;
use arrow_flight::sql::client::FlightSqlServiceClient;
use datafusion::arrow::record_batch::RecordBatch;
use futures::TryStreamExt as _;
use moraine::clock::Clock;
use moraine::kv::Division;
use moraine::model::{CatalogTable, ColumnMappingRow, DataFileRow, NameMappingRow};
use moraine::server::{Limits, PartLimits, RunningServer};
use moraine::write::{Insert, Op, StagedBatch, commit_batch};
use tonic::Code;
use tonic::transport::Channel;

use crate::flight_sql::{code_of, rows_of};
use crate::harness::{Backend, TestStore};
use crate::query_paths::{Rng, generate, seed};

const TABLES: [CatalogTable; 3] = [
    CatalogTable::ColumnMapping,
    CatalogTable::NameMapping,
    CatalogTable::DataFile,
];

async fn serve(store: &TestStore, parts: PartLimits, clock: Clock) -> RunningServer {
    moraine::server::start_limited(
        store.catalog(),
        "127.0.0.1:0".parse().expect("addr"),
        Limits {
            parts,
            clock,
            ..Limits::default()
        },
    )
    .await
    .expect("server starts")
}

/// Endpoints of about 1 KiB of stored rows: every table of the generated catalog divides.
fn small_parts() -> PartLimits {
    PartLimits {
        lifetime: Duration::from_mins(1),
        max_held: 64,
        division: Division {
            span_bytes: 1024,
            max_spans: 64,
        },
    }
}

async fn channel(server: &RunningServer) -> Channel {
    Channel::from_shared(format!("http://{}", server.addr()))
        .expect("uri")
        .connect()
        .await
        .expect("connect")
}

async fn whole_table_info(server: &RunningServer, table: CatalogTable, by_sql: bool) -> FlightInfo {
    if by_sql {
        FlightSqlServiceClient::new(channel(server).await)
            .execute(format!("SELECT * FROM {}", table.name()), None)
            .await
            .expect("GetFlightInfo by SQL")
    } else {
        path_info(server, vec![table.name().to_owned()])
            .await
            .expect("GetFlightInfo by path")
    }
}

async fn path_info(server: &RunningServer, path: Vec<String>) -> Result<FlightInfo, FlightError> {
    FlightClient::new(channel(server).await)
        .get_flight_info(arrow_flight::FlightDescriptor::new_path(path))
        .await
}

/// The tables an endpoint covers, as its `app_metadata` says.
fn tables_of(endpoint: &arrow_flight::FlightEndpoint) -> RangeInclusive<i64> {
    let about: serde_json::Value =
        serde_json::from_slice(&endpoint.app_metadata).expect("endpoint metadata is JSON");
    let bound = |i: usize| about["tables"][i].as_i64().expect("a table id");
    bound(0)..=bound(1)
}

/// The held snapshot a `FlightInfo` names.
fn snapshot_of(info: &FlightInfo) -> String {
    let about: serde_json::Value =
        serde_json::from_slice(&info.app_metadata).expect("info metadata is JSON");
    assert!(about["expires_in_ms"].as_u64().expect("a lifetime") > 0);
    about["snapshot"].as_str().expect("a snapshot").to_owned()
}

async fn read_endpoint(
    server: &RunningServer,
    endpoint: &arrow_flight::FlightEndpoint,
) -> Result<Vec<RecordBatch>, FlightError> {
    assert!(
        endpoint.location.is_empty(),
        "an endpoint means this server"
    );
    let ticket = endpoint.ticket.clone().expect("ticket");
    FlightClient::new(channel(server).await)
        .do_get(ticket)
        .await?
        .try_collect()
        .await
}

/// Every endpoint of `info` read at once, each on its own connection: rows per endpoint.
async fn read_concurrently(server: &RunningServer, info: &FlightInfo) -> Vec<Vec<Vec<String>>> {
    let reads = info.endpoint.iter().map(|endpoint| async move {
        rows_of(
            &read_endpoint(server, endpoint)
                .await
                .expect("endpoint reads"),
        )
    });
    futures::future::join_all(reads).await
}

/// The rows of `table` through one stream: a query that is not a whole-table read.
async fn one_stream(server: &RunningServer, table: CatalogTable) -> Vec<Vec<String>> {
    let info = FlightSqlServiceClient::new(channel(server).await)
        .execute(
            format!("SELECT * FROM {} LIMIT 1000000000", table.name()),
            None,
        )
        .await
        .expect("execute");
    assert_eq!(info.endpoint.len(), 1, "a limited query is one stream");
    let mut rows = rows_of(
        &read_endpoint(server, &info.endpoint[0])
            .await
            .expect("reads"),
    );
    rows.sort();
    rows
}

/// Checks the endpoints of `info` and returns their union, sorted.
async fn union_of(
    server: &RunningServer,
    table: CatalogTable,
    info: &FlightInfo,
) -> Vec<Vec<String>> {
    assert!(!info.ordered, "no order holds across the endpoints");
    let ranges: Vec<RangeInclusive<i64>> = info.endpoint.iter().map(tables_of).collect();
    assert_eq!(*ranges[0].start(), i64::MIN, "{ranges:?}");
    assert_eq!(*ranges[ranges.len() - 1].end(), i64::MAX, "{ranges:?}");
    for pair in ranges.windows(2) {
        assert_eq!(
            *pair[0].end() + 1,
            *pair[1].start(),
            "disjoint, in order, nothing left out: {ranges:?}"
        );
    }
    let mut union = Vec::new();
    for (rows, range) in read_concurrently(server, info)
        .await
        .into_iter()
        .zip(&ranges)
    {
        if table != CatalogTable::NameMapping {
            for row in &rows {
                let table_id: i64 = row[1].parse().expect("table_id");
                assert!(range.contains(&table_id), "{row:?} read in part {range:?}");
            }
        }
        union.extend(rows);
    }
    union.sort();
    union
}

/// Rows in tables across every part: a mapping with a name row and a file in each.
async fn commit_more(catalog: &moraine::catalog::Catalog, tables: &[i64]) {
    let mut batch = StagedBatch::new();
    let (mut maps, mut names, mut files) = (Vec::new(), Vec::new(), Vec::new());
    for (i, &table) in tables.iter().enumerate() {
        let id = 1_000_000 + i64::try_from(i).expect("small");
        maps.push(ColumnMappingRow {
            mapping_id: Some(id),
            table_id: Some(table),
            map_type: Some("map_by_name".into()),
        });
        names.push(NameMappingRow {
            mapping_id: Some(id),
            column_id: Some(0),
            source_name: Some("late".into()),
            target_field_id: Some(1),
            parent_column: None,
            is_partition: Some(false),
        });
        files.push(DataFileRow {
            data_file_id: Some(id),
            table_id: Some(table),
            begin_snapshot: Some(1),
            path: Some(format!("late-{id}.parquet")),
            path_is_relative: Some(true),
            file_format: Some("parquet".into()),
            record_count: Some(1),
            mapping_id: Some(id),
            ..DataFileRow::default()
        });
    }
    batch
        .push(Op::Insert(Insert::column_mappings(&maps)))
        .push(Op::Insert(Insert::name_mappings(&names)))
        .push(Op::Insert(Insert::data_files(&files)));
    commit_batch(catalog, &batch).await.expect("a later commit");
}

/// The union of the endpoints is the table, row for row, through SQL and through a path;
/// a commit after the `GetFlightInfo` is not seen by its endpoints; once every endpoint has
/// been read, the snapshot is let go. Returns the endpoints' table ranges per table.
async fn endpoints_union_to_the_table(store: TestStore) -> Vec<Vec<RangeInclusive<i64>>> {
    let seed = seed();
    let catalog = store.catalog();
    let shape = generate(&catalog, &mut Rng(seed)).await;
    let server = serve(&store, small_parts(), Clock::system()).await;
    let mut before = Vec::new();
    let mut infos = Vec::new();
    for table in TABLES {
        before.push(one_stream(&server, table).await);
        for by_sql in [true, false] {
            infos.push((table, whole_table_info(&server, table, by_sql).await));
        }
    }
    let mut late_tables = shape.tables.clone();
    late_tables.push(i64::MAX - 1);
    commit_more(&catalog, &late_tables).await;
    let mut ranges = Vec::new();
    for (i, (table, info)) in infos.iter().enumerate() {
        let union = union_of(&server, *table, info).await;
        assert_eq!(
            union,
            before[i / 2],
            "{table}: the endpoints' union is the table at GetFlightInfo (seed {seed})"
        );
        ranges.push(info.endpoint.iter().map(tables_of).collect());
        // Read to its end, an endpoint is let go with the rest of its snapshot.
        let again = read_endpoint(&server, &info.endpoint[0])
            .await
            .expect_err("the snapshot is let go once every endpoint is read");
        assert_eq!(code_of(&again), Code::FailedPrecondition, "{again}");
    }
    for (i, table) in TABLES.into_iter().enumerate() {
        let now = one_stream(&server, table).await;
        assert_eq!(now.len(), before[i].len() + late_tables.len(), "{table}");
    }
    store
        .reads
        .until("the held snapshots are let go", |reads| {
            reads.live_snapshots() == 0
        })
        .await;
    ranges
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_redb_the_endpoints_of_a_table_union_to_it_at_one_snapshot() {
    let ranges = endpoints_union_to_the_table(Backend::Redb.open().await).await;
    for (i, table_ranges) in ranges.iter().enumerate() {
        assert!(
            table_ranges.len() > 2,
            "{}: 1 KiB endpoints divide the table, got {table_ranges:?}",
            TABLES[i / 2]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn in_memory_the_endpoints_of_a_table_union_to_it_at_one_snapshot() {
    let ranges = endpoints_union_to_the_table(Backend::Memory.open().await).await;
    assert!(ranges.iter().all(|r| r.len() > 2), "{ranges:?}");
}

/// On TiKV the endpoints are the regions: split at the start of table 2 and inside table 11
/// of the mappings, and at the start of table 8 of the data files.
#[cfg(feature = "tikv")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_tikv_the_endpoints_follow_the_regions() {
    use moraine::codec::Kind;
    use moraine::model::TableId;
    let store = Backend::Tikv.open().await;
    let keyspace = store.catalog().keyspace().clone();
    let cluster = std::sync::Arc::clone(store.cluster().expect("a fake cluster"));
    cluster.split(&keyspace.table_range(Kind::Mapping, TableId(2)).start);
    cluster.split(&keyspace.row_key(Kind::Mapping, TableId(11), 0));
    cluster.split(&keyspace.table_range(Kind::DataFile, TableId(8)).start);
    let ranges = endpoints_union_to_the_table(store).await;
    let mappings = vec![i64::MIN..=1, 2..=11, 12..=i64::MAX];
    let files = vec![i64::MIN..=7, 8..=i64::MAX];
    assert_eq!(
        ranges,
        vec![
            mappings.clone(),
            mappings.clone(),
            mappings.clone(),
            mappings,
            files.clone(),
            files
        ]
    );
    drop(cluster);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_tables_read_at_a_held_snapshot_until_it_expires() {
    let store = Backend::Redb.open().await;
    let catalog = store.catalog();
    generate(&catalog, &mut Rng(seed())).await;
    let clock = Clock::manual();
    let server = serve(&store, small_parts(), clock.clone()).await;
    let files_before = one_stream(&server, CatalogTable::DataFile).await;
    let first = whole_table_info(&server, CatalogTable::ColumnMapping, false).await;
    let snapshot = snapshot_of(&first);
    commit_more(&catalog, &[3, 40]).await;

    let at_snapshot = path_info(
        &server,
        vec!["ducklake_data_file".into(), format!("@{snapshot}")],
    )
    .await
    .expect("a table at the held snapshot");
    assert_eq!(snapshot_of(&at_snapshot), snapshot);
    assert_eq!(
        union_of(&server, CatalogTable::DataFile, &at_snapshot).await,
        files_before,
        "read at the snapshot, not after the commit"
    );
    let fresh = whole_table_info(&server, CatalogTable::DataFile, false).await;
    assert_ne!(snapshot_of(&fresh), snapshot);
    assert_eq!(
        union_of(&server, CatalogTable::DataFile, &fresh)
            .await
            .len(),
        files_before.len() + 2
    );

    clock.advance(Duration::from_secs(61));
    let err = read_endpoint(&server, &first.endpoint[0])
        .await
        .expect_err("expired");
    assert_eq!(code_of(&err), Code::FailedPrecondition, "{err}");
    assert!(err.to_string().contains("--snapshot-ttl"), "{err}");
    let err = path_info(
        &server,
        vec!["ducklake_name_mapping".into(), format!("@{snapshot}")],
    )
    .await
    .expect_err("expired");
    assert_eq!(code_of(&err), Code::FailedPrecondition, "{err}");
    let err = path_info(&server, vec!["ducklake_data_file".into(), "@zz".into()])
        .await
        .expect_err("not a snapshot id");
    assert_eq!(code_of(&err), Code::InvalidArgument, "{err}");
    assert!(err.to_string().contains("32 hex digits"), "{err}");
}
