//! DuckLake's mapping load as one table: the join of `ducklake_column_mapping` and
//! `ducklake_name_mapping` on `mapping_id`, read straight from the mapping records that hold
//! both, already in the load's order.
//!
//! DuckLake's query (`... FROM ducklake_column_mapping JOIN ducklake_name_mapping USING
//! (mapping_id) [WHERE mapping_id >= c] ORDER BY mapping_id, parent_column NULLS FIRST`) is
//! rewritten to read this table ([`rewrite`](super::rewrite)). The records come through the
//! `mapping_id` index, so they arrive in `mapping_id` order and a cursor reads only the index
//! range past it; each record's rows leave parents first. The scan declares that order, so
//! DataFusion plans neither the join nor the sort: one pass, each record decoded once.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::Session;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{LexOrdering, PhysicalSortExpr};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use futures::stream::{self, StreamExt as _};
use std::collections::VecDeque;

use super::arrow::BatchBuilder;
use super::pushdown::{IdSet, KeyConstraints, constraint};
use crate::catalog::CatalogSnapshot;
use crate::kv::PageSize;
use crate::model::{CatalogTable, ColumnMapping};

/// The name the rewritten query reads. Not listed in the catalog metadata.
pub const MAPPING_LOAD_TABLE: &str = "__moraine_mapping_load";

/// The joined columns, in the order `SELECT *` of the join gives them.
pub const COLUMNS: [&str; 8] = [
    "mapping_id",
    "table_id",
    "type",
    "column_id",
    "source_name",
    "target_field_id",
    "parent_column",
    "is_partition",
];

/// The joined schema: every column nullable, as in both tables.
#[must_use]
pub fn mapping_load_schema() -> SchemaRef {
    let types = [
        DataType::Int64,
        DataType::Int64,
        DataType::Utf8,
        DataType::Int64,
        DataType::Utf8,
        DataType::Int64,
        DataType::Int64,
        DataType::Boolean,
    ];
    Arc::new(Schema::new(
        COLUMNS
            .iter()
            .zip(types)
            .map(|(name, ty)| Field::new(*name, ty, true))
            .collect::<Vec<_>>(),
    ))
}

/// The joined table over one snapshot.
#[derive(Debug)]
pub struct MappingLoadProvider {
    snapshot: CatalogSnapshot,
}

impl MappingLoadProvider {
    /// The join as of `snapshot`.
    #[must_use]
    pub fn new(snapshot: CatalogSnapshot) -> Self {
        Self { snapshot }
    }
}

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
        // Only `mapping_id` narrows the index range; `table_id` would need the table ranges,
        // which lose the `mapping_id` order.
        Ok(filters
            .iter()
            .map(
                |filter| match constraint(CatalogTable::NameMapping, filter) {
                    Some(_) => TableProviderFilterPushDown::Exact,
                    None => TableProviderFilterPushDown::Unsupported,
                },
            )
            .collect())
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let ids = KeyConstraints::of(CatalogTable::NameMapping, filters)
            .rows
            .unwrap_or_else(IdSet::all);
        let partition = LoadPartition::new(self.snapshot.clone(), ids, projection.cloned())?;
        let schema = Arc::clone(partition.schema());
        let ordering = output_ordering(&schema);
        Ok(Arc::new(StreamingTableExec::try_new(
            schema,
            vec![Arc::new(partition)],
            None,
            ordering,
            false,
            None,
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

/// The one partition of the joined scan.
struct LoadPartition {
    snapshot: CatalogSnapshot,
    ids: IdSet,
    projection: Option<Vec<usize>>,
    schema: SchemaRef,
}

impl std::fmt::Debug for LoadPartition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadPartition")
            .field("ids", &self.ids)
            .field("projection", &self.projection)
            .finish_non_exhaustive()
    }
}

impl LoadPartition {
    fn new(
        snapshot: CatalogSnapshot,
        ids: IdSet,
        projection: Option<Vec<usize>>,
    ) -> Result<Self, DataFusionError> {
        let schema = BatchBuilder::mapping_load(projection.as_deref(), 0)?.schema();
        Ok(Self {
            snapshot,
            ids,
            projection,
            schema,
        })
    }
}

/// The records of one `mapping_id` (one, unless two tables use the same id), waiting for the
/// next id so that all their rows leave together, parents first.
#[derive(Default)]
struct Group(Vec<ColumnMapping>);

impl Group {
    /// Adds `mapping`; returns the finished group when `mapping` starts a new one.
    fn push(&mut self, mapping: ColumnMapping) -> Option<Vec<ColumnMapping>> {
        let same = self
            .0
            .first()
            .is_none_or(|first| first.mapping_id == mapping.mapping_id);
        let done = (!same).then(|| std::mem::take(&mut self.0));
        self.0.push(mapping);
        done
    }

    fn take(&mut self) -> Vec<ColumnMapping> {
        std::mem::take(&mut self.0)
    }
}

impl PartitionStream for LoadPartition {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let batch_size = ctx.session_config().batch_size().max(1);
        let schema = Arc::clone(&self.schema);
        let Ok(builder) = BatchBuilder::mapping_load(self.projection.as_deref(), batch_size) else {
            return Box::pin(RecordBatchStreamAdapter::new(schema, stream::empty()));
        };
        let records = self
            .snapshot
            .mappings_by_id(self.ids.ranges().to_vec(), PageSize::default());
        let state = Some((records, builder, Group::default(), VecDeque::new()));
        let batches = stream::unfold(state, move |state| async move {
            let (mut records, mut builder, mut group, mut ready) = state?;
            loop {
                if let Some(batch) = ready.pop_front() {
                    return Some((batch, Some((records, builder, group, ready))));
                }
                let mut emit = |builder: &mut BatchBuilder, done: Vec<ColumnMapping>| {
                    builder.append_load_group(&done);
                    if builder.rows() >= batch_size {
                        ready.push_back(builder.finish().map_err(DataFusionError::from));
                    }
                };
                match records.next().await {
                    Some(Ok(page)) => {
                        for mapping in page {
                            if let Some(done) = group.push(mapping) {
                                emit(&mut builder, done);
                            }
                        }
                    }
                    Some(Err(err)) => return Some((Err(super::to_datafusion(err)), None)),
                    None => {
                        let last = group.take();
                        if !last.is_empty() {
                            emit(&mut builder, last);
                            continue;
                        }
                        if builder.rows() > 0 {
                            return Some((builder.finish().map_err(DataFusionError::from), None));
                        }
                        return None;
                    }
                }
            }
        });
        Box::pin(RecordBatchStreamAdapter::new(schema, batches))
    }
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
            .collect();
            let mut batch = StagedBatch::new();
            batch
                .push(Op::Insert(Insert::ColumnMappings(vec![map])))
                .push(Op::Insert(Insert::NameMappings(names)));
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
