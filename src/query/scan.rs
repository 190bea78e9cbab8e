//! The scan of one catalog table at one snapshot: key ranges (or id-index ranges) read page by
//! page, records turned into batches of the projected columns, streamed as they fill.
//!
//! Nothing is read before DataFusion polls the stream, and dropping the stream stops the scan.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::error::DataFusionError;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::PartitionStream;
use futures::stream::{self, BoxStream, StreamExt as _};

use super::arrow::BatchBuilder;
use super::pushdown::KeyConstraints;
use crate::catalog::CatalogSnapshot;
use crate::codec::Kind;
use crate::kv::PageSize;
use crate::model::{CatalogTable, ColumnMapping, DataFile};

/// Records of one page, of either kind.
enum Records {
    Mappings(Vec<ColumnMapping>),
    Files(Vec<DataFile>),
}

/// One partition of a catalog table scan.
pub struct ScanPartition {
    table: CatalogTable,
    snapshot: CatalogSnapshot,
    constraints: KeyConstraints,
    projection: Option<Vec<usize>>,
    schema: SchemaRef,
}

impl fmt::Debug for ScanPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScanPartition")
            .field("table", &self.table)
            .field("constraints", &self.constraints)
            .field("projection", &self.projection)
            .finish_non_exhaustive()
    }
}

impl ScanPartition {
    /// A scan of `table` at `snapshot`, narrowed by `constraints`, with the columns
    /// `projection` (all when `None`).
    ///
    /// # Errors
    /// When `projection` names a column the table does not have.
    pub fn new(
        table: CatalogTable,
        snapshot: CatalogSnapshot,
        constraints: KeyConstraints,
        projection: Option<Vec<usize>>,
    ) -> Result<Self, DataFusionError> {
        let schema = BatchBuilder::new(table, projection.as_deref(), 0)?.schema();
        Ok(Self {
            table,
            snapshot,
            constraints,
            projection,
            schema,
        })
    }

    /// The record pages the constraints call for.
    fn records(&self) -> BoxStream<'static, crate::Result<Records>> {
        let keyspace = self.snapshot.keyspace();
        let kind = match self.table {
            CatalogTable::ColumnMapping | CatalogTable::NameMapping => Kind::Mapping,
            CatalogTable::DataFile => Kind::DataFile,
        };
        let page = PageSize::default();
        let rows = self.constraints.rows.clone();
        let by_index = match (&self.constraints.tables, &rows) {
            (None, Some(ids)) => Some(ids.ranges().to_vec()),
            _ => None,
        };
        let ranges = match &self.constraints.tables {
            Some(tables) => tables
                .ranges()
                .iter()
                .map(|r| keyspace.table_span(kind, (*r.start()).into()..=(*r.end()).into()))
                .collect(),
            None => vec![keyspace.kind_range(kind)],
        };
        let keep = move |id: i64| rows.as_ref().is_none_or(|ids| ids.contains(id));
        match (kind, by_index) {
            (Kind::Mapping, Some(ids)) => self
                .snapshot
                .mappings_by_id(ids, page)
                .map(|page| page.map(Records::Mappings))
                .boxed(),
            (Kind::Mapping, None) => self
                .snapshot
                .mappings(ranges, page)
                .map(move |page| {
                    let mut page = page?;
                    page.retain(|m| keep(m.mapping_id.0));
                    Ok(Records::Mappings(page))
                })
                .boxed(),
            (_, Some(ids)) => self
                .snapshot
                .data_files_by_id_ranges(ids, page)
                .map(|page| page.map(Records::Files))
                .boxed(),
            (_, None) => self
                .snapshot
                .data_files(ranges, page)
                .map(move |page| {
                    let mut page = page?;
                    page.retain(|f| keep(f.data_file_id.0));
                    Ok(Records::Files(page))
                })
                .boxed(),
        }
    }
}

impl PartitionStream for ScanPartition {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let batch_size = ctx.session_config().batch_size().max(1);
        let builder = BatchBuilder::new(self.table, self.projection.as_deref(), batch_size);
        let schema = Arc::clone(&self.schema);
        let Ok(builder) = builder else {
            // `new` checked the projection already.
            return Box::pin(RecordBatchStreamAdapter::new(schema, stream::empty()));
        };
        let state = Some((self.records(), builder, VecDeque::new()));
        let batches = stream::unfold(state, move |state| async move {
            let (mut records, mut builder, mut ready) = state?;
            loop {
                if let Some(batch) = ready.pop_front() {
                    return Some((batch, Some((records, builder, ready))));
                }
                match records.next().await {
                    Some(Ok(page)) => {
                        // Cut batches at the session's batch size, however many rows a
                        // page of records expands to.
                        let mut flush = |builder: &mut BatchBuilder| {
                            if builder.rows() >= batch_size {
                                ready.push_back(builder.finish().map_err(DataFusionError::from));
                            }
                        };
                        match page {
                            Records::Mappings(page) => {
                                for mapping in &page {
                                    builder.append_mapping(mapping);
                                    flush(&mut builder);
                                }
                            }
                            Records::Files(page) => {
                                for file in &page {
                                    builder.append_data_file(file);
                                    flush(&mut builder);
                                }
                            }
                        }
                    }
                    Some(Err(err)) => return Some((Err(super::to_datafusion(err)), None)),
                    None if builder.rows() > 0 => {
                        return Some((builder.finish().map_err(DataFusionError::from), None));
                    }
                    None => return None,
                }
            }
        });
        Box::pin(RecordBatchStreamAdapter::new(schema, batches))
    }
}
