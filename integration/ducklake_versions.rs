//! DuckLake catalog versions over real gRPC: a deployment of each version serves, accepts
//! and exports `ducklake_data_file` with that version's columns in its order; another
//! version's shape is refused, naming it, with nothing written; and a deployment keeps the
//! version of its first start.
//!
//! DuckDB 1.4 (the only DuckLake extension installable here) writes 0.3 catalogs; the 1.0 and
//! 1.1 shapes are DuckLake's own DDL, pinned in `model::rows` and `model::version`.

use datafusion::arrow::record_batch::RecordBatch;
use moraine::catalog::Catalog;
use moraine::model::{CatalogTable, DataFileRow, DuckLakeVersion};
use moraine::write::{Insert, Op, StagedBatch, commit_batch};
use tonic::Code;

use crate::export::{export, import, manifest, stderr, succeeded};
use crate::flight_sql::{Fixture, code_of, query, rows_of};
use crate::flight_writes::put;
use crate::harness::{Backend, CatalogRows, catalog_rows};

/// A server of DuckLake `version` on an empty redb store, and its catalog.
async fn server(version: DuckLakeVersion) -> (Fixture, Catalog) {
    let store = Backend::Redb.open().await;
    let catalog = store.catalog();
    let settled = catalog
        .settle_ducklake(Some(version))
        .await
        .expect("a fresh store takes any version");
    assert_eq!(settled, version);
    let catalog = catalog.with_ducklake(version);
    let fixture = Fixture::serve(store, catalog.clone(), CatalogRows::default()).await;
    (fixture, catalog)
}

/// Data files with every column `version` has set, some NULL; the other versions' columns
/// NULL, as a file of `version` holds them.
fn files(version: DuckLakeVersion) -> Vec<DataFileRow> {
    (1..=3)
        .map(|i: i64| DataFileRow {
            data_file_id: Some(100 + i),
            table_id: Some(7),
            begin_snapshot: Some(i),
            end_snapshot: (i == 3).then_some(4),
            file_order: Some(i),
            path: Some(format!("ext/f{i}.parquet")),
            path_is_relative: Some(i % 2 == 0),
            file_format: Some("parquet".into()),
            record_count: Some(10 * i),
            file_size_bytes: Some(1000 + i),
            footer_size: Some(300),
            row_id_start: Some(10 * (i - 1)),
            partition_id: None,
            encryption_key: (i == 2).then(|| "key".into()),
            partial_file_info: (version == DuckLakeVersion::V0_3 && i != 1)
                .then(|| format!("partial_max:{}", 40 + i)),
            mapping_id: None,
            partial_max: (version >= DuckLakeVersion::V1_0 && i != 1).then_some(40 + i),
            row_group_count: (version >= DuckLakeVersion::V1_1).then_some(i),
        })
        .collect()
}

/// `rows` as a batch of `version`'s `ducklake_data_file` columns, in its order: the stored
/// columns an insert of them holds, projected.
fn batch_of(rows: &[DataFileRow], version: DuckLakeVersion) -> RecordBatch {
    Insert::data_files(rows)
        .rows()
        .project(version.data_file_positions())
        .expect("the version's columns")
}

/// `rows` as text tuples of `version`'s columns, as [`rows_of`] reads a result.
fn text_of(rows: &[DataFileRow], version: DuckLakeVersion) -> Vec<Vec<String>> {
    rows_of(&[batch_of(rows, version)])
}

fn names(version: DuckLakeVersion) -> Vec<&'static str> {
    version
        .columns(CatalogTable::DataFile)
        .iter()
        .map(|c| c.name)
        .collect()
}

async fn data_files(fixture: &Fixture) -> (Vec<String>, Vec<Vec<String>>) {
    let (schema, batches) = query(
        fixture,
        "SELECT * FROM ducklake_data_file ORDER BY data_file_id",
    )
    .await;
    let columns = schema.fields().iter().map(|f| f.name().clone()).collect();
    (columns, rows_of(&batches))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_version_round_trips_its_data_files_through_ingest_query_insert_export_and_import() {
    for version in DuckLakeVersion::ALL {
        let (source, catalog) = server(version).await;
        let rows = files(version);
        let mut client = source.client().await;
        let ingested = put(
            &mut client,
            "ducklake_data_file",
            batch_of(&rows, version),
            None,
        )
        .await
        .unwrap_or_else(|err| panic!("{version}: ingest of its own shape: {err}"));
        assert_eq!(ingested, 3);
        assert_eq!(catalog_rows(&catalog).await.data_files, rows, "{version}");

        // DuckLake's positional INSERT: the values in the version's order.
        let last = match version {
            DuckLakeVersion::V0_3 => "'partial_max:9', NULL",
            DuckLakeVersion::V1_0 => "NULL, 9",
            DuckLakeVersion::V1_1 => "NULL, 9, 2",
        };
        let insert = format!(
            "INSERT INTO ducklake_data_file VALUES (104, 7, 5, NULL, 4, 'ext/f4.parquet', \
             true, 'parquet', 40, 1004, 300, 30, NULL, NULL, {last})"
        );
        let inserted = client
            .execute_update(insert, None)
            .await
            .unwrap_or_else(|err| panic!("{version}: positional INSERT: {err}"));
        assert_eq!(inserted, 1);
        let fourth = DataFileRow {
            data_file_id: Some(104),
            table_id: Some(7),
            begin_snapshot: Some(5),
            file_order: Some(4),
            path: Some("ext/f4.parquet".into()),
            path_is_relative: Some(true),
            file_format: Some("parquet".into()),
            record_count: Some(40),
            file_size_bytes: Some(1004),
            footer_size: Some(300),
            row_id_start: Some(30),
            partial_file_info: (version == DuckLakeVersion::V0_3).then(|| "partial_max:9".into()),
            partial_max: (version >= DuckLakeVersion::V1_0).then_some(9),
            row_group_count: (version >= DuckLakeVersion::V1_1).then_some(2),
            ..DataFileRow::default()
        };
        let mut expected = rows.clone();
        expected.push(fourth);

        let (columns, served) = data_files(&source).await;
        assert_eq!(columns, names(version), "{version}: the version's columns");
        assert_eq!(served, text_of(&expected, version), "{version}");

        // Exported with the version's columns and recorded as such; imported into a
        // deployment of the same version, the same rows; into another, refused by name.
        let dir = tempfile::tempdir().expect("dir");
        let out = dir.path().join("export");
        succeeded(&export(&source.server_uri(), &out, &[]).await, "export");
        assert_eq!(manifest(&out).ducklake, version);
        let target = server(version).await;
        succeeded(&import(&target.0.server_uri(), &out, &[]).await, "import");
        assert_eq!(
            data_files(&target.0).await,
            (columns.clone(), served.clone())
        );
        let other = DuckLakeVersion::ALL
            .into_iter()
            .find(|v| *v != version)
            .expect("another version");
        let (elsewhere, elsewhere_catalog) = server(other).await;
        let refused = import(&elsewhere.server_uri(), &out, &[]).await;
        assert!(!refused.status.success(), "{version} into {other}");
        let message = stderr(&refused);
        assert!(
            message.contains(&format!("DuckLake {other}")),
            "{version} into {other}: {message}"
        );
        assert!(
            catalog_rows(&elsewhere_catalog).await.data_files.is_empty(),
            "{version} into {other}: nothing written"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_versions_shape_is_refused_naming_it_and_nothing_is_written() {
    for served in DuckLakeVersion::ALL {
        let (fixture, catalog) = server(served).await;
        let mut client = fixture.client().await;
        for shaped in DuckLakeVersion::ALL.into_iter().filter(|v| *v != served) {
            let err = put(
                &mut client,
                "ducklake_data_file",
                batch_of(&files(shaped), shaped),
                None,
            )
            .await
            .expect_err("another version's shape");
            assert_eq!(code_of(&err), Code::InvalidArgument, "{err}");
            let message = err.to_string();
            assert!(
                message.contains(&format!("DuckLake {served}")),
                "{shaped} into {served} names the served version: {message}"
            );
            // The first column of the other version the stream carries, or the first of
            // this version it lacks.
            let named = names(shaped)
                .into_iter()
                .find(|c| !served.has_data_file_column(c))
                .or_else(|| {
                    names(served)
                        .into_iter()
                        .find(|c| !shaped.has_data_file_column(c))
                })
                .expect("the shapes differ");
            assert!(
                message.contains(named),
                "{shaped} into {served} names {named}: {message}"
            );
        }
        assert!(
            catalog_rows(&catalog).await.data_files.is_empty(),
            "{served}: nothing written"
        );
    }
}

/// Every backend the version is recorded in.
fn backends() -> Vec<Backend> {
    vec![
        Backend::Memory,
        Backend::Redb,
        #[cfg(feature = "tikv")]
        Backend::Tikv,
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_keeps_the_version_of_its_first_start() {
    for backend in backends() {
        keeps_the_version_of_its_first_start(backend).await;
    }
}

async fn keeps_the_version_of_its_first_start(backend: Backend) {
    let store = backend.open().await;
    let catalog = store.catalog();
    assert_eq!(
        catalog
            .settle_ducklake(Some(DuckLakeVersion::V1_0))
            .await
            .ok(),
        Some(DuckLakeVersion::V1_0)
    );
    assert_eq!(
        catalog.settle_ducklake(None).await.ok(),
        Some(DuckLakeVersion::V1_0),
        "a start without the flag serves the recorded version"
    );
    let err = catalog
        .settle_ducklake(Some(DuckLakeVersion::V0_3))
        .await
        .expect_err("another version");
    let message = err.to_string();
    assert!(
        message.contains("DuckLake 1.0") && message.contains("0.3"),
        "{message}"
    );

    // A store written before versions were recorded holds 0.3's data files.
    let older = backend.open().await;
    let older_catalog = older.catalog();
    let mut batch = StagedBatch::new();
    batch.push(Op::Insert(Insert::data_files(&files(
        DuckLakeVersion::V0_3,
    ))));
    commit_batch(&older_catalog, &batch)
        .await
        .expect("files commit");
    let err = older_catalog
        .settle_ducklake(Some(DuckLakeVersion::V1_1))
        .await
        .expect_err("0.3's files served as 1.1");
    assert!(err.to_string().contains("0.3"), "{err}");
    assert_eq!(
        older_catalog.settle_ducklake(None).await.ok(),
        Some(DuckLakeVersion::V0_3)
    );
}
