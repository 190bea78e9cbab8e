//! The scan of the catalog at one snapshot: records found by key range, by id in index
//! order, or by merging a few tables' ranges into id order; decoded in place into batches of
//! the projected columns, streamed as they fill.
//!
//! A scan by key range runs as several partitions when DataFusion asks for them: one task
//! reads the pages in key order, a page ahead, and the partitions take pages from it as they
//! are free, each decoding its pages on its own core. Nothing is read before DataFusion polls
//! a stream, and dropping the streams stops the scan.
//!
//! `EXPLAIN` shows how a scan reads: `full scan`, the table ranges, the id ranges of the
//! index, or the tables merged.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::fmt;
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex, PoisonError};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, LexOrdering, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType, SchedulingType};
use datafusion::physical_plan::stream::{
    RecordBatchReceiverStreamBuilder, RecordBatchStreamAdapter,
};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties,
};
use futures::stream::{self, BoxStream, StreamExt as _};

use super::arrow::{Keep, RecordBuilder, Shape};
use super::pushdown::IdSet;
use crate::catalog::CatalogSnapshot;
use crate::codec::Kind;
use crate::kv::{KeyRange, Page, PageSize};
use crate::model::{DataFileId, TableId};
use crate::write::Hold;

/// Most tables or data-file ids a write statement holds one by one; a statement that read
/// more holds the ranges it read.
const MAX_HELD_IDS: usize = 4096;

/// How a scan finds its records.
#[derive(Debug, Clone)]
pub enum Access {
    /// Key ranges of the row kind, in key order: whole tables, or everything
    /// (`full` says which, for `EXPLAIN`).
    Ranges {
        /// The ranges.
        ranges: Vec<KeyRange>,
        /// The tables they cover, for `EXPLAIN`; `None` for every table.
        tables: Option<IdSet>,
    },
    /// Rows whose ids lie in `ids`, in id order, through the id index; only those of
    /// `tables` when given.
    IdOrder {
        /// The row ids.
        ids: IdSet,
        /// The tables to keep.
        tables: Option<IdSet>,
    },
    /// The ranges of a few tables, merged into id order.
    Merge {
        /// One range per table.
        ranges: Vec<KeyRange>,
        /// The tables, for `EXPLAIN`.
        tables: Vec<i64>,
    },
}

/// The scan of one shape of rows at one snapshot.
pub struct CatalogScanExec {
    shape: Shape,
    snapshot: CatalogSnapshot,
    access: Access,
    /// Records to keep, when the access reads more than the filters admit.
    keep: Keep,
    projection: Option<Vec<usize>>,
    schema: SchemaRef,
    partitions: usize,
    properties: Arc<PlanProperties>,
    /// The page reader the partitions of the running execution share, until each partition
    /// has taken it.
    shared: Mutex<(Option<Arc<SharedPages>>, usize)>,
}

impl fmt::Debug for CatalogScanExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CatalogScanExec")
            .field("shape", &self.shape)
            .field("access", &self.access)
            .field("keep", &self.keep)
            .field("projection", &self.projection)
            .field("partitions", &self.partitions)
            .finish_non_exhaustive()
    }
}

impl CatalogScanExec {
    /// A scan of `shape` at `snapshot` reading `access`, keeping the records `keep` admits,
    /// with the columns `projection`, in `partitions` partitions (only a scan by ranges has
    /// more than one), declaring `ordering` when it holds.
    ///
    /// # Errors
    /// When `projection` names a column the shape does not have.
    pub fn try_new(
        shape: Shape,
        snapshot: CatalogSnapshot,
        access: Access,
        keep: Keep,
        projection: Option<Vec<usize>>,
        partitions: usize,
        ordering: Option<LexOrdering>,
    ) -> Result<Self> {
        let schema = RecordBuilder::new(shape, projection.as_deref(), 0)?.schema();
        let partitions = match access {
            Access::Ranges { .. } if ordering.is_none() => partitions.max(1),
            _ => 1,
        };
        let equivalences = EquivalenceProperties::new_with_orderings(
            Arc::clone(&schema),
            ordering.into_iter().collect::<Vec<_>>(),
        );
        let properties = PlanProperties::new(
            equivalences,
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Incremental,
            Boundedness::Bounded,
        )
        .with_scheduling_type(SchedulingType::Cooperative);
        Ok(Self {
            shape,
            snapshot,
            access,
            keep,
            projection,
            schema,
            partitions,
            properties: Arc::new(properties),
            shared: Mutex::new((None, 0)),
        })
    }

    /// This scan reading `snapshot`, with no state of an execution: a kept plan's scan bound
    /// to the snapshot of the execution that runs it.
    #[must_use]
    pub fn at(&self, snapshot: CatalogSnapshot) -> Self {
        Self {
            shape: self.shape,
            snapshot,
            access: self.access.clone(),
            keep: self.keep.clone(),
            projection: self.projection.clone(),
            schema: Arc::clone(&self.schema),
            partitions: self.partitions,
            properties: Arc::clone(&self.properties),
            shared: Mutex::new((None, 0)),
        }
    }

    /// How the scan reads, as `EXPLAIN` shows it.
    #[must_use]
    pub fn describe_access(&self) -> String {
        match &self.access {
            Access::Ranges { tables: None, .. } => "full scan".to_owned(),
            Access::Ranges {
                tables: Some(tables),
                ..
            } => format!("table ranges {}", tables.describe()),
            Access::IdOrder { ids, tables } => format!(
                "id index {}{}",
                ids.describe(),
                tables
                    .as_ref()
                    .map(|t| format!(" of tables {}", t.describe()))
                    .unwrap_or_default()
            ),
            Access::Merge { tables, .. } => format!("merge of tables {tables:?} in id order"),
        }
    }

    /// What the scan reads, as a write statement holds it until its commit: whole tables when
    /// it reads whole tables, the files it names when it reads data files by a few ids, and
    /// otherwise the key ranges it reads.
    pub fn hold(&self) -> Hold {
        let kind = self.kind();
        let keyspace = self.snapshot.keyspace();
        match &self.access {
            Access::Ranges {
                tables: Some(tables),
                ..
            } if self.keep.ids.is_none()
                && let Some(tables) = tables.enumerate(MAX_HELD_IDS) =>
            {
                Hold::Tables {
                    kind,
                    tables: tables.into_iter().map(TableId).collect(),
                }
            }
            Access::Merge { tables, .. } => Hold::Tables {
                kind,
                tables: tables.iter().copied().map(TableId).collect(),
            },
            Access::Ranges { ranges, .. } => Hold::Ranges {
                kind,
                ranges: ranges.clone(),
            },
            Access::IdOrder { ids, .. } => match ids.enumerate(MAX_HELD_IDS) {
                Some(ids) if kind == Kind::DataFile => {
                    Hold::DataFileIds(ids.into_iter().map(DataFileId).collect())
                }
                _ => Hold::Ranges {
                    kind,
                    ranges: ids
                        .ranges()
                        .iter()
                        .map(|ids| keyspace.id_span(kind.counterpart(), ids.clone()))
                        .collect(),
                },
            },
        }
    }

    fn kind(&self) -> Kind {
        if self.shape.reads_mappings() {
            Kind::Mapping
        } else {
            Kind::DataFile
        }
    }

    /// The pages of one partition.
    fn pages(&self) -> BoxStream<'static, crate::Result<Page>> {
        match &self.access {
            Access::Ranges { ranges, tables } => {
                if self.partitions == 1 {
                    let pages =
                        read_ahead(self.snapshot.pages(ranges.clone(), PageSize::default()), 2);
                    return match (self.shape, tables) {
                        (Shape::MappingLoad, Some(tables)) => {
                            with_shared_ids(self.snapshot.clone(), tables.clone(), pages)
                        }
                        _ => pages,
                    };
                }
                // One reader for the partitions of one execution, whether DataFusion runs them
                // together or one after another; the last partition to start clears the slot
                // for a later execution.
                let shared = {
                    let mut slot = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
                    let (reader, taken) = &mut *slot;
                    let shared = Arc::clone(reader.get_or_insert_with(|| {
                        Arc::new(SharedPages::start(
                            self.snapshot.pages(ranges.clone(), PageSize::default()),
                            self.partitions + 1,
                        ))
                    }));
                    *taken += 1;
                    if *taken == self.partitions {
                        *slot = (None, 0);
                    }
                    shared
                };
                stream::unfold(shared, |shared| async move {
                    let page = shared.pages.lock().await.next().await?;
                    Some((page, shared))
                })
                .boxed()
            }
            // The builder keeps the tables asked for (`Keep::tables`): a mapping load needs
            // every record of a kept id.
            // Read on a task of its own, so that the reads and the batches they fill run on
            // two cores.
            Access::IdOrder { ids, .. } => read_ahead(
                self.snapshot
                    .pages_in_id_order(self.kind(), ids.ranges().to_vec(), None),
                2,
            ),
            Access::Merge { ranges, tables } => {
                let pages = merged(&self.snapshot, ranges);
                if self.shape == Shape::MappingLoad {
                    let tables = IdSet::of(tables);
                    with_shared_ids(self.snapshot.clone(), tables, pages)
                } else {
                    pages
                }
            }
        }
    }
}

/// The pages of a table-scoped read of mapping records in id order, each with the records of
/// other tables that use the same mapping ids: in DuckLake's SQL join their name rows join
/// the kept tables' mappings too (name rows carry no `table_id`). Mapping ids are seldom
/// shared. Where the store marks the ids more than one table holds (the embedded store),
/// one read of the marks in the page's span tells which to look up; elsewhere only the id
/// index can tell: one batched index read per page.
fn with_shared_ids(
    snapshot: CatalogSnapshot,
    tables: IdSet,
    pages: BoxStream<'static, crate::Result<Page>>,
) -> BoxStream<'static, crate::Result<Page>> {
    pages
        .then(move |page| {
            let snapshot = snapshot.clone();
            let tables = tables.clone();
            async move {
                let page = page?;
                let keyspace = snapshot.keyspace();
                let mut ids = page
                    .iter()
                    .map(|(key, _)| Ok(keyspace.decode(key)?.id))
                    .collect::<crate::Result<Vec<i64>>>()?;
                ids.dedup();
                ids.sort_unstable();
                ids.dedup();
                if let (Some(&first), Some(&last)) = (ids.first(), ids.last())
                    && let Some(twins) = snapshot.twin_ids(Kind::MappingById, first..=last).await?
                {
                    ids.retain(|id| twins.binary_search(id).is_ok());
                }
                let others: Vec<_> = snapshot
                    .index_rows(Kind::MappingById, &ids)
                    .await?
                    .into_iter()
                    .filter(|row| !tables.contains(row.table_id.0))
                    .collect();
                if others.is_empty() {
                    return Ok(page);
                }
                let keys: Vec<Vec<u8>> = others
                    .iter()
                    .map(|row| keyspace.row_key(Kind::Mapping, row.table_id, row.id))
                    .collect();
                let values = snapshot.values(&keys).await?;
                // The other tables' records of each shared id.
                let mut extra: BTreeMap<i64, Page> = BTreeMap::new();
                for ((row, key), value) in others.iter().zip(keys).zip(values) {
                    if let Some(value) = value {
                        extra.entry(row.id).or_default().push(&key, &value);
                    }
                }
                let mut out = Page::with_capacity(page.len() + others.len(), page.bytes());
                let mut pairs = page.iter().peekable();
                while let Some((key, value)) = pairs.next() {
                    out.push(key, value);
                    let id = keyspace.decode(key)?.id;
                    let group_ends = pairs.peek().is_none_or(|(next, _)| {
                        keyspace.decode(next).map(|r| r.id).ok() != Some(id)
                    });
                    if group_ends && let Some(records) = extra.remove(&id) {
                        for (key, value) in records.iter() {
                            out.push(key, value);
                        }
                    }
                }
                Ok(out)
            }
        })
        .boxed()
}

/// Reads `pages` `ahead` pages ahead of the consumer, on a task of its own.
fn read_ahead(
    pages: BoxStream<'static, crate::Result<Page>>,
    ahead: usize,
) -> BoxStream<'static, crate::Result<Page>> {
    crate::read_ahead::read_ahead(pages, ahead, "reading a scan's pages")
}

/// Pages read in order by one task, taken by whichever partition asks next. When every
/// partition has dropped its stream, the reader stops.
struct SharedPages {
    pages: tokio::sync::Mutex<BoxStream<'static, crate::Result<Page>>>,
}

impl SharedPages {
    fn start(pages: BoxStream<'static, crate::Result<Page>>, buffer: usize) -> Self {
        Self {
            pages: tokio::sync::Mutex::new(read_ahead(pages, buffer)),
        }
    }
}

/// The pages of a few tables' ranges, merged into id order: each table read in key order
/// (which is id order within a table), the smallest next id taken each time.
fn merged(
    snapshot: &CatalogSnapshot,
    ranges: &[KeyRange],
) -> BoxStream<'static, crate::Result<Page>> {
    struct Cursor {
        pages: BoxStream<'static, crate::Result<Page>>,
        page: Page,
        at: usize,
    }
    let keyspace = snapshot.keyspace().clone();
    let cursors: Vec<Cursor> = ranges
        .iter()
        .map(|range| Cursor {
            pages: snapshot
                .kv()
                .scan_pages(range.clone(), PageSize::default())
                .map(|page| page.map_err(Into::into))
                .boxed(),
            page: Page::default(),
            at: 0,
        })
        .collect();
    let state = (cursors, BinaryHeap::new(), false);
    stream::unfold(state, move |(mut cursors, mut heap, mut started)| {
        let keyspace = keyspace.clone();
        async move {
            // Each cursor's next pair: its id, to order by.
            let refill = |cursor: &mut Cursor| -> Option<i64> {
                let (key, _) = cursor.page.get(cursor.at)?;
                keyspace.decode(key).ok().map(|row| row.id)
            };
            if !started {
                started = true;
                for (i, cursor) in cursors.iter_mut().enumerate() {
                    match cursor.pages.next().await {
                        Some(Ok(page)) => cursor.page = page,
                        Some(Err(err)) => return Some((Err(err), (cursors, heap, started))),
                        None => continue,
                    }
                    if let Some(id) = refill(cursor) {
                        heap.push(Reverse((id, i)));
                    }
                }
            }
            let mut out = Page::default();
            while out.len() < PageSize::default().rows {
                let Some(Reverse((_, i))) = heap.pop() else {
                    break;
                };
                let Some(cursor) = cursors.get_mut(i) else {
                    break;
                };
                if let Some((key, value)) = cursor.page.get(cursor.at) {
                    out.push(key, value);
                }
                cursor.at += 1;
                if cursor.at >= cursor.page.len() {
                    match cursor.pages.next().await {
                        Some(Ok(page)) => {
                            cursor.page = page;
                            cursor.at = 0;
                        }
                        Some(Err(err)) => return Some((Err(err), (cursors, heap, started))),
                        None => continue,
                    }
                }
                if let Some(id) = refill(cursor) {
                    heap.push(Reverse((id, i)));
                }
            }
            (!out.is_empty()).then_some((Ok(out), (cursors, heap, started)))
        }
    })
    .boxed()
}

impl DisplayAs for CatalogScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shape = match self.shape {
            Shape::Table(table) => table.name(),
            Shape::MappingLoad => super::load::MAPPING_LOAD_TABLE,
        };
        write!(
            f,
            "CatalogScanExec: {shape}, {}, partitions={}",
            self.describe_access(),
            self.partitions
        )?;
        if let Some(ids) = &self.keep.ids {
            write!(f, ", ids {}", ids.describe())?;
        }
        let columns: Vec<String> = self
            .schema
            .fields()
            .iter()
            .map(|field| field.name().clone())
            .collect();
        write!(f, ", projection=[{}]", columns.join(", "))
    }
}

impl ExecutionPlan for CatalogScanExec {
    fn name(&self) -> &'static str {
        "CatalogScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        Vec::new()
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.is_empty() {
            Ok(self)
        } else {
            Err(DataFusionError::Internal(
                "a catalog scan has no children".into(),
            ))
        }
    }

    fn execute(
        &self,
        partition: usize,
        ctx: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition >= self.partitions {
            return Err(DataFusionError::Internal(format!(
                "partition {partition} of a scan of {} partitions",
                self.partitions
            )));
        }
        let batch_size = ctx.session_config().batch_size().max(1);
        let builder = RecordBuilder::new(self.shape, self.projection.as_deref(), batch_size)?;
        let keyspace = self.snapshot.keyspace().clone();
        let keep = self.keep.clone();
        let state = Some((self.pages(), builder, false));
        let batches = stream::unfold(state, move |state| {
            let keyspace = keyspace.clone();
            let keep = keep.clone();
            async move {
                let (mut pages, mut builder, mut ended) = state?;
                loop {
                    if builder.page_done() {
                        if ended {
                            if builder.rows() == 0 {
                                return None;
                            }
                            return Some((builder.finish().map_err(DataFusionError::from), None));
                        }
                        match pages.next().await {
                            Some(Ok(page)) => builder.set_page(page, false),
                            Some(Err(err)) => return Some((Err(super::to_datafusion(err)), None)),
                            None => {
                                ended = true;
                                builder.set_page(Page::default(), true);
                            }
                        }
                    }
                    if let Err(err) = builder.fill(&keyspace, batch_size, &keep) {
                        return Some((Err(super::to_datafusion(err)), None));
                    }
                    if builder.rows() >= batch_size {
                        let batch = builder.finish().map_err(DataFusionError::from);
                        return Some((batch, Some((pages, builder, ended))));
                    }
                }
            }
        });
        if self.partitions > 1 {
            // DataFusion polls the partitions on tasks of their own already.
            return Ok(Box::pin(RecordBatchStreamAdapter::new(
                Arc::clone(&self.schema),
                batches,
            )));
        }
        // One partition (an ordered read): the records are decoded on a task of their own,
        // up to `DECODED_AHEAD` batches ahead, while the consumer encodes and sends the ones
        // before; otherwise the one task polling the response would do both in turn.
        let mut ahead =
            RecordBatchReceiverStreamBuilder::new(Arc::clone(&self.schema), DECODED_AHEAD);
        let sender = ahead.tx();
        ahead.spawn(async move {
            let mut batches = std::pin::pin!(batches);
            while let Some(batch) = batches.next().await {
                let failed = batch.is_err();
                if sender.send(batch).await.is_err() || failed {
                    break;
                }
            }
            Ok(())
        });
        Ok(ahead.build())
    }
}

/// How many batches an ordered scan decodes ahead of its consumer.
const DECODED_AHEAD: usize = 2;

/// The id ranges of a set, as the catalog takes them.
#[must_use]
pub fn id_ranges(ids: &IdSet) -> Vec<RangeInclusive<i64>> {
    ids.ranges().to_vec()
}
