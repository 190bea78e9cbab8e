//! The child-row fold (RFC 0018): `ducklake_name_mapping` inserts are drained into groups by
//! `mapping_id`; each `ducklake_column_mapping` insert then consumes its group into one
//! [`ColumnMapping`] record. Name rows may arrive in any order, interleaved across mappings;
//! the record keeps them in `column_id` order.
//!
//! Pure: no I/O. Everything found wrong is pushed to the caller's violation list.

use std::collections::{BTreeMap, BTreeSet};

use super::validate::Violation;
use crate::model::{
    CatalogTable, ColumnId, ColumnMapping, FieldId, MappingId, NameMapping, NameMappingRow, TableId,
};

/// Name-mapping insert rows, grouped by `mapping_id`, waiting for their parent.
#[derive(Debug, Default)]
pub struct NameGroups {
    groups: BTreeMap<i64, Vec<(usize, NameMappingRow)>>,
}

impl NameGroups {
    /// Drains `rows` into groups. A row with a NULL `mapping_id` belongs to no group and is a
    /// violation; `first_row` is the position of `rows[0]` among the batch's name inserts.
    pub fn add(
        &mut self,
        rows: &[NameMappingRow],
        first_row: usize,
        violations: &mut Vec<Violation>,
    ) {
        for (offset, row) in rows.iter().enumerate() {
            match row.mapping_id {
                Some(mapping_id) => self
                    .groups
                    .entry(mapping_id)
                    .or_default()
                    .push((first_row + offset, row.clone())),
                None => violations.push(Violation::NullColumn {
                    table: CatalogTable::NameMapping,
                    column: "mapping_id",
                    row: first_row + offset,
                    row_id: None,
                }),
            }
        }
    }

    /// Takes the group of `mapping_id` (empty if none): each row with its position among the
    /// batch's name inserts.
    pub fn take(&mut self, mapping_id: i64) -> Vec<(usize, NameMappingRow)> {
        self.groups.remove(&mapping_id).unwrap_or_default()
    }

    /// The groups no column-mapping insert consumed, as violations.
    pub fn into_orphans(self) -> impl Iterator<Item = Violation> {
        self.groups
            .into_iter()
            .map(|(mapping_id, rows)| Violation::OrphanNameMappings {
                mapping_id,
                rows: rows.len(),
            })
    }
}

/// Folds one column-mapping insert and its name rows into a record, or reports why not.
/// Returns `None` when a violation no later change can mend was found for this mapping; with
/// only pending ones ([`Violation::is_pending`]) the record is returned for a transaction's
/// view, and the violations keep it from being committed.
pub fn fold_mapping(
    table_id: i64,
    mapping_id: i64,
    map_type: Option<String>,
    group: Vec<(usize, NameMappingRow)>,
    violations: &mut Vec<Violation>,
) -> Option<ColumnMapping> {
    let before = violations.len();
    if group.is_empty() {
        violations.push(Violation::EmptyMapping {
            table_id,
            mapping_id,
        });
    }
    let mut names = Vec::with_capacity(group.len());
    for (position, row) in group {
        if let Some(name) = name_of(mapping_id, position, row, violations) {
            names.push(name);
        }
    }
    names.sort_by_key(|name: &NameMapping| name.column_id);

    let mut seen = BTreeSet::new();
    let mut reported = BTreeSet::new();
    for name in &names {
        if !seen.insert(name.column_id) && reported.insert(name.column_id) {
            violations.push(Violation::DuplicateColumnId {
                mapping_id,
                column_id: name.column_id.0,
            });
        }
    }
    for name in &names {
        let Some(parent) = name.parent_column else {
            continue;
        };
        if parent >= name.column_id {
            violations.push(Violation::ParentNotBeforeChild {
                mapping_id,
                column_id: name.column_id.0,
                parent_column: parent.0,
            });
        } else if !seen.contains(&parent) {
            violations.push(Violation::ParentMissing {
                mapping_id,
                column_id: name.column_id.0,
                parent_column: parent.0,
            });
        }
    }
    // A mapping whose only faults a later change may mend stays in the batch's view (it is
    // never committed while they last).
    let pending_only = violations
        .get(before..)
        .is_some_and(|new| new.iter().all(Violation::is_pending));
    pending_only.then_some(ColumnMapping {
        mapping_id: MappingId(mapping_id),
        table_id: TableId(table_id),
        map_type,
        names,
    })
}

/// One name row as a record's name, or NULL-column violations.
fn name_of(
    mapping_id: i64,
    position: usize,
    row: NameMappingRow,
    violations: &mut Vec<Violation>,
) -> Option<NameMapping> {
    let mut null = |column| {
        violations.push(Violation::NullColumn {
            table: CatalogTable::NameMapping,
            column,
            row: position,
            row_id: Some(mapping_id),
        });
    };
    let column_id = row.column_id.or_else(|| {
        null("column_id");
        None
    });
    let source_name = row.source_name.or_else(|| {
        null("source_name");
        None
    });
    let target_field_id = row.target_field_id.or_else(|| {
        null("target_field_id");
        None
    });
    let is_partition = row.is_partition.or_else(|| {
        null("is_partition");
        None
    });
    Some(NameMapping {
        column_id: ColumnId(column_id?),
        source_name: source_name?,
        target_field_id: FieldId(target_field_id?),
        parent_column: row.parent_column.map(ColumnId),
        is_partition: is_partition?,
    })
}

#[cfg(test)]
mod tests;
