//! One DataFusion table provider per catalog table, bound to one snapshot.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::Session;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;

use super::FastPaths;
use super::arrow::{Keep, Shape};
use super::pushdown::{IdSet, KeyConstraints, constraint};
use super::scan::{Access, CatalogScanExec};
use crate::batch::served_schema;
use crate::catalog::CatalogSnapshot;
use crate::codec::Kind;
use crate::model::{CatalogTable, DuckLakeVersion, TableId};

/// A catalog table as DataFusion sees it: DuckLake's schema, key filters pushed into the scan.
/// One provider serves every query; each scan reads the snapshot its query carries.
#[derive(Debug)]
pub struct CatalogTableProvider {
    table: CatalogTable,
    version: DuckLakeVersion,
    fast: FastPaths,
}

impl CatalogTableProvider {
    /// `table` as DuckLake `version` defines it, with the fast paths `fast`.
    #[must_use]
    pub fn new(table: CatalogTable, version: DuckLakeVersion, fast: FastPaths) -> Self {
        Self {
            table,
            version,
            fast,
        }
    }

    /// The stored columns (positions in `table.columns()`) of a projection of the served
    /// schema: the served columns when `projection` is `None`.
    fn stored(&self, projection: Option<&Vec<usize>>) -> Option<Vec<usize>> {
        match (projection, self.version.positions(self.table)) {
            (projection, None) => projection.cloned(),
            (None, Some(positions)) => Some(positions.to_vec()),
            (Some(projection), Some(positions)) => Some(
                projection
                    .iter()
                    .filter_map(|i| positions.get(*i).copied())
                    .collect(),
            ),
        }
    }
}

/// The kind of record `table`'s rows come from: a mapping record holds its
/// `ducklake_column_mapping` row and its `ducklake_name_mapping` rows.
pub(crate) fn row_kind(table: CatalogTable) -> Kind {
    match table {
        CatalogTable::ColumnMapping | CatalogTable::NameMapping => Kind::Mapping,
        CatalogTable::DataFile => Kind::DataFile,
    }
}

/// The key ranges of `tables` in row kind `kind`, each narrowed to the ids `rows` admit when
/// it is one table.
pub(super) fn table_ranges(
    snapshot: &CatalogSnapshot,
    kind: Kind,
    tables: &IdSet,
    rows: Option<&IdSet>,
) -> Vec<crate::kv::KeyRange> {
    let keyspace = snapshot.keyspace();
    let hull = rows.and_then(IdSet::hull);
    tables
        .ranges()
        .iter()
        .map(|range| match (&hull, *range.start() == *range.end()) {
            (Some(ids), true) => keyspace.row_span(kind, TableId(*range.start()), ids.clone()),
            _ => keyspace.table_span(kind, TableId(*range.start())..=TableId(*range.end())),
        })
        .collect()
}

#[async_trait]
impl TableProvider for CatalogTableProvider {
    fn schema(&self) -> SchemaRef {
        served_schema(self.version, self.table)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        Ok(filters
            .iter()
            .map(|filter| match constraint(self.table, filter) {
                // The scan reads exactly the matching keys and filters row ids itself.
                Some(_) if self.fast.key_ranges => TableProviderFilterPushDown::Exact,
                _ => TableProviderFilterPushDown::Unsupported,
            })
            .collect())
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let kind = row_kind(self.table);
        let snapshot = super::snapshot_of(state)?;
        let constraints = if self.fast.key_ranges {
            KeyConstraints::of(self.table, filters)
        } else {
            KeyConstraints::none()
        };
        let (access, keep) = match (constraints.tables, constraints.rows) {
            (Some(tables), rows) => (
                Access::Ranges {
                    ranges: table_ranges(&snapshot, kind, &tables, rows.as_ref()),
                    tables: Some(tables),
                },
                Keep {
                    ids: rows,
                    tables: None,
                },
            ),
            (None, Some(ids)) => (Access::IdOrder { ids, tables: None }, Keep::default()),
            (None, None) => (
                Access::Ranges {
                    ranges: vec![snapshot.keyspace().kind_range(kind)],
                    tables: None,
                },
                Keep::default(),
            ),
        };
        Ok(Arc::new(CatalogScanExec::try_new(
            Shape::Table(self.table),
            snapshot,
            access,
            keep,
            self.stored(projection),
            if self.fast.partitions {
                state.config().target_partitions()
            } else {
                1
            },
            None,
        )?))
    }
}
