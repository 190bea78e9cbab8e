//! The child-row fold (RFC 0018): `ducklake_name_mapping` rows grouped by `mapping_id`, each
//! group checked as the name rows of one mapping record. Name rows may arrive in any order,
//! interleaved across mappings; a record keeps them in `column_id` order.
//!
//! Pure: no I/O. Everything found wrong is pushed to the caller's violation list.

use std::collections::BTreeSet;

use datafusion::arrow::array::{BooleanArray, Int64Array, StringArray};

use crate::batch::name_mapping::{
    COLUMN_ID, IS_PARTITION, MAPPING_ID, PARENT_COLUMN, SOURCE_NAME, TARGET_FIELD_ID,
};
use crate::batch::{Columns, holds};
use crate::codec::NameRef;
use crate::model::Violation;

/// A name row owned, for rows that wait for their mapping or join names staged before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OwnedName {
    pub(crate) column_id: i64,
    pub(crate) source_name: String,
    pub(crate) target_field_id: i64,
    pub(crate) parent_column: Option<i64>,
    pub(crate) is_partition: bool,
}

impl OwnedName {
    pub(crate) fn of(name: &NameRef<'_>) -> Self {
        Self {
            column_id: name.column_id,
            source_name: name.source_name.to_owned(),
            target_field_id: name.target_field_id,
            parent_column: name.parent_column,
            is_partition: name.is_partition,
        }
    }

    pub(crate) fn as_ref(&self) -> NameRef<'_> {
        NameRef {
            column_id: self.column_id,
            source_name: &self.source_name,
            target_field_id: self.target_field_id,
            parent_column: self.parent_column,
            is_partition: self.is_partition,
        }
    }

    /// Bytes it holds, for memory accounting.
    pub(crate) fn size(&self) -> usize {
        std::mem::size_of::<Self>() + self.source_name.len()
    }
}

/// The columns of a canonical name batch, each taken once: a row is read from them without
/// a type check per value. Rows whose key columns are NULL read as 0 there; callers read
/// only rows they checked.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NameColumns<'a> {
    mapping_id: &'a [i64],
    column_id: &'a [i64],
    source_name: &'a StringArray,
    target_field_id: &'a [i64],
    parent_column: &'a Int64Array,
    is_partition: &'a BooleanArray,
}

impl<'a> NameColumns<'a> {
    /// The columns of `rows`; `None` when they are not a name batch's.
    pub(crate) fn new(rows: &Columns<'a>) -> Option<Self> {
        Some(Self {
            mapping_id: rows.int_array(MAPPING_ID)?.values(),
            column_id: rows.int_array(COLUMN_ID)?.values(),
            source_name: rows.text_array(SOURCE_NAME)?,
            target_field_id: rows.int_array(TARGET_FIELD_ID)?.values(),
            parent_column: rows.int_array(PARENT_COLUMN)?,
            is_partition: rows.boolean_array(IS_PARTITION)?,
        })
    }

    /// `mapping_id` of row `row`.
    #[inline]
    pub(crate) fn mapping_id(&self, row: usize) -> i64 {
        self.mapping_id.get(row).copied().unwrap_or_default()
    }

    /// `(mapping_id, column_id)` of row `row`: the order a record keeps its name rows in.
    #[inline]
    fn key(&self, row: usize) -> (i64, i64) {
        (
            self.mapping_id(row),
            self.column_id.get(row).copied().unwrap_or_default(),
        )
    }

    /// Row `row`, whose key columns are known not to be NULL.
    #[inline]
    pub(crate) fn at(&self, row: usize) -> NameRef<'a> {
        NameRef {
            column_id: self.column_id.get(row).copied().unwrap_or_default(),
            source_name: if holds(self.source_name, row) {
                self.source_name.value(row)
            } else {
                ""
            },
            target_field_id: self.target_field_id.get(row).copied().unwrap_or_default(),
            parent_column: holds(self.parent_column, row).then(|| self.parent_column.value(row)),
            is_partition: holds(self.is_partition, row) && self.is_partition.value(row),
        }
    }
}

/// The rows of `valid` grouped by `mapping_id`, each group in `column_id` order: the row
/// indices sorted by `(mapping_id, column_id)`, ties in arrival order. Rows that arrive
/// grouped and ordered (as DuckLake writes them) are not sorted again.
pub(crate) fn grouped(rows: &NameColumns<'_>, valid: &[u32]) -> Vec<u32> {
    let key = |row: u32| rows.key(row as usize);
    let mut order = valid.to_vec();
    if !order.windows(2).all(|w| match w {
        [a, b] => key(*a) <= key(*b),
        _ => true,
    }) {
        order.sort_by_key(|&row| (key(row), row));
    }
    order
}

/// Checks the name rows of mapping `mapping_id`, sorted by `column_id`. Final violations
/// (a repeated `column_id`, a parent not before its child) go to `violations`; a parent that
/// is none of the mapping's columns may still arrive and goes to `pending`. Returns whether
/// anything final was found.
pub(crate) fn check_names(
    mapping_id: i64,
    names: &[NameRef<'_>],
    violations: &mut Vec<Violation>,
    pending: &mut Vec<Violation>,
) -> bool {
    let before = violations.len();
    let mut reported = BTreeSet::new();
    for pair in names.windows(2) {
        if let [a, b] = pair
            && a.column_id == b.column_id
            && reported.insert(a.column_id)
        {
            violations.push(Violation::DuplicateColumnId {
                mapping_id,
                column_id: a.column_id,
            });
        }
    }
    for name in names {
        let Some(parent) = name.parent_column else {
            continue;
        };
        if parent >= name.column_id {
            violations.push(Violation::ParentNotBeforeChild {
                mapping_id,
                column_id: name.column_id,
                parent_column: parent,
            });
        } else if names
            .binary_search_by_key(&parent, |n| n.column_id)
            .is_err()
        {
            pending.push(Violation::ParentMissing {
                mapping_id,
                column_id: name.column_id,
                parent_column: parent,
            });
        }
    }
    violations.len() > before
}

#[cfg(test)]
mod tests;
