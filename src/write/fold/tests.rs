use proptest::prelude::*;

use super::super::{Insert, Op, Staging};
use super::*;
use crate::catalog::Catalog;
use crate::codec::{KeyPrefix, Keyspace};
use crate::kv::Store;
use crate::model::{
    CatalogTable, ColumnMapping, ColumnMappingRow, MappingId, NameMappingRow, TableId,
};

fn row(mapping_id: i64, column_id: i64, name: &str, parent: Option<i64>) -> NameMappingRow {
    NameMappingRow {
        mapping_id: Some(mapping_id),
        column_id: Some(column_id),
        source_name: Some(name.into()),
        target_field_id: Some(column_id + 100),
        parent_column: parent,
        is_partition: Some(false),
    }
}

/// Stages mapping 7 of table 1, then `rows`: the record as the transaction sees it (`None`
/// while it has no name row), the final violations, and those still pending.
fn fold(rows: &[NameMappingRow]) -> (Option<ColumnMapping>, Vec<Violation>, Vec<Violation>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let catalog = Catalog::new(Store::memory(), Keyspace::new(KeyPrefix::none()));
        let mut staging = Staging::new(catalog.snapshot().await.expect("snapshot"));
        let mut violations = Vec::new();
        let mapping = ColumnMappingRow {
            mapping_id: Some(7),
            table_id: Some(1),
            map_type: Some("map_by_name".into()),
        };
        for op in [
            Op::Insert(Insert::column_mappings(&[mapping])),
            Op::Insert(Insert::name_mappings(rows)),
        ] {
            staging.apply(&op, &mut violations).await.expect("staged");
        }
        let record = staging
            .view()
            .mapping(TableId(1), MappingId(7))
            .await
            .expect("read")
            .filter(|record| !record.names.is_empty());
        (record, violations, staging.pending())
    })
}

#[test]
fn rows_in_any_order_fold_into_column_order() {
    let rows = [
        row(7, 2, "b", Some(0)),
        row(7, 0, "s", None),
        row(7, 1, "a", Some(0)),
    ];
    let (record, violations, pending) = fold(&rows);
    assert_eq!((violations, pending), (vec![], vec![]));
    let record = record.expect("folded");
    let names: Vec<&str> = record
        .names
        .iter()
        .map(|n| n.source_name.as_str())
        .collect();
    assert_eq!(names, ["s", "a", "b"]);
}

#[test]
fn empty_group_is_rejected() {
    let (record, violations, pending) = fold(&[]);
    // Kept for a transaction's view (its name rows may come later); the violation blocks
    // the commit.
    assert_eq!(record, None);
    assert_eq!(violations, vec![]);
    assert_eq!(
        pending,
        vec![Violation::EmptyMapping {
            table_id: 1,
            mapping_id: 7
        }]
    );
}

#[test]
fn orphan_rows_are_reported_by_mapping() {
    let rows = [
        row(7, 0, "a", None),
        row(8, 0, "x", None),
        row(8, 1, "y", Some(0)),
    ];
    let (record, violations, pending) = fold(&rows);
    assert!(record.is_some());
    assert_eq!(violations, vec![]);
    assert_eq!(
        pending,
        vec![Violation::OrphanNameMappings {
            mapping_id: 8,
            rows: 2
        }]
    );
}

#[test]
fn duplicate_column_ids_are_reported_once_each() {
    let rows = [
        row(7, 0, "a", None),
        row(7, 1, "b", None),
        row(7, 1, "c", None),
        row(7, 1, "d", None),
        row(7, 0, "e", None),
    ];
    let (record, violations, _) = fold(&rows);
    assert_eq!(record, None);
    assert_eq!(
        violations,
        vec![
            Violation::DuplicateColumnId {
                mapping_id: 7,
                column_id: 0
            },
            Violation::DuplicateColumnId {
                mapping_id: 7,
                column_id: 1
            },
        ]
    );
}

#[test]
fn parent_at_or_after_child_is_rejected() {
    let rows = [
        row(7, 0, "a", Some(0)),
        row(7, 1, "b", Some(2)),
        row(7, 2, "c", None),
    ];
    let (record, violations, _) = fold(&rows);
    assert_eq!(record, None);
    assert_eq!(
        violations,
        vec![
            Violation::ParentNotBeforeChild {
                mapping_id: 7,
                column_id: 0,
                parent_column: 0
            },
            Violation::ParentNotBeforeChild {
                mapping_id: 7,
                column_id: 1,
                parent_column: 2
            },
        ]
    );
}

#[test]
fn gaps_in_column_ids_are_allowed_but_parents_must_exist() {
    let rows = [
        row(7, 0, "a", None),
        row(7, 5, "b", Some(0)),
        row(7, 9, "c", Some(3)),
    ];
    let (record, violations, pending) = fold(&rows);
    // A missing parent may still be staged: the record stays in the view, the violation
    // blocks the commit.
    assert_eq!(record.map(|r| r.names.len()), Some(3));
    assert_eq!(violations, vec![]);
    assert_eq!(
        pending,
        vec![Violation::ParentMissing {
            mapping_id: 7,
            column_id: 9,
            parent_column: 3
        }]
    );
    let (record, violations, pending) = fold(&rows[..2]);
    assert_eq!(
        (violations, pending),
        (vec![], vec![]),
        "column_id contiguity is not enforced"
    );
    assert_eq!(record.expect("folded").names.len(), 2);
}

#[test]
fn null_columns_name_the_column_and_position() {
    let mut bad = row(7, 1, "b", Some(0));
    bad.source_name = None;
    bad.is_partition = None;
    let mut no_parent_id = row(7, 2, "c", None);
    no_parent_id.mapping_id = None;
    let rows = [row(7, 0, "a", None), bad, no_parent_id];
    let (_, violations, _) = fold(&rows);
    assert_eq!(
        violations,
        vec![
            Violation::NullColumn {
                table: CatalogTable::NameMapping,
                column: "source_name",
                row: 1,
                row_id: Some(7)
            },
            Violation::NullColumn {
                table: CatalogTable::NameMapping,
                column: "is_partition",
                row: 1,
                row_id: Some(7)
            },
            Violation::NullColumn {
                table: CatalogTable::NameMapping,
                column: "mapping_id",
                row: 2,
                row_id: None
            },
        ]
    );
}

/// A random column tree in DuckLake's pre-order numbering: each node's parent is an earlier
/// node or none; partition columns are roots without children, appended last.
fn any_tree() -> impl Strategy<Value = Vec<NameMappingRow>> {
    (
        proptest::collection::vec(
            (
                any::<prop::sample::Index>(),
                any::<bool>(),
                "[a-zA-Z_é]{1,6}",
            ),
            1..40,
        ),
        0_usize..3,
        any::<u64>(),
    )
        .prop_map(|(nodes, partitions, seed)| {
            let mut rows: Vec<NameMappingRow> = Vec::new();
            for (i, (parent, root, name)) in nodes.into_iter().enumerate() {
                let id = i64::try_from(i).expect("small");
                let parent =
                    (i > 0 && !root).then(|| i64::try_from(parent.index(i)).expect("small"));
                rows.push(row(7, id, &name, parent));
            }
            for p in 0..partitions {
                let id = i64::try_from(rows.len()).expect("small");
                let mut part = row(7, id, &format!("part{p}"), None);
                part.is_partition = Some(true);
                rows.push(part);
            }
            // Arrive in a scrambled order.
            let mut order = seed;
            let len = rows.len();
            for i in (1..len).rev() {
                order = order
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1);
                rows.swap(i, usize::try_from(order % (i as u64 + 1)).expect("small"));
            }
            rows
        })
}

proptest! {
    #[test]
    fn fold_then_flat_map_gives_back_the_rows(rows in any_tree()) {
        let (record, violations, pending) = fold(&rows);
        prop_assert_eq!(violations, vec![]);
        prop_assert_eq!(pending, vec![]);
        let record = record.expect("folded");
        let mut expected = rows.clone();
        expected.sort_by_key(|r| r.column_id);
        let flat: Vec<NameMappingRow> = record.name_rows().collect();
        prop_assert_eq!(flat, expected);
        prop_assert_eq!(record.column_row().mapping_id, Some(7));
    }
}
