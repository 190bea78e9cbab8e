//! The staged write path on every backend: the fold, each validation, deletes, end
//! transitions, atomicity and concurrent creates, and a replay of real DuckLake commits.

use moraine::Error;
use moraine::catalog::Catalog;
use moraine::model::{
    CatalogTable, ColumnMappingRow, DataFileId, DataFileRow, MappingId, NameMappingRow, TableId,
};
use moraine::write::{
    Delete, EndTarget, Insert, Op, StagedBatch, Update, Violation, commit_batch, commit_batch_at,
};

use crate::ducklake_fixture;
use crate::harness::{Backend, CatalogRows, catalog_rows};

fn mapping(mapping_id: i64, table_id: i64) -> ColumnMappingRow {
    ColumnMappingRow {
        mapping_id: Some(mapping_id),
        table_id: Some(table_id),
        map_type: Some("map_by_name".into()),
    }
}

fn name(mapping_id: i64, column_id: i64, source: &str, parent: Option<i64>) -> NameMappingRow {
    NameMappingRow {
        mapping_id: Some(mapping_id),
        column_id: Some(column_id),
        source_name: Some(source.into()),
        target_field_id: Some(column_id + 1),
        parent_column: parent,
        is_partition: Some(false),
    }
}

fn file(data_file_id: i64, table_id: i64, mapping_id: Option<i64>) -> DataFileRow {
    DataFileRow {
        data_file_id: Some(data_file_id),
        table_id: Some(table_id),
        begin_snapshot: Some(2),
        path: Some(format!("/lake/ext/f{data_file_id}.parquet")),
        path_is_relative: Some(false),
        file_format: Some("parquet".into()),
        record_count: Some(10),
        file_size_bytes: Some(1000),
        footer_size: Some(100),
        row_id_start: Some(0),
        mapping_id,
        ..DataFileRow::default()
    }
}

/// A two-level mapping `(s (a, b), part)` of `table_id`.
fn tree(mapping_id: i64) -> Vec<NameMappingRow> {
    let mut part = name(mapping_id, 3, "part", None);
    part.is_partition = Some(true);
    vec![
        name(mapping_id, 0, "s", None),
        name(mapping_id, 1, "a", Some(0)),
        name(mapping_id, 2, "b", Some(0)),
        part,
    ]
}

fn batch(ops: impl IntoIterator<Item = Op>) -> StagedBatch {
    let mut batch = StagedBatch::new();
    for op in ops {
        batch.push(op);
    }
    batch
}

/// A DuckLake commit that adds mapping `mapping_id` of `table_id` and one file using it.
fn add_file_commit(mapping_id: i64, table_id: i64, data_file_id: i64) -> StagedBatch {
    batch([
        Op::Insert(Insert::column_mappings(&[mapping(mapping_id, table_id)])),
        Op::Insert(Insert::name_mappings(&tree(mapping_id))),
        Op::Insert(Insert::data_files(&[file(
            data_file_id,
            table_id,
            Some(mapping_id),
        )])),
    ])
}

async fn commit_ok(catalog: &Catalog, batch: &StagedBatch) -> Vec<u64> {
    commit_batch(catalog, batch)
        .await
        .unwrap_or_else(|err| panic!("commit failed: {err}"))
        .affected
}

/// Commits `batch`, expects a validation failure, checks that nothing changed, and returns
/// the violations.
async fn rejected(catalog: &Catalog, batch: &StagedBatch) -> Vec<Violation> {
    let before = catalog_rows(catalog).await;
    let err = commit_batch(catalog, batch)
        .await
        .expect_err("batch must be rejected");
    let after = catalog_rows(catalog).await;
    assert_eq!(before, after, "a rejected batch wrote something");
    match err {
        Error::Validation(err) => err.violations,
        other => panic!("expected a validation error, got {other}"),
    }
}

pub async fn happy_path_lands_one_record_and_the_files_mapping(backend: Backend) {
    let t = backend.open().await;
    let catalog = t.catalog();
    // Name rows interleaved across two mappings and out of order.
    let mut names = tree(5);
    names.extend(tree(6));
    names.reverse();
    let commit = batch([
        Op::Insert(Insert::column_mappings(&[mapping(5, 1), mapping(6, 2)])),
        Op::Insert(Insert::name_mappings(&names)),
        Op::Insert(Insert::data_files(&[
            file(7, 1, Some(5)),
            file(8, 2, Some(6)),
            file(9, 1, None),
        ])),
    ]);
    assert_eq!(commit_ok(&catalog, &commit).await, vec![2, 8, 3]);

    let rows = catalog_rows(&catalog).await;
    assert_eq!(rows.column_mappings, vec![mapping(5, 1), mapping(6, 2)]);
    let mut expected_names = tree(5);
    expected_names.extend(tree(6));
    assert_eq!(
        rows.name_mappings, expected_names,
        "stored in column_id order"
    );
    assert_eq!(
        rows.data_files,
        vec![file(7, 1, Some(5)), file(8, 2, Some(6)), file(9, 1, None)]
    );
    let snapshot = catalog.snapshot().await.expect("snapshot");
    let record = snapshot
        .mapping(TableId(1), MappingId(5))
        .await
        .expect("read");
    assert_eq!(
        record.expect("stored").names.len(),
        4,
        "one record holds all its name rows"
    );
}

pub async fn replays_real_ducklake_commits(backend: Backend) {
    let t = backend.open().await;
    let catalog = t.catalog();
    let steps = ducklake_fixture::steps();
    assert!(steps.len() >= 10, "fixture has its steps");
    for step in &steps {
        commit_ok(&catalog, &step.batch).await;
        assert_eq!(
            catalog_rows(&catalog).await,
            step.expected,
            "after step {}",
            step.name
        );
    }
    let last = catalog_rows(&catalog).await;
    let ids: Vec<i64> = last
        .column_mappings
        .iter()
        .filter_map(|m| m.mapping_id)
        .collect();
    assert_eq!(ids, vec![0, 3, 5, 7, 10, 13, 16]);
    let ended: Vec<(i64, Option<i64>)> = last
        .data_files
        .iter()
        .map(|f| (f.data_file_id.unwrap_or_default(), f.end_snapshot))
        .collect();
    assert!(
        ended.contains(&(2, Some(15))),
        "file 2 ended at snapshot 15: {ended:?}"
    );
}

pub async fn empty_mapping_is_rejected(backend: Backend) {
    let t = backend.open().await;
    let catalog = t.catalog();
    let commit = batch([Op::Insert(Insert::column_mappings(&[mapping(5, 1)]))]);
    assert_eq!(
        rejected(&catalog, &commit).await,
        vec![Violation::EmptyMapping {
            table_id: 1,
            mapping_id: 5
        }]
    );
}

pub async fn orphan_name_rows_are_rejected(backend: Backend) {
    let t = backend.open().await;
    let catalog = t.catalog();
    let commit = batch([Op::Insert(Insert::name_mappings(&tree(5)))]);
    assert_eq!(
        rejected(&catalog, &commit).await,
        vec![Violation::OrphanNameMappings {
            mapping_id: 5,
            rows: 4
        }]
    );
}

pub async fn duplicate_column_id_is_rejected(backend: Backend) {
    let t = backend.open().await;
    let catalog = t.catalog();
    let mut names = tree(5);
    names.push(name(5, 2, "again", Some(0)));
    let commit = batch([
        Op::Insert(Insert::column_mappings(&[mapping(5, 1)])),
        Op::Insert(Insert::name_mappings(&names)),
    ]);
    assert_eq!(
        rejected(&catalog, &commit).await,
        vec![Violation::DuplicateColumnId {
            mapping_id: 5,
            column_id: 2
        }]
    );
}

pub async fn parent_not_before_child_is_rejected(backend: Backend) {
    let t = backend.open().await;
    let catalog = t.catalog();
    let mut names = tree(5);
    names[1].parent_column = Some(1);
    let commit = batch([
        Op::Insert(Insert::column_mappings(&[mapping(5, 1)])),
        Op::Insert(Insert::name_mappings(&names)),
    ]);
    assert_eq!(
        rejected(&catalog, &commit).await,
        vec![Violation::ParentNotBeforeChild {
            mapping_id: 5,
            column_id: 1,
            parent_column: 1
        }]
    );
}

pub async fn existing_mapping_is_rejected(backend: Backend) {
    let t = backend.open().await;
    let catalog = t.catalog();
    commit_ok(&catalog, &add_file_commit(5, 1, 6)).await;
    let again = batch([
        Op::Insert(Insert::column_mappings(&[mapping(5, 1)])),
        Op::Insert(Insert::name_mappings(&tree(5))),
    ]);
    let violations = rejected(&catalog, &again).await;
    assert_eq!(
        violations,
        vec![Violation::MappingExists {
            table_id: 1,
            mapping_id: 5
        }]
    );
    assert!(
        violations[0].to_string().contains("conflict"),
        "DuckLake retries on 'conflict'"
    );
    // The same mapping id under another table is another key.
    let other_table = batch([
        Op::Insert(Insert::column_mappings(&[mapping(5, 2)])),
        Op::Insert(Insert::name_mappings(&tree(5))),
    ]);
    commit_ok(&catalog, &other_table).await;
}

pub async fn mapping_twice_in_one_batch_is_rejected(backend: Backend) {
    let t = backend.open().await;
    let catalog = t.catalog();
    let commit = batch([
        Op::Insert(Insert::column_mappings(&[mapping(5, 1), mapping(5, 1)])),
        Op::Insert(Insert::name_mappings(&tree(5))),
    ]);
    let violations = rejected(&catalog, &commit).await;
    assert!(
        violations.contains(&Violation::DuplicateMappingInBatch {
            table_id: 1,
            mapping_id: 5
        }),
        "{violations:?}"
    );
}

pub async fn data_file_must_reference_a_mapping_of_its_table(backend: Backend) {
    let t = backend.open().await;
    let catalog = t.catalog();
    commit_ok(&catalog, &add_file_commit(5, 1, 6)).await;
    let commit = batch([Op::Insert(Insert::data_files(&[
        file(7, 2, Some(5)),  // mapping 5 belongs to table 1
        file(8, 1, Some(99)), // no such mapping
        file(9, 1, Some(5)),  // fine
    ]))]);
    assert_eq!(
        rejected(&catalog, &commit).await,
        vec![
            Violation::UnknownMapping {
                data_file_id: 7,
                table_id: 2,
                mapping_id: 5
            },
            Violation::UnknownMapping {
                data_file_id: 8,
                table_id: 1,
                mapping_id: 99
            },
        ]
    );
    // A mapping deleted earlier in the same batch does not count.
    let commit = batch([
        Op::Delete(Delete::ColumnMappingsOfTables(vec![TableId(1)])),
        Op::Insert(Insert::data_files(&[file(9, 1, Some(5))])),
    ]);
    assert_eq!(
        rejected(&catalog, &commit).await,
        vec![Violation::UnknownMapping {
            data_file_id: 9,
            table_id: 1,
            mapping_id: 5
        }]
    );
}

pub async fn nulls_duckdb_never_writes_are_rejected(backend: Backend) {
    let t = backend.open().await;
    let catalog = t.catalog();
    let mut names = tree(5);
    names[2].target_field_id = None;
    let commit = batch([
        Op::Insert(Insert::column_mappings(&[
            mapping(5, 1),
            ColumnMappingRow {
                table_id: None,
                ..mapping(6, 1)
            },
        ])),
        Op::Insert(Insert::name_mappings(&names)),
        Op::Insert(Insert::name_mappings(&tree(6))),
        Op::Insert(Insert::data_files(&[
            DataFileRow {
                data_file_id: None,
                ..file(7, 1, None)
            },
            DataFileRow {
                table_id: None,
                ..file(8, 1, None)
            },
        ])),
    ]);
    assert_eq!(
        rejected(&catalog, &commit).await,
        // In the order the batch's changes were made.
        vec![
            Violation::NullColumn {
                table: CatalogTable::ColumnMapping,
                column: "table_id",
                row: 1,
                row_id: Some(6)
            },
            Violation::NullColumn {
                table: CatalogTable::NameMapping,
                column: "target_field_id",
                row: 2,
                row_id: Some(5)
            },
            Violation::NullColumn {
                table: CatalogTable::DataFile,
                column: "data_file_id",
                row: 0,
                row_id: None
            },
            Violation::NullColumn {
                table: CatalogTable::DataFile,
                column: "table_id",
                row: 1,
                row_id: Some(8)
            },
        ]
    );
    // NULL type and NULL optional data-file columns are stored verbatim.
    let commit = batch([
        Op::Insert(Insert::column_mappings(&[ColumnMappingRow {
            map_type: None,
            ..mapping(5, 1)
        }])),
        Op::Insert(Insert::name_mappings(&tree(5))),
        Op::Insert(Insert::data_files(&[DataFileRow {
            data_file_id: Some(7),
            table_id: Some(1),
            ..DataFileRow::default()
        }])),
    ]);
    commit_ok(&catalog, &commit).await;
    let rows = catalog_rows(&catalog).await;
    assert_eq!(rows.column_mappings[0].map_type, None);
    assert_eq!(rows.data_files[0].path, None);
}

pub async fn updates_of_mapping_tables_are_rejected(backend: Backend) {
    let t = backend.open().await;
    let catalog = t.catalog();
    commit_ok(&catalog, &add_file_commit(5, 1, 6)).await;
    let commit = batch([
        Op::Update(Update::MappingTable(CatalogTable::ColumnMapping)),
        Op::Update(Update::MappingTable(CatalogTable::NameMapping)),
        Op::Update(Update::OtherDataFileUpdate {
            description: "SET path = 'x'".into(),
        }),
    ]);
    let violations = rejected(&catalog, &commit).await;
    assert_eq!(
        violations[..2],
        [
            Violation::MappingUpdate {
                table: CatalogTable::ColumnMapping
            },
            Violation::MappingUpdate {
                table: CatalogTable::NameMapping
            },
        ]
    );
    assert!(
        matches!(&violations[2], Violation::UnsupportedDataFileUpdate { reason } if reason.contains("path"))
    );
}

pub async fn existing_data_file_is_rejected(backend: Backend) {
    let t = backend.open().await;
    let catalog = t.catalog();
    commit_ok(&catalog, &add_file_commit(5, 1, 6)).await;
    let commit = batch([Op::Insert(Insert::data_files(&[
        file(6, 2, None),
        file(7, 1, None),
        file(7, 1, None),
    ]))]);
    assert_eq!(
        rejected(&catalog, &commit).await,
        vec![
            Violation::DataFileExists { data_file_id: 6 },
            Violation::DuplicateDataFileInBatch { data_file_id: 7 },
        ]
    );
}

pub async fn one_bad_mapping_among_many_writes_nothing(backend: Backend) {
    let t = backend.open().await;
    let catalog = t.catalog();
    let mut maps = Vec::new();
    let mut names = Vec::new();
    let mut files = Vec::new();
    for i in 0..200 {
        let id = 2 * i;
        maps.push(mapping(id, 1 + i % 3));
        let mut rows = tree(id);
        if i == 137 || i == 150 {
            rows[3].parent_column = Some(7);
        }
        names.extend(rows);
        files.push(file(id + 1, 1 + i % 3, Some(id)));
    }
    let commit = batch([
        Op::Insert(Insert::column_mappings(&maps)),
        Op::Insert(Insert::name_mappings(&names)),
        Op::Insert(Insert::data_files(&files)),
    ]);
    let violations = rejected(&catalog, &commit).await;
    assert_eq!(
        violations,
        vec![
            Violation::ParentNotBeforeChild {
                mapping_id: 274,
                column_id: 3,
                parent_column: 7
            },
            Violation::ParentNotBeforeChild {
                mapping_id: 300,
                column_id: 3,
                parent_column: 7
            },
            Violation::UnknownMapping {
                data_file_id: 275,
                table_id: 3,
                mapping_id: 274
            },
            Violation::UnknownMapping {
                data_file_id: 301,
                table_id: 1,
                mapping_id: 300
            },
        ],
        "every violation of the batch, together"
    );
    assert_eq!(catalog_rows(&catalog).await, CatalogRows::default());
}

pub async fn per_table_delete_removes_exactly_that_tables_mappings(backend: Backend) {
    let t = backend.open().await;
    let catalog = t.catalog();
    for (mapping_id, table_id) in [(1, 1), (3, 2), (5, 2), (7, 3), (9, -2)] {
        commit_ok(
            &catalog,
            &add_file_commit(mapping_id, table_id, mapping_id + 1),
        )
        .await;
    }
    let expire = batch([
        Op::Delete(Delete::DataFilesOfTables(vec![TableId(2), TableId(-2)])),
        Op::Delete(Delete::ColumnMappingsOfTables(vec![
            TableId(2),
            TableId(-2),
            TableId(40),
        ])),
        Op::Delete(Delete::OrphanNameMappings),
    ]);
    assert_eq!(commit_ok(&catalog, &expire).await, vec![3, 3, 0]);
    let rows = catalog_rows(&catalog).await;
    assert_eq!(rows.column_mappings, vec![mapping(1, 1), mapping(7, 3)]);
    let mut names = tree(1);
    names.extend(tree(7));
    assert_eq!(
        rows.name_mappings, names,
        "name rows went with their mapping"
    );
    assert_eq!(
        rows.data_files,
        vec![file(2, 1, Some(1)), file(8, 3, Some(7))]
    );

    // The sweep arriving in a later batch is a no-op too.
    let sweep = batch([Op::Delete(Delete::OrphanNameMappings)]);
    assert_eq!(commit_ok(&catalog, &sweep).await, vec![0]);
    assert_eq!(catalog_rows(&catalog).await, rows);
    // A name-row delete of mappings already gone is accepted.
    let late = batch([Op::Delete(Delete::NameMappings(vec![
        MappingId(3),
        MappingId(5),
    ]))]);
    assert_eq!(commit_ok(&catalog, &late).await, vec![0]);
    // The deleted mapping ids can be created again.
    commit_ok(&catalog, &add_file_commit(3, 2, 4)).await;
}

pub async fn name_row_delete_of_a_live_mapping_is_rejected(backend: Backend) {
    let t = backend.open().await;
    let catalog = t.catalog();
    commit_ok(&catalog, &add_file_commit(5, 1, 6)).await;
    let commit = batch([Op::Delete(Delete::NameMappings(vec![
        MappingId(5),
        MappingId(77),
    ]))]);
    assert_eq!(
        rejected(&catalog, &commit).await,
        vec![Violation::LiveNameMappingDelete {
            table_id: 1,
            mapping_id: 5
        }]
    );
    // In the same batch after the parent's delete, it is accepted.
    let commit = batch([
        Op::Delete(Delete::ColumnMappings(vec![MappingId(5)])),
        Op::Delete(Delete::NameMappings(vec![MappingId(5)])),
    ]);
    assert_eq!(commit_ok(&catalog, &commit).await, vec![1, 0]);
    assert!(catalog_rows(&catalog).await.column_mappings.is_empty());
}

pub async fn end_transition_and_hard_deletes_of_data_files(backend: Backend) {
    let t = backend.open().await;
    let catalog = t.catalog();
    let mut files: Vec<DataFileRow> = (10..20).map(|id| file(id, 1 + id % 2, None)).collect();
    files[0].end_snapshot = Some(3); // already ended: the transition leaves it alone
    commit_ok(
        &catalog,
        &batch([Op::Insert(Insert::data_files(&files.clone()))]),
    )
    .await;

    let end = batch([
        Op::Update(Update::EndDataFiles {
            end_snapshot: 9,
            target: EndTarget::DataFiles(vec![DataFileId(10), DataFileId(12), DataFileId(99)]),
        }),
        Op::Update(Update::EndDataFiles {
            end_snapshot: 10,
            target: EndTarget::Tables(vec![TableId(2)]),
        }),
    ]);
    assert_eq!(commit_ok(&catalog, &end).await, vec![1, 5]);
    let ends: Vec<(i64, Option<i64>)> = catalog_rows(&catalog)
        .await
        .data_files
        .iter()
        .map(|f| (f.data_file_id.unwrap_or_default(), f.end_snapshot))
        .collect();
    assert_eq!(
        ends,
        vec![
            (10, Some(3)),
            (11, Some(10)),
            (12, Some(9)),
            (13, Some(10)),
            (14, None),
            (15, Some(10)),
            (16, None),
            (17, Some(10)),
            (18, None),
            (19, Some(10)),
        ]
    );

    let delete = batch([
        Op::Delete(Delete::DataFiles(vec![
            DataFileId(10),
            DataFileId(11),
            DataFileId(55),
        ])),
        Op::Delete(Delete::DataFileIdRange(15..=17)),
    ]);
    assert_eq!(commit_ok(&catalog, &delete).await, vec![2, 3]);
    let left: Vec<i64> = catalog_rows(&catalog)
        .await
        .data_files
        .iter()
        .filter_map(|f| f.data_file_id)
        .collect();
    assert_eq!(left, vec![12, 13, 14, 18, 19]);
    // A deleted id is free again; the index forgot it too.
    commit_ok(
        &catalog,
        &batch([Op::Insert(Insert::data_files(&[file(10, 2, None)]))]),
    )
    .await;
}

pub async fn concurrent_creates_have_one_winner_per_key(backend: Backend) {
    let t = backend.open().await;
    let catalog = t.catalog();
    // 12 writers; writer w creates mappings {w % 4, (w + 1) % 4} of table 1, so every key is
    // contested by several writers.
    let tasks: Vec<_> = (0..12_i64)
        .map(|writer| {
            let catalog = catalog.clone();
            tokio::spawn(async move {
                let ids = [writer % 4 * 10, (writer + 1) % 4 * 10];
                let mut names = Vec::new();
                for id in ids {
                    let mut rows = tree(id);
                    rows[0].source_name = Some(format!("writer{writer}"));
                    names.extend(rows);
                }
                let commit = batch([
                    Op::Insert(Insert::column_mappings(
                        &ids.iter().map(|id| mapping(*id, 1)).collect::<Vec<_>>(),
                    )),
                    Op::Insert(Insert::name_mappings(&names)),
                ]);
                (writer, ids, commit_batch(&catalog, &commit).await)
            })
        })
        .collect();
    let mut winners = Vec::new();
    for task in tasks {
        let (writer, ids, result) = task.await.expect("task");
        match result {
            Ok(_) => winners.push((writer, ids)),
            Err(err) => {
                let text = err.to_string();
                assert!(
                    text.contains("conflict"),
                    "loser's error must say conflict: {text}"
                );
                assert!(
                    matches!(&err, Error::CommitConflict { .. })
                        || matches!(&err, Error::Validation(v) if v.violations.iter().all(Violation::is_already_exists)),
                    "unexpected error {err}"
                );
            }
        }
    }
    let rows = catalog_rows(&catalog).await;
    let mut owner = std::collections::BTreeMap::new();
    for (writer, ids) in &winners {
        for id in ids {
            assert!(
                owner.insert(*id, *writer).is_none(),
                "mapping {id} won twice"
            );
        }
    }
    let stored: Vec<(i64, String)> = rows
        .name_mappings
        .iter()
        .filter(|n| n.column_id == Some(0))
        .map(|n| {
            (
                n.mapping_id.unwrap_or_default(),
                n.source_name.clone().unwrap_or_default(),
            )
        })
        .collect();
    let expected: Vec<(i64, String)> = owner
        .iter()
        .map(|(id, writer)| (*id, format!("writer{writer}")))
        .collect();
    assert_eq!(
        stored, expected,
        "the stored records are exactly the winners'"
    );
    assert!(!winners.is_empty());
}

/// Commits `batch` as a transaction that read `snapshot` would, and expects it to lose a
/// race: ABORTED-class, "conflict" in its text, naming `what`, and nothing written.
async fn loses_race(
    catalog: &Catalog,
    snapshot: &moraine::catalog::CatalogSnapshot,
    batch: &StagedBatch,
    what: &str,
) {
    let before = catalog_rows(catalog).await;
    let err = commit_batch_at(catalog, snapshot, batch)
        .await
        .expect_err("the later commit must lose");
    assert!(matches!(err, Error::CommitConflict { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("conflict") && text.contains(what), "{text}");
    assert_eq!(
        catalog_rows(catalog).await,
        before,
        "the loser wrote something"
    );
}

/// Commits every batch of `works` at once, each as a transaction that read `snapshot` would,
/// and returns the positions of those that committed, in order.
async fn race(
    catalog: &Catalog,
    snapshot: &moraine::catalog::CatalogSnapshot,
    works: Vec<StagedBatch>,
) -> Vec<usize> {
    let tasks: Vec<_> = works
        .into_iter()
        .map(|work| {
            let (catalog, snapshot) = (catalog.clone(), snapshot.clone());
            tokio::spawn(async move { commit_batch_at(&catalog, &snapshot, &work).await.is_ok() })
        })
        .collect();
    let mut winners = Vec::new();
    for (at, task) in tasks.into_iter().enumerate() {
        if task.await.expect("task") {
            winners.push(at);
        }
    }
    winners
}

fn end_files(end_snapshot: i64, ids: &[i64]) -> StagedBatch {
    batch([Op::Update(Update::EndDataFiles {
        end_snapshot,
        target: EndTarget::DataFiles(ids.iter().copied().map(DataFileId).collect()),
    })])
}

fn drop_table(end_snapshot: i64, table_id: i64) -> StagedBatch {
    batch([Op::Update(Update::EndDataFiles {
        end_snapshot,
        target: EndTarget::Tables(vec![TableId(table_id)]),
    })])
}

/// The live files, `(table_id, data_file_id)`, sorted.
fn live_files(rows: &CatalogRows) -> Vec<(i64, i64)> {
    let mut live: Vec<(i64, i64)> = rows
        .data_files
        .iter()
        .filter(|f| f.end_snapshot.is_none())
        .map(|f| {
            (
                f.table_id.unwrap_or_default(),
                f.data_file_id.unwrap_or_default(),
            )
        })
        .collect();
    live.sort_unstable();
    live
}

/// Two transactions that end the same file: the later commit is told the file changed,
/// instead of overwriting the first one's `end_snapshot` (a lost update).
pub async fn concurrent_ends_of_one_file_have_one_winner(backend: Backend) {
    let t = backend.open().await;
    let catalog = t.catalog();
    let files = [file(10, 1, None), file(11, 1, None)];
    commit_ok(&catalog, &batch([Op::Insert(Insert::data_files(&files))])).await;
    let read = catalog.snapshot().await.expect("snapshot");
    commit_ok(&catalog, &end_files(5, &[10])).await;
    loses_race(
        &catalog,
        &read,
        &end_files(6, &[10, 11]),
        "data file 10 of table 1 was changed concurrently",
    )
    .await;
    // A delete of what it read loses the same way.
    loses_race(
        &catalog,
        &read,
        &batch([Op::Delete(Delete::DataFiles(vec![DataFileId(10)]))]),
        "data file 10 of table 1 was changed concurrently",
    )
    .await;
    let ends: Vec<Option<i64>> = catalog_rows(&catalog)
        .await
        .data_files
        .iter()
        .map(|f| f.end_snapshot)
        .collect();
    assert_eq!(ends, vec![Some(5), None]);
    // Ending an id the transaction did not find conflicts with its concurrent insert.
    let read = catalog.snapshot().await.expect("snapshot");
    commit_ok(
        &catalog,
        &batch([Op::Insert(Insert::data_files(&[file(12, 2, None)]))]),
    )
    .await;
    loses_race(&catalog, &read, &end_files(7, &[12]), "data file 12").await;
}

/// `data_file_id` is DuckLake's primary key across all tables: two transactions inserting one
/// id into two tables cannot both commit, nor can one whose id another table took after its
/// snapshot.
pub async fn a_data_file_id_is_unique_across_tables(backend: Backend) {
    let t = backend.open().await;
    let catalog = t.catalog();
    let read = catalog.snapshot().await.expect("snapshot");
    commit_ok(
        &catalog,
        &batch([Op::Insert(Insert::data_files(&[file(7, 1, None)]))]),
    )
    .await;
    loses_race(
        &catalog,
        &read,
        &batch([Op::Insert(Insert::data_files(&[file(7, 2, None)]))]),
        "data file 7 was created concurrently",
    )
    .await;
    // Read after the first commit, the id is refused before any commit is tried.
    let violations = rejected(
        &catalog,
        &batch([Op::Insert(Insert::data_files(&[file(7, 3, None)]))]),
    )
    .await;
    assert_eq!(
        violations,
        vec![Violation::DataFileExists { data_file_id: 7 }]
    );
    // Concurrently, from a common snapshot: exactly one table gets the id.
    let read = catalog.snapshot().await.expect("snapshot");
    let inserts = (1..=8_i64)
        .map(|table| batch([Op::Insert(Insert::data_files(&[file(8, table, None)]))]))
        .collect();
    assert_eq!(
        race(&catalog, &read, inserts).await.len(),
        1,
        "one table gets data file 8"
    );
    let eights = catalog_rows(&catalog)
        .await
        .data_files
        .iter()
        .filter(|f| f.data_file_id == Some(8))
        .count();
    assert_eq!(eights, 1);
}

/// DROP TABLE's end of every file of a table and an insert into that table: whichever commits
/// first, the other loses, so no file stays live in a dropped table.
pub async fn a_table_drop_and_an_insert_into_it_never_both_commit(backend: Backend) {
    let t = backend.open().await;
    let catalog = t.catalog();
    let add = |id| batch([Op::Insert(Insert::data_files(&[file(id, 1, None)]))]);
    commit_ok(&catalog, &add(1)).await;
    commit_ok(
        &catalog,
        &batch([Op::Insert(Insert::data_files(&[file(2, 9, None)]))]),
    )
    .await;

    // The insert first: the drop's range changed under it.
    let read = catalog.snapshot().await.expect("snapshot");
    commit_ok(&catalog, &add(3)).await;
    loses_race(
        &catalog,
        &read,
        &drop_table(5, 1),
        "the data files of table 1 changed concurrently",
    )
    .await;
    assert_eq!(
        live_files(&catalog_rows(&catalog).await),
        vec![(1, 1), (1, 3), (9, 2)]
    );

    // The drop first: the insert's table was acted on whole since it read it.
    let read = catalog.snapshot().await.expect("snapshot");
    commit_ok(&catalog, &drop_table(6, 1)).await;
    loses_race(
        &catalog,
        &read,
        &add(4),
        "the data files of table 1 changed concurrently",
    )
    .await;
    // Another table's inserts are not held up, and a fresh transaction may insert again.
    commit_ok(
        &catalog,
        &batch([Op::Insert(Insert::data_files(&[file(5, 9, None)]))]),
    )
    .await;
    commit_ok(&catalog, &add(4)).await;
    assert_eq!(
        live_files(&catalog_rows(&catalog).await),
        vec![(1, 4), (9, 2), (9, 5)]
    );

    // Racing from one snapshot: a drop and inserts into the dropped table never both land.
    let read = catalog.snapshot().await.expect("snapshot");
    let works = (0..8_i64)
        .map(|writer| {
            if writer == 3 {
                drop_table(7, 1)
            } else {
                add(100 + writer)
            }
        })
        .collect();
    let winners = race(&catalog, &read, works).await;
    let live = live_files(&catalog_rows(&catalog).await);
    if winners.contains(&3) {
        assert_eq!(winners, vec![3], "inserts landed beside the drop");
        assert_eq!(live, vec![(9, 2), (9, 5)]);
    } else {
        assert!(!winners.is_empty());
        assert_eq!(
            live.iter().filter(|(table, _)| *table == 1).count(),
            1 + winners.len()
        );
    }
}

/// A delete of a range of data-file ids and an insert of an id in that range: whichever
/// commits first, the other loses, whatever table the insert goes to (one the delete found
/// no file of, one without any file yet), so no file in the range outlives the delete
/// unseen. On TiKV this holds although the two write no common row key.
pub async fn an_id_range_delete_and_an_insert_into_its_range_never_both_commit(backend: Backend) {
    let t = backend.open().await;
    let catalog = t.catalog();
    let add = |id, table| batch([Op::Insert(Insert::data_files(&[file(id, table, None)]))]);
    let delete =
        |ids: std::ops::RangeInclusive<i64>| batch([Op::Delete(Delete::DataFileIdRange(ids))]);
    commit_ok(&catalog, &add(1, 1)).await;
    commit_ok(&catalog, &add(200, 9)).await;

    // The delete first: an insert from before it loses, into a table the delete found no
    // file of and into a table without files alike.
    let read = catalog.snapshot().await.expect("snapshot");
    commit_ok(&catalog, &delete(1..=100)).await;
    loses_race(
        &catalog,
        &read,
        &add(50, 9),
        "the data files of table 9 changed concurrently",
    )
    .await;
    loses_race(
        &catalog,
        &read,
        &add(51, 33),
        "the data files of the catalog's tables changed concurrently",
    )
    .await;
    // A fresh transaction may insert there, and inserts into new tables do not collide.
    let read = catalog.snapshot().await.expect("snapshot");
    commit_batch_at(&catalog, &read, &add(50, 9))
        .await
        .expect("insert into table 9");
    commit_batch_at(&catalog, &read, &add(51, 33))
        .await
        .expect("insert into new table 33");
    commit_batch_at(&catalog, &read, &add(52, 34))
        .await
        .expect("insert into new table 34 beside the one into 33");
    // Nor do two first inserts into one new table.
    commit_batch_at(&catalog, &read, &add(53, 35))
        .await
        .expect("first insert into new table 35");
    commit_batch_at(&catalog, &read, &add(54, 35))
        .await
        .expect("another first insert into table 35");

    // The insert first: the delete's range changed under it, or the set of tables did.
    let read = catalog.snapshot().await.expect("snapshot");
    commit_ok(&catalog, &add(60, 9)).await;
    loses_race(
        &catalog,
        &read,
        &delete(1..=100),
        "the data files with ids from 1 on changed concurrently",
    )
    .await;
    let read = catalog.snapshot().await.expect("snapshot");
    commit_ok(&catalog, &add(61, 44)).await;
    loses_race(
        &catalog,
        &read,
        &delete(1..=100),
        "the data files of the catalog's tables changed concurrently",
    )
    .await;
    assert_eq!(
        live_files(&catalog_rows(&catalog).await),
        vec![
            (9, 50),
            (9, 60),
            (9, 200),
            (33, 51),
            (34, 52),
            (35, 53),
            (35, 54),
            (44, 61)
        ]
    );

    a_range_delete_races_inserts_into_its_range(&catalog).await;
}

/// From one snapshot, a delete of ids `1..=150` and inserts of ids in that range, into a
/// table with files and into new ones: the delete and an insert never both land.
async fn a_range_delete_races_inserts_into_its_range(catalog: &Catalog) {
    let add = |id, table| batch([Op::Insert(Insert::data_files(&[file(id, table, None)]))]);
    let delete = batch([Op::Delete(Delete::DataFileIdRange(1..=150))]);
    let before = live_files(&catalog_rows(catalog).await);
    let read = catalog.snapshot().await.expect("snapshot");
    let works = (0..8_i64)
        .map(|writer| match writer {
            3 => delete.clone(),
            _ if writer % 2 == 0 => add(100 + writer, 9),
            _ => add(100 + writer, 70 + writer),
        })
        .collect();
    let winners = race(catalog, &read, works).await;
    let live = live_files(&catalog_rows(catalog).await);
    if winners.contains(&3) {
        assert_eq!(winners, vec![3], "inserts landed beside the range delete");
        let kept: Vec<(i64, i64)> = before.into_iter().filter(|(_, id)| *id > 150).collect();
        assert_eq!(live, kept);
    } else {
        assert!(!winners.is_empty());
        for writer in &winners {
            let file = 100 + i64::try_from(*writer).expect("a small number");
            assert!(
                live.iter().any(|(_, id)| *id == file),
                "writer {writer} won but its file is not there: {live:?}"
            );
        }
    }
}

/// On TiKV, the race the range requirement alone does not catch: an id-range delete has read
/// its requirements and is held at its prewrite while an insert of an id in its range, into
/// a table the delete found no file of, commits. The delete moves on that table's guard,
/// which the insert depends on, so its prewrite conflicts, its retry finds the range changed,
/// and nothing of it is written.
#[cfg(feature = "tikv")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_tikv_an_id_range_delete_loses_to_an_insert_committed_during_its_commit() {
    use crate::fake_tikv::{Fault, Gate, Rpc};

    let t = Backend::Tikv.open().await;
    let Some(cluster) = t.cluster() else {
        // A real cluster (PD_ADDRS) cannot hold an RPC.
        return;
    };
    let catalog = t.catalog();
    let add = |id, table| batch([Op::Insert(Insert::data_files(&[file(id, table, None)]))]);
    commit_ok(&catalog, &add(1, 1)).await;
    commit_ok(&catalog, &add(200, 9)).await;
    let gate = Gate::new();
    cluster.arm(Rpc::Prewrite, Fault::Hold(gate.clone()));
    let deleting = tokio::spawn({
        let catalog = catalog.clone();
        async move {
            commit_batch(
                &catalog,
                &batch([Op::Delete(Delete::DataFileIdRange(1..=100))]),
            )
            .await
        }
    });
    gate.arrived().await;
    commit_ok(&catalog, &add(50, 9)).await;
    gate.open();
    let err = deleting
        .await
        .expect("task")
        .expect_err("the delete must lose to the insert it did not see");
    assert!(matches!(err, Error::CommitConflict { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("the data files with ids from 1 on changed concurrently"),
        "{err}"
    );
    assert_eq!(
        live_files(&catalog_rows(&catalog).await),
        vec![(1, 1), (9, 50), (9, 200)]
    );
}

/// A store whose data-file index has the first layout (one entry per `(data_file_id,
/// table_id)`) is moved to the unique one when it is opened; a store in which two tables hold
/// one id is refused, naming it.
pub async fn an_old_data_file_index_is_upgraded(backend: Backend) {
    use moraine::codec::Kind;
    use moraine::kv::{CommitOutcome, WriteSet};

    let t = backend.open().await;
    let catalog = t.catalog();
    let keyspace = catalog.keyspace().clone();
    let files: Vec<DataFileRow> = (1..=3).map(|id| file(id, 10 + id, None)).collect();
    commit_ok(&catalog, &batch([Op::Insert(Insert::data_files(&files))])).await;
    // Rewrite the index as an earlier moraine wrote it.
    let old_layout = |entries: &[(i64, i64)]| {
        let mut writes = WriteSet::new();
        for &(id, table) in entries {
            writes
                .delete(keyspace.row_key(Kind::DataFileById, TableId(table), id))
                .put(
                    keyspace.row_key(Kind::DataFileByIdV1, TableId(table), id),
                    Vec::new(),
                );
        }
        writes
    };
    let committed = catalog
        .store()
        .commit(old_layout(&[(1, 11), (2, 12), (3, 13)]))
        .await
        .expect("commit");
    assert_eq!(committed, CommitOutcome::Committed);
    assert_eq!(catalog.upgrade().await.expect("upgrade"), 3);
    assert_eq!(catalog.upgrade().await.expect("nothing left"), 0);
    // The index answers again: by id, and for uniqueness.
    let snapshot = catalog.snapshot().await.expect("snapshot");
    let rows = snapshot
        .index_rows(Kind::DataFileById, &[1, 2, 3])
        .await
        .expect("index");
    let found: Vec<(i64, i64)> = rows.iter().map(|r| (r.id, r.table_id.0)).collect();
    assert_eq!(found, vec![(1, 11), (2, 12), (3, 13)]);
    let violations = rejected(
        &catalog,
        &batch([Op::Insert(Insert::data_files(&[file(2, 99, None)]))]),
    )
    .await;
    assert_eq!(
        violations,
        vec![Violation::DataFileExists { data_file_id: 2 }]
    );
    assert_eq!(
        commit_ok(&catalog, &end_files(4, &[1, 3])).await,
        vec![2],
        "ends by id find the files through the upgraded index"
    );

    // Two tables holding one id cannot be made unique: refused, naming the id and tables.
    let mut twice = WriteSet::new();
    for table in [21, 22] {
        twice.put(
            keyspace.row_key(Kind::DataFileByIdV1, TableId(table), 7),
            Vec::new(),
        );
    }
    let committed = catalog.store().commit(twice).await.expect("commit");
    assert_eq!(committed, CommitOutcome::Committed);
    let err = catalog.upgrade().await.expect_err("duplicate id");
    let text = err.to_string();
    assert!(
        text.contains("data_file_id 7") && text.contains("21") && text.contains("22"),
        "{text}"
    );
}

macro_rules! write_path_suite {
    ($($backend:ident),*) => {
        $(
            #[allow(non_snake_case)]
            mod $backend {
                write_path_suite!(@tests $backend:
                    happy_path_lands_one_record_and_the_files_mapping,
                    replays_real_ducklake_commits,
                    empty_mapping_is_rejected,
                    orphan_name_rows_are_rejected,
                    duplicate_column_id_is_rejected,
                    parent_not_before_child_is_rejected,
                    existing_mapping_is_rejected,
                    mapping_twice_in_one_batch_is_rejected,
                    data_file_must_reference_a_mapping_of_its_table,
                    nulls_duckdb_never_writes_are_rejected,
                    updates_of_mapping_tables_are_rejected,
                    existing_data_file_is_rejected,
                    one_bad_mapping_among_many_writes_nothing,
                    per_table_delete_removes_exactly_that_tables_mappings,
                    name_row_delete_of_a_live_mapping_is_rejected,
                    end_transition_and_hard_deletes_of_data_files,
                    concurrent_creates_have_one_winner_per_key,
                    concurrent_ends_of_one_file_have_one_winner,
                    a_data_file_id_is_unique_across_tables,
                    a_table_drop_and_an_insert_into_it_never_both_commit,
                    an_id_range_delete_and_an_insert_into_its_range_never_both_commit,
                    an_old_data_file_index_is_upgraded,
                );
            }
        )*
    };
    (@tests $backend:ident: $($test:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                super::$test(crate::harness::Backend::$backend).await;
            }
        )*
    };
}

write_path_suite!(Memory, Redb);
#[cfg(feature = "tikv")]
write_path_suite!(Tikv);
