//! Filters the scan answers itself: comparisons of the key columns with integer literals.
//!
//! `table_id` is the first key component, so a set of table ids is a set of key ranges;
//! `mapping_id` and `data_file_id` have id indexes, so a set of them is a set of index ranges.
//! A filter is declared `Exact` only when the scan alone returns exactly the rows it admits;
//! anything else stays with DataFusion (`Unsupported`).

use std::ops::RangeInclusive;

use datafusion::common::ScalarValue;
use datafusion::logical_expr::{BinaryExpr, Expr, Operator};

use crate::model::CatalogTable;

/// A set of ids: sorted, disjoint, non-adjacent inclusive ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdSet(Vec<RangeInclusive<i64>>);

impl IdSet {
    /// Every id.
    #[must_use]
    pub fn all() -> Self {
        IdSet(vec![i64::MIN..=i64::MAX])
    }

    /// The one id `id`.
    #[must_use]
    pub fn single(id: i64) -> Self {
        IdSet(vec![id..=id])
    }

    /// The ids `range`.
    #[must_use]
    pub fn range(range: RangeInclusive<i64>) -> Self {
        IdSet::from_ranges(vec![range])
    }

    /// The ids `ids`.
    #[must_use]
    pub fn of(ids: &[i64]) -> Self {
        IdSet::from_ranges(ids.iter().map(|&id| id..=id).collect())
    }

    fn from_ranges(mut ranges: Vec<RangeInclusive<i64>>) -> Self {
        ranges.retain(|r| r.start() <= r.end());
        ranges.sort_by_key(|r| *r.start());
        let mut out: Vec<RangeInclusive<i64>> = Vec::with_capacity(ranges.len());
        for range in ranges {
            match out.last_mut() {
                Some(last) if last.end().saturating_add(1) >= *range.start() => {
                    *last = *last.start()..=(*last.end()).max(*range.end());
                }
                _ => out.push(range),
            }
        }
        IdSet(out)
    }

    fn union(&self, other: &IdSet) -> IdSet {
        IdSet::from_ranges(self.0.iter().chain(&other.0).cloned().collect())
    }

    fn intersect(&self, other: &IdSet) -> IdSet {
        let mut out = Vec::new();
        for a in &self.0 {
            for b in &other.0 {
                let lo = (*a.start()).max(*b.start());
                let hi = (*a.end()).min(*b.end());
                if lo <= hi {
                    out.push(lo..=hi);
                }
            }
        }
        IdSet::from_ranges(out)
    }

    /// The ranges.
    #[must_use]
    pub fn ranges(&self) -> &[RangeInclusive<i64>] {
        &self.0
    }

    /// Whether `id` is in the set.
    #[must_use]
    pub fn contains(&self, id: i64) -> bool {
        // The ranges are sorted and disjoint: the last one starting at or before `id`.
        let at = self.0.partition_point(|r| *r.start() <= id);
        at.checked_sub(1)
            .and_then(|i| self.0.get(i))
            .is_some_and(|r| r.contains(&id))
    }

    /// Whether the set holds every id.
    #[must_use]
    pub fn is_all(&self) -> bool {
        matches!(self.0.as_slice(), [r] if *r.start() == i64::MIN && *r.end() == i64::MAX)
    }

    /// The ids, when there are at most `max` of them.
    #[must_use]
    pub fn enumerate(&self, max: usize) -> Option<Vec<i64>> {
        let mut out = Vec::new();
        for range in &self.0 {
            let len = range.end().checked_sub(*range.start())?.checked_add(1)?;
            if out.len() + usize::try_from(len).ok()? > max {
                return None;
            }
            out.extend(range.clone());
        }
        Some(out)
    }

    /// The smallest range holding every id, unless the set is empty.
    #[must_use]
    pub fn hull(&self) -> Option<RangeInclusive<i64>> {
        Some(*self.0.first()?.start()..=*self.0.last()?.end())
    }

    /// The set as `EXPLAIN` shows it.
    #[must_use]
    pub fn describe(&self) -> String {
        let ranges: Vec<String> = self
            .0
            .iter()
            .map(|r| match (*r.start(), *r.end()) {
                (lo, hi) if lo == hi => lo.to_string(),
                (i64::MIN, hi) => format!("..={hi}"),
                (lo, i64::MAX) => format!("{lo}.."),
                (lo, hi) => format!("{lo}..={hi}"),
            })
            .collect();
        format!("[{}]", ranges.join(", "))
    }
}

/// Which key column a filter constrains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyColumn {
    /// `table_id`: key ranges of the table.
    Table,
    /// The row id (`mapping_id`, `data_file_id`): ranges of the id index.
    Row,
}

/// The key columns of `table` by name.
fn key_column(table: CatalogTable, name: &str) -> Option<KeyColumn> {
    match (table, name) {
        (CatalogTable::ColumnMapping | CatalogTable::DataFile, "table_id") => {
            Some(KeyColumn::Table)
        }
        (CatalogTable::ColumnMapping | CatalogTable::NameMapping, "mapping_id")
        | (CatalogTable::DataFile, "data_file_id") => Some(KeyColumn::Row),
        _ => None,
    }
}

/// The key constraint of one filter, if the scan can answer the filter exactly.
#[must_use]
pub fn constraint(table: CatalogTable, expr: &Expr) -> Option<(KeyColumn, IdSet)> {
    match expr {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            if *op == Operator::And {
                let (lc, ls) = constraint(table, left)?;
                let (rc, rs) = constraint(table, right)?;
                return (lc == rc).then(|| (lc, ls.intersect(&rs)));
            }
            if *op == Operator::Or {
                // DataFusion turns a short `IN` list into a chain of `OR`s.
                let (lc, ls) = constraint(table, left)?;
                let (rc, rs) = constraint(table, right)?;
                return (lc == rc).then(|| (lc, ls.union(&rs)));
            }
            let (column, value, op) = match (column_of(table, left), literal(right)) {
                (Some(c), Some(v)) => (c, v, *op),
                _ => (column_of(table, right)?, literal(left)?, op.swap()?),
            };
            let ranges = match op {
                Operator::Eq => vec![value..=value],
                Operator::Gt => value
                    .checked_add(1)
                    .map(|v| v..=i64::MAX)
                    .into_iter()
                    .collect(),
                Operator::GtEq => vec![value..=i64::MAX],
                Operator::Lt => value
                    .checked_sub(1)
                    .map(|v| i64::MIN..=v)
                    .into_iter()
                    .collect(),
                Operator::LtEq => vec![i64::MIN..=value],
                _ => return None,
            };
            Some((column, IdSet::from_ranges(ranges)))
        }
        Expr::InList(list) if !list.negated => {
            let column = column_of(table, &list.expr)?;
            let values = list
                .list
                .iter()
                .map(|e| literal(e).map(|v| v..=v))
                .collect::<Option<Vec<_>>>()?;
            Some((column, IdSet::from_ranges(values)))
        }
        Expr::Between(between) if !between.negated => {
            let column = column_of(table, &between.expr)?;
            let lo = literal(&between.low)?;
            let hi = literal(&between.high)?;
            Some((column, IdSet::from_ranges(vec![lo..=hi])))
        }
        _ => None,
    }
}

fn column_of(table: CatalogTable, expr: &Expr) -> Option<KeyColumn> {
    match expr {
        Expr::Column(column) => key_column(table, &column.name),
        _ => None,
    }
}

/// A non-NULL integer literal as an `i64`.
fn literal(expr: &Expr) -> Option<i64> {
    let Expr::Literal(value, _) = expr else {
        return None;
    };
    match value {
        ScalarValue::Int64(v) => *v,
        ScalarValue::Int32(v) => v.map(i64::from),
        ScalarValue::Int16(v) => v.map(i64::from),
        ScalarValue::Int8(v) => v.map(i64::from),
        ScalarValue::UInt32(v) => v.map(i64::from),
        ScalarValue::UInt16(v) => v.map(i64::from),
        ScalarValue::UInt8(v) => v.map(i64::from),
        ScalarValue::UInt64(v) => v.and_then(|v| i64::try_from(v).ok()),
        _ => None,
    }
}

/// The combined key constraints of the pushed filters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyConstraints {
    /// Allowed `table_id`s, when constrained.
    pub tables: Option<IdSet>,
    /// Allowed row ids, when constrained.
    pub rows: Option<IdSet>,
}

impl KeyConstraints {
    /// No constraint: every key.
    #[must_use]
    pub fn none() -> Self {
        KeyConstraints {
            tables: None,
            rows: None,
        }
    }

    /// The constraints of all `filters` the scan answers (the others are ignored here).
    #[must_use]
    pub fn of(table: CatalogTable, filters: &[Expr]) -> Self {
        let mut out = KeyConstraints {
            tables: None,
            rows: None,
        };
        for (column, set) in filters.iter().filter_map(|f| constraint(table, f)) {
            let slot = match column {
                KeyColumn::Table => &mut out.tables,
                KeyColumn::Row => &mut out.rows,
            };
            *slot = Some(match slot.take() {
                Some(current) => current.intersect(&set),
                None => set,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use datafusion::prelude::{col, lit};

    use super::*;

    #[test]
    fn comparisons_become_id_ranges() {
        let t = CatalogTable::DataFile;
        assert_eq!(
            constraint(t, &col("table_id").eq(lit(5_i64))),
            Some((KeyColumn::Table, IdSet(vec![5..=5])))
        );
        assert_eq!(
            constraint(t, &lit(5_i32).lt(col("table_id"))),
            Some((KeyColumn::Table, IdSet(vec![6..=i64::MAX])))
        );
        assert_eq!(
            constraint(
                t,
                &col("table_id")
                    .in_list(vec![lit(3_i64), lit(1_i64), lit(2_i64), lit(9_i64)], false)
            ),
            Some((KeyColumn::Table, IdSet(vec![1..=3, 9..=9])))
        );
        assert_eq!(
            constraint(
                t,
                &col("data_file_id")
                    .gt_eq(lit(4_i64))
                    .and(col("data_file_id").lt(lit(8_i64)))
            ),
            Some((KeyColumn::Row, IdSet(vec![4..=7])))
        );
        assert_eq!(
            constraint(t, &col("table_id").lt(lit(i64::MIN))),
            Some((KeyColumn::Table, IdSet(vec![])))
        );
        assert_eq!(
            constraint(
                t,
                &col("table_id")
                    .eq(lit(9_i64))
                    .or(col("table_id").eq(lit(5_i64)))
                    .or(col("table_id").gt(lit(20_i64)))
            ),
            Some((KeyColumn::Table, IdSet(vec![5..=5, 9..=9, 21..=i64::MAX]))),
            "short IN lists arrive as ORs"
        );
    }

    #[test]
    fn other_filters_are_left_to_datafusion() {
        let t = CatalogTable::DataFile;
        assert_eq!(constraint(t, &col("begin_snapshot").eq(lit(1_i64))), None);
        assert_eq!(constraint(t, &col("table_id").not_eq(lit(1_i64))), None);
        assert_eq!(constraint(t, &col("table_id").eq(lit(1.5_f64))), None);
        assert_eq!(
            constraint(t, &col("table_id").eq(lit(ScalarValue::Int64(None)))),
            None
        );
        assert_eq!(
            constraint(t, &col("table_id").in_list(vec![lit(1_i64)], true)),
            None
        );
        assert_eq!(
            constraint(
                t,
                &col("table_id")
                    .eq(lit(1_i64))
                    .or(col("data_file_id").eq(lit(2_i64)))
            ),
            None,
            "a disjunction over two columns"
        );
        assert_eq!(
            constraint(t, &col("mapping_id").eq(lit(1_i64))),
            None,
            "not a key of data files"
        );
        assert_eq!(
            constraint(CatalogTable::NameMapping, &col("table_id").eq(lit(1_i64))),
            None
        );
        assert_eq!(
            constraint(
                t,
                &col("table_id")
                    .eq(lit(1_i64))
                    .and(col("data_file_id").eq(lit(2_i64)))
            ),
            None,
            "a conjunction over two columns arrives as two filters"
        );
    }
}
