//! One DataFusion table provider per catalog table, bound to one snapshot.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::Session;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::Result;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::streaming::StreamingTableExec;

use super::arrow::table_schema;
use super::pushdown::{KeyConstraints, constraint};
use super::scan::ScanPartition;
use crate::catalog::CatalogSnapshot;
use crate::model::CatalogTable;

/// A catalog table as DataFusion sees it: DuckLake's schema, key filters pushed into the scan.
#[derive(Debug)]
pub struct CatalogTableProvider {
    table: CatalogTable,
    snapshot: CatalogSnapshot,
}

impl CatalogTableProvider {
    /// `table` as of `snapshot`.
    #[must_use]
    pub fn new(table: CatalogTable, snapshot: CatalogSnapshot) -> Self {
        Self { table, snapshot }
    }
}

#[async_trait]
impl TableProvider for CatalogTableProvider {
    fn schema(&self) -> SchemaRef {
        table_schema(self.table)
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
                Some(_) => TableProviderFilterPushDown::Exact,
                None => TableProviderFilterPushDown::Unsupported,
            })
            .collect())
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let partition = ScanPartition::new(
            self.table,
            self.snapshot.clone(),
            KeyConstraints::of(self.table, filters),
            projection.cloned(),
        )?;
        let schema =
            Arc::clone(datafusion::physical_plan::streaming::PartitionStream::schema(&partition));
        Ok(Arc::new(StreamingTableExec::try_new(
            schema,
            vec![Arc::new(partition)],
            None,
            [],
            false,
            None,
        )?))
    }
}
