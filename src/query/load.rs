//! DuckLake's mapping load as one table: the join of `ducklake_column_mapping` and
//! `ducklake_name_mapping` on `mapping_id`, read straight from the mapping records that hold
//! both, already in the load's order.
//!
//! DuckLake's query (`... FROM ducklake_column_mapping JOIN ducklake_name_mapping USING
//! (mapping_id) [WHERE mapping_id >= c] ORDER BY mapping_id, parent_column NULLS FIRST`) is
//! rewritten to read this table ([`rewrite`](super::rewrite)). The scan declares the load's
//! order, so DataFusion plans neither the join nor the sort: one pass, each record decoded
//! once, in one of three ways:
//! - every mapping, or a `mapping_id` range (the cursor): in `mapping_id` order through the
//!   id index, each index page's records read as ranges of their tables;
//! - one table (`table_id = X`): that table's range, which is in `mapping_id` order already;
//! - a few tables: their ranges merged by `mapping_id`.
//!
//! So a table-scoped load reads that table's range only, whatever the catalog's size.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::Session;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{LexOrdering, PhysicalSortExpr};
use datafusion::physical_plan::ExecutionPlan;

use super::arrow::{Keep, Shape};
use super::provider::table_ranges;
use super::pushdown::{IdSet, KeyConstraints, constraint};
use super::scan::{Access, CatalogScanExec};
use crate::batch::mapping_load_schema;
use crate::codec::Kind;
use crate::model::CatalogTable;

/// The name the rewritten query reads. Not listed in the catalog metadata.
pub const MAPPING_LOAD_TABLE: &str = "__moraine_mapping_load";

/// Most tables a table-scoped load merges; a larger set reads the id index instead.
const MAX_MERGED_TABLES: usize = 64;

/// The joined table. One provider serves every query; each scan reads the snapshot its
/// query carries.
#[derive(Debug)]
pub struct MappingLoadProvider;

#[async_trait]
impl TableProvider for MappingLoadProvider {
    fn schema(&self) -> SchemaRef {
        mapping_load_schema()
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        // `mapping_id` and `table_id` are the keys of the mapping records.
        Ok(filters
            .iter()
            .map(
                |filter| match constraint(CatalogTable::ColumnMapping, filter) {
                    Some(_) => TableProviderFilterPushDown::Exact,
                    None => TableProviderFilterPushDown::Unsupported,
                },
            )
            .collect())
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let snapshot = super::snapshot_of(state)?;
        let constraints = KeyConstraints::of(CatalogTable::ColumnMapping, filters);
        let rows = constraints.rows;
        let keep = Keep {
            ids: rows.clone(),
            tables: constraints.tables.clone(),
        };
        let access = match constraints.tables {
            None => Access::IdOrder {
                ids: rows.unwrap_or_else(IdSet::all),
                tables: None,
            },
            Some(tables) => match tables.enumerate(MAX_MERGED_TABLES) {
                Some(list) if list.len() <= 1 => Access::Ranges {
                    ranges: table_ranges(&snapshot, Kind::Mapping, &tables, rows.as_ref()),
                    tables: Some(tables),
                },
                Some(list) => Access::Merge {
                    ranges: list
                        .iter()
                        .flat_map(|&t| {
                            table_ranges(&snapshot, Kind::Mapping, &IdSet::single(t), rows.as_ref())
                        })
                        .collect(),
                    tables: list,
                },
                None => Access::IdOrder {
                    ids: rows.unwrap_or_else(IdSet::all),
                    tables: Some(tables),
                },
            },
        };
        let schema = mapping_load_schema();
        let projected = match projection {
            Some(p) => Arc::new(schema.project(p)?),
            None => schema,
        };
        Ok(Arc::new(CatalogScanExec::try_new(
            Shape::MappingLoad,
            snapshot,
            access,
            keep,
            projection.cloned(),
            1,
            output_ordering(&projected),
        )?))
    }
}

/// `mapping_id ASC NULLS LAST, parent_column ASC NULLS FIRST`, as far as the projection keeps
/// those columns (`mapping_id` is never NULL).
fn output_ordering(schema: &SchemaRef) -> Option<LexOrdering> {
    let sort = |name: &str, nulls_first: bool| -> Option<PhysicalSortExpr> {
        let index = schema.index_of(name).ok()?;
        Some(PhysicalSortExpr::new(
            Arc::new(Column::new(name, index)),
            datafusion::arrow::compute::SortOptions {
                descending: false,
                nulls_first,
            },
        ))
    };
    let mut exprs = vec![sort("mapping_id", false)?];
    exprs.extend(sort("parent_column", true));
    LexOrdering::new(exprs)
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Array, AsArray as _};
    use datafusion::arrow::datatypes::Int64Type;
    use futures::TryStreamExt as _;

    use crate::catalog::Catalog;
    use crate::codec::{KeyPrefix, Keyspace};
    use crate::kv::Store;
    use crate::model::{ColumnMappingRow, NameMappingRow};
    use crate::query::QueryEngine;
    use crate::write::{Insert, Op, StagedBatch, commit_batch};

    const LOAD: &str = "SELECT mapping_id, table_id, type, column_id, source_name, target_field_id, parent_column, is_partition FROM ducklake_column_mapping JOIN ducklake_name_mapping USING (mapping_id)";
    const ORDER: &str = " ORDER BY mapping_id, parent_column NULLS FIRST";

    /// Mappings whose trees put children before later roots in `column_id` order, two tables
    /// sharing `mapping_id` 6 (which a SQL catalog's join crosses), ids out of table order.
    async fn engine() -> QueryEngine {
        let catalog = Catalog::new(Store::memory(), Keyspace::new(KeyPrefix::none()));
        // One batch per mapping: a batch's name rows go to the one mapping of their id.
        for (table_id, mapping_id) in [(1, 8), (1, 2), (2, 6), (3, 6), (2, 4)] {
            let map = ColumnMappingRow {
                mapping_id: Some(mapping_id),
                table_id: Some(table_id),
                map_type: Some("map_by_name".into()),
            };
            let names = [
                (0, None),
                (1, Some(0)),
                (2, None),
                (3, Some(2)),
                (4, Some(0)),
            ]
            .into_iter()
            .map(|(column_id, parent): (i64, Option<i64>)| NameMappingRow {
                mapping_id: Some(mapping_id),
                column_id: Some(column_id + 10 * table_id),
                source_name: Some(format!("c{column_id}")),
                target_field_id: Some(column_id),
                parent_column: parent.map(|p| p + 10 * table_id),
                is_partition: Some(false),
            })
            .collect::<Vec<_>>();
            let mut batch = StagedBatch::new();
            batch
                .push(Op::Insert(Insert::column_mappings(&[map])))
                .push(Op::Insert(Insert::name_mappings(&names)));
            commit_batch(&catalog, &batch).await.expect("committed");
        }
        QueryEngine::new(catalog)
    }

    async fn rows(engine: &QueryEngine, sql: &str) -> Vec<Vec<Option<i64>>> {
        let batches: Vec<_> = engine
            .execute(sql, Vec::new())
            .await
            .expect("plans")
            .try_collect()
            .await
            .expect("runs");
        let mut out = Vec::new();
        for batch in batches {
            for row in 0..batch.num_rows() {
                out.push(
                    [0, 1, 3, 6]
                        .iter()
                        .map(|&c| {
                            let a = batch.column(c).as_primitive::<Int64Type>();
                            a.is_valid(row).then(|| a.value(row))
                        })
                        .collect(),
                );
            }
        }
        out
    }

    #[tokio::test]
    async fn the_load_reads_records_in_order_without_a_join_or_a_sort() {
        let engine = engine().await;
        let plan: Vec<_> = engine
            .execute(&format!("EXPLAIN {LOAD}{ORDER}"), Vec::new())
            .await
            .expect("explains")
            .try_collect()
            .await
            .expect("runs");
        let text: String = plan
            .iter()
            .flat_map(|b| {
                let c = b.column(1).as_string::<i32>();
                (0..c.len())
                    .map(|i| c.value(i).to_owned())
                    .collect::<Vec<_>>()
            })
            .collect();
        assert!(
            !text.contains("HashJoinExec") && !text.contains("SortExec"),
            "{text}"
        );

        let got = rows(&engine, &format!("{LOAD}{ORDER}")).await;
        assert_eq!(got.len(), 35, "mapping 6: 2 records x 10 name rows");
        // The query's order: mapping_id, then parent_column NULLS FIRST, across both records
        // of mapping 6.
        let key = |r: &Vec<Option<i64>>| (r[0], r[3].is_some(), r[3]);
        assert!(got.windows(2).all(|w| key(&w[0]) <= key(&w[1])), "{got:?}");
        // The same rows as the join the rewrite replaced.
        let mut joined = rows(
            &engine,
            "SELECT m.mapping_id, m.table_id, m.type, n.column_id, n.source_name, n.target_field_id, n.parent_column, n.is_partition FROM ducklake_column_mapping m JOIN ducklake_name_mapping n ON m.mapping_id = n.mapping_id",
        )
        .await;
        let mut sorted = got.clone();
        joined.sort();
        sorted.sort();
        assert_eq!(sorted, joined);

        let cursor = rows(&engine, &format!("{LOAD} WHERE mapping_id >= 6{ORDER}")).await;
        assert_eq!(
            cursor,
            got.into_iter()
                .filter(|r| r[0] >= Some(6))
                .collect::<Vec<_>>()
        );
    }
}
