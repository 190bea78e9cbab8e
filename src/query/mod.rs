//! DataFusion integration: the three catalog tables as table providers over one snapshot,
//! and the client's SQL run over them.
//!
//! Every query plans against a fresh [`crate::catalog::CatalogSnapshot`], so
//! a query that reads several tables (DuckLake's join) reads one consistent state. The SQL
//! surface is read-only: DDL, DML (`COPY` included) and statements are refused by DataFusion's
//! SQL options before planning, and no file-reading table functions are registered.
//!
//! This is the only module that knows DataFusion; its errors leave as [`crate::Error`].

pub mod arrow;
mod bounded;
pub mod dml;
pub mod limits;
pub mod load;
pub mod provider;
pub mod pushdown;
pub mod rewrite;
pub mod scan;

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, PoisonError};

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{MemoryCatalogProvider, MemoryCatalogProviderList, MemorySchemaProvider};
use datafusion::common::ScalarValue;
use datafusion::error::DataFusionError;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::TaskContext;
use datafusion::execution::context::SQLOptions;
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::memory_pool::{GreedyMemoryPool, TrackConsumersPool};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::session_state::{SessionState, SessionStateBuilder};
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionConfig;

use crate::catalog::{Catalog, CatalogSnapshot};
use crate::error::{Error, QueryErrorKind, Result};
use crate::model::{CatalogTable, TableId};
use provider::CatalogTableProvider;

/// The catalog name clients see.
pub const CATALOG_NAME: &str = "moraine";
/// The schema name clients see.
pub const SCHEMA_NAME: &str = "main";

/// Runs read-only SQL over the catalog tables.
#[derive(Clone)]
pub struct QueryEngine {
    catalog: Catalog,
    base: SessionState,
    /// What every execution runs with: the base state's configuration and functions.
    task: Arc<TaskContext>,
    fast: FastPaths,
    limits: QueryLimits,
    plans: Arc<Mutex<PlanCache>>,
}

/// What one query may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueryLimits {
    /// Memory all running queries' operators (sorts, joins, aggregates) may hold together;
    /// a query that needs more fails with `RESOURCE_EXHAUSTED`. Nothing spills to disk.
    pub memory_bytes: usize,
    /// How long a statement may run, from planning to its last row.
    pub statement_timeout: std::time::Duration,
    /// Most rows, and bytes of Arrow data, one `INSERT … SELECT` may produce: checked while
    /// its rows are read, so it is refused before it outgrows what a transaction may stage.
    pub write_rows: u64,
    /// See `write_rows`.
    pub write_bytes: u64,
}

impl Default for QueryLimits {
    fn default() -> Self {
        Self {
            memory_bytes: 1 << 30,
            statement_timeout: std::time::Duration::from_mins(10),
            write_rows: 2_000_000,
            write_bytes: 512 << 20,
        }
    }
}

/// The engine's fast paths, each of which must return exactly the rows of the plain plan: the
/// differential tests run every query with each on and off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FastPaths {
    /// Filters on `table_id`, `mapping_id` and `data_file_id` read only their key or index
    /// ranges (off: every scan reads the whole table and DataFusion filters).
    pub key_ranges: bool,
    /// DuckLake's join of the two mapping tables reads the joined table straight from the
    /// mapping records (off: DataFusion joins and sorts the two tables).
    pub mapping_load: bool,
    /// A scan by key ranges runs as several partitions (off: one).
    pub partitions: bool,
}

impl FastPaths {
    /// Every fast path.
    pub const ALL: FastPaths = FastPaths {
        key_ranges: true,
        mapping_load: true,
        partitions: true,
    };

    /// None: the plain plan.
    pub const NONE: FastPaths = FastPaths {
        key_ranges: false,
        mapping_load: false,
        partitions: false,
    };
}

impl std::fmt::Debug for QueryEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueryEngine").finish_non_exhaustive()
    }
}

/// A planned query: its result schema and the positional parameters it takes.
#[derive(Debug, Clone)]
pub struct QueryShape {
    /// The schema of the result stream.
    pub schema: SchemaRef,
    /// The parameters as Flight SQL names them (`"0"`, `"1"`, …), nullable, typed where
    /// DataFusion could infer the type.
    pub parameters: SchemaRef,
}

/// How many planned statements the engine keeps.
const PLAN_CACHE: usize = 256;

/// A statement planned once and kept: its logical plan, its parameters and, when it takes
/// none, its physical plan, whose scans read an empty store until an execution binds them
/// to its snapshot ([`bound_to`]), so that a repeated query is neither optimized nor planned
/// again. With parameters, it is optimized and planned once they are bound, so that their
/// values reach the scans as key ranges.
#[derive(Debug)]
struct Planned {
    plan: LogicalPlan,
    physical: Option<Arc<dyn ExecutionPlan>>,
    parameters: SchemaRef,
    /// The catalog table the statement reads whole, as [`QueryEngine::whole_table`] says.
    whole: Option<CatalogTable>,
}

impl Planned {
    /// The schema of its results, when it takes no parameters.
    fn schema(&self) -> Option<SchemaRef> {
        self.physical.as_ref().map(|physical| physical.schema())
    }
}

/// `kept` reading `snapshot`: every catalog scan bound to it, every other operator with its
/// state reset (a hash join's build side, a sort's dynamic filter), as DataFusion resets a
/// plan it runs again.
fn bound_to(
    kept: &Arc<dyn ExecutionPlan>,
    snapshot: &CatalogSnapshot,
) -> Result<Arc<dyn ExecutionPlan>> {
    use datafusion::common::tree_node::{Transformed, TreeNode as _};
    Arc::clone(kept)
        .transform_up(|node| {
            let fresh: Arc<dyn ExecutionPlan> = match node.downcast_ref::<scan::CatalogScanExec>() {
                Some(scan) => Arc::new(scan.at(snapshot.clone())),
                None => node.reset_state()?,
            };
            Ok(Transformed::yes(fresh))
        })
        .map(|bound| bound.data)
        .map_err(from_datafusion)
}

tokio::task_local! {
    /// The snapshot the scans being planned read. The table providers are shared by every
    /// query; physical planning runs inside this scope, so that no session state is built
    /// per query.
    static PLANNING_SNAPSHOT: CatalogSnapshot;
}

/// The snapshot of the query whose scans are being planned.
pub(crate) fn snapshot_of(
    _state: &dyn datafusion::catalog::Session,
) -> datafusion::error::Result<CatalogSnapshot> {
    PLANNING_SNAPSHOT
        .try_with(CatalogSnapshot::clone)
        .map_err(|_| {
            DataFusionError::Internal("a catalog scan planned outside a query's snapshot".into())
        })
}

/// Planned statements by SQL text, least recently used first out.
#[derive(Debug, Default)]
struct PlanCache {
    entries: HashMap<String, (Arc<Planned>, u64)>,
    clock: u64,
}

impl PlanCache {
    fn get(&mut self, sql: &str) -> Option<Arc<Planned>> {
        self.clock += 1;
        let clock = self.clock;
        self.entries.get_mut(sql).map(|(planned, used)| {
            *used = clock;
            Arc::clone(planned)
        })
    }

    fn insert(&mut self, sql: &str, planned: Arc<Planned>) {
        if self.entries.len() >= PLAN_CACHE
            && let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(sql, _)| sql.clone())
        {
            self.entries.remove(&oldest);
        }
        self.clock += 1;
        self.entries.insert(sql.to_owned(), (planned, self.clock));
    }
}

impl QueryEngine {
    /// An engine over `catalog`.
    #[must_use]
    pub fn new(catalog: Catalog) -> Self {
        Self::with_limits(catalog, FastPaths::ALL, QueryLimits::default())
    }

    /// An engine over `catalog` with only the fast paths `fast` on.
    #[must_use]
    pub fn with_fast_paths(catalog: Catalog, fast: FastPaths) -> Self {
        Self::with_limits(catalog, fast, QueryLimits::default())
    }

    /// An engine over `catalog` with the fast paths `fast` and the limits `limits`.
    ///
    /// # Panics
    /// Never: the catalog's tables register under fixed, distinct names, and the runtime's
    /// settings are all valid.
    #[must_use]
    pub fn with_limits(catalog: Catalog, fast: FastPaths, limits: QueryLimits) -> Self {
        let config = SessionConfig::new()
            .with_default_catalog_and_schema(CATALOG_NAME, SCHEMA_NAME)
            .with_create_default_catalog_and_schema(false)
            .with_information_schema(false);
        let schema = MemorySchemaProvider::new();
        for table in CatalogTable::ALL {
            let provider = Arc::new(CatalogTableProvider::new(table, catalog.ducklake(), fast));
            let _ = datafusion::catalog::SchemaProvider::register_table(
                &schema,
                table.name().to_owned(),
                provider,
            );
        }
        let _ = datafusion::catalog::SchemaProvider::register_table(
            &schema,
            load::MAPPING_LOAD_TABLE.to_owned(),
            Arc::new(load::MappingLoadProvider),
        );
        let tables = MemoryCatalogProvider::new();
        let _ = datafusion::catalog::CatalogProvider::register_schema(
            &tables,
            SCHEMA_NAME,
            Arc::new(schema),
        );
        let catalogs = MemoryCatalogProviderList::new();
        datafusion::catalog::CatalogProviderList::register_catalog(
            &catalogs,
            CATALOG_NAME.to_owned(),
            Arc::new(tables),
        );
        let mut builder = SessionStateBuilder::new()
            .with_config(config)
            .with_default_features()
            .with_catalog_list(Arc::new(catalogs));
        // One pool for every query, and no spilling: a query that does not fit is refused,
        // it does not fill the disk. Building this runtime cannot fail (no directories).
        if let Ok(runtime) = RuntimeEnvBuilder::new()
            .with_memory_pool(Arc::new(TrackConsumersPool::new(
                GreedyMemoryPool::new(limits.memory_bytes),
                NonZeroUsize::MIN.saturating_add(2),
            )))
            .with_disk_manager_builder(
                DiskManagerBuilder::default().with_mode(DiskManagerMode::Disabled),
            )
            .build_arc()
        {
            builder = builder.with_runtime_env(runtime);
        }
        let mut base = builder.build();
        bounded::register(&mut base);
        Self {
            catalog,
            task: base.task_ctx(),
            base,
            fast,
            limits,
            plans: Arc::new(Mutex::new(PlanCache::default())),
        }
    }

    /// The catalog queried.
    #[must_use]
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// Plans the scans of `plan` against `snapshot`; `optimized` says whether `plan` is
    /// optimized already.
    async fn plan_physical(
        &self,
        snapshot: &CatalogSnapshot,
        plan: &LogicalPlan,
        optimized: bool,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let planning = async {
            if optimized {
                self.base
                    .query_planner()
                    .create_physical_plan(plan, &self.base)
                    .await
            } else {
                self.base.create_physical_plan(plan).await
            }
        };
        PLANNING_SNAPSHOT
            .scope(snapshot.clone(), planning)
            .await
            .map_err(from_datafusion)
    }

    /// `sql` planned, from the cache when it was planned before. The plan reads no snapshot:
    /// its scans are planned against `snapshot` detached from its store.
    async fn planned(&self, sql: &str, snapshot: &CatalogSnapshot) -> Result<Arc<Planned>> {
        if let Some(planned) = self.cached(sql) {
            return Ok(planned);
        }
        limits::check_sql(sql)?;
        let state = &self.base;
        let dialect = state.config().options().sql_parser.dialect;
        let mut statement = state
            .sql_to_statement(sql, &dialect)
            .map_err(from_datafusion)?;
        if touches_files(&statement) {
            return Err(Error::Query {
                kind: QueryErrorKind::Invalid,
                message:
                    "the SQL surface is read-only: COPY and CREATE EXTERNAL TABLE are not supported"
                        .into(),
            });
        }
        let whole = whole_table_of(&statement);
        normalize(&mut statement, self.fast.mapping_load);
        let plan = state
            .statement_to_plan(statement)
            .await
            .map_err(from_datafusion)?;
        SQLOptions::new()
            .with_allow_ddl(false)
            .with_allow_dml(false)
            .with_allow_statements(false)
            .verify_plan(&plan)
            .map_err(from_datafusion)?;
        let types = plan.get_parameter_types().map_err(from_datafusion)?;
        let physical = if types.is_empty() {
            let optimized = state.optimize(&plan).map_err(from_datafusion)?;
            Some(
                self.plan_physical(&snapshot.detached(), &optimized, true)
                    .await?,
            )
        } else {
            None
        };
        let planned = Arc::new(Planned {
            parameters: parameter_schema(&types),
            physical,
            plan,
            whole,
        });
        self.plans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(sql, Arc::clone(&planned));
        Ok(planned)
    }

    /// `sql` planned before, from the cache: a read-only query, which passed the SQL limits.
    fn cached(&self, sql: &str) -> Option<Arc<Planned>> {
        self.plans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(sql)
    }

    /// Whether `sql` was planned before as a query: then it is no write statement, and
    /// nothing about it needs parsing again.
    pub(crate) fn is_planned_query(&self, sql: &str) -> bool {
        self.cached(sql).is_some()
    }

    /// The physical plan of `sql` with `params` bound, reading `snapshot`.
    async fn physical(
        &self,
        snapshot: &CatalogSnapshot,
        sql: &str,
        params: Vec<ScalarValue>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let planned = self.planned(sql, snapshot).await?;
        if let (Some(kept), true) = (&planned.physical, params.is_empty()) {
            return bound_to(kept, snapshot);
        }
        let bound = planned
            .plan
            .clone()
            .with_param_values(params)
            .map_err(from_datafusion)?;
        self.plan_physical(snapshot, &bound, false).await
    }

    /// Plans `sql` without running it: the result schema and the parameters.
    ///
    /// # Errors
    /// [`Error::Query`] for SQL that does not parse or plan, or is not read-only.
    pub async fn shape(&self, sql: &str) -> Result<QueryShape> {
        let snapshot = self.catalog.snapshot().await?;
        let planned = self.planned(sql, &snapshot).await?;
        let schema = planned
            .schema()
            .unwrap_or_else(|| Arc::new(planned.plan.schema().as_arrow().clone()));
        Ok(QueryShape {
            schema,
            parameters: Arc::clone(&planned.parameters),
        })
    }

    /// The schema the stream of `sql` with `params` will have.
    ///
    /// # Errors
    /// As [`execute`](Self::execute).
    pub async fn schema(&self, sql: &str, params: Vec<ScalarValue>) -> Result<SchemaRef> {
        let snapshot = self.catalog.snapshot().await?;
        self.schema_at(&snapshot, sql, params).await
    }

    /// The schema the stream of `sql` with `params` will have, reading `snapshot`.
    ///
    /// # Errors
    /// As [`execute`](Self::execute).
    pub async fn schema_at(
        &self,
        snapshot: &CatalogSnapshot,
        sql: &str,
        params: Vec<ScalarValue>,
    ) -> Result<SchemaRef> {
        if params.is_empty()
            && let Some(schema) = self.planned(sql, snapshot).await?.schema()
        {
            return Ok(schema);
        }
        Ok(self.physical(snapshot, sql, params).await?.schema())
    }

    /// Runs `sql` with positional `params` over a fresh snapshot and streams the result.
    ///
    /// # Errors
    /// [`Error::Query`] for bad SQL or parameters; errors of the scan arrive in the stream.
    pub async fn execute(
        &self,
        sql: &str,
        params: Vec<ScalarValue>,
    ) -> Result<SendableRecordBatchStream> {
        let snapshot = self.catalog.snapshot().await?;
        self.execute_at(&snapshot, sql, params).await
    }

    /// Runs `sql` with positional `params` reading `snapshot` (a transaction's view) and
    /// streams the result.
    ///
    /// # Errors
    /// As [`execute`](Self::execute).
    pub async fn execute_at(
        &self,
        snapshot: &CatalogSnapshot,
        sql: &str,
        params: Vec<ScalarValue>,
    ) -> Result<SendableRecordBatchStream> {
        let physical = self.physical(snapshot, sql, params).await?;
        self.run(physical)
    }

    /// Runs a physical plan, to end with an error when the statement timeout passes.
    fn run(&self, physical: Arc<dyn ExecutionPlan>) -> Result<SendableRecordBatchStream> {
        let stream = datafusion::physical_plan::execute_stream(physical, Arc::clone(&self.task))
            .map_err(from_datafusion)?;
        Ok(limits::with_deadline(stream, self.limits.statement_timeout))
    }

    /// The catalog table `sql` reads whole, when it is exactly `SELECT * FROM <table>` (the
    /// name qualified or not): a read that may be served as parallel parts. A query planned
    /// before is answered from the plan cache, without parsing it again.
    #[must_use]
    pub fn whole_table(&self, sql: &str) -> Option<CatalogTable> {
        if let Some(planned) = self.cached(sql) {
            return planned.whole;
        }
        let dialect = self.base.config().options().sql_parser.dialect;
        let statement = self.base.sql_to_statement(sql, &dialect).ok()?;
        whole_table_of(&statement)
    }

    /// Streams the rows of `table` in the DuckLake tables `tables` at `snapshot`, in key
    /// order (`table_id`, then the row's id): one part of a whole-table read.
    ///
    /// # Errors
    /// As [`execute`](Self::execute).
    pub fn scan_part(
        &self,
        snapshot: &CatalogSnapshot,
        table: CatalogTable,
        tables: std::ops::RangeInclusive<i64>,
    ) -> Result<SendableRecordBatchStream> {
        let kind = provider::row_kind(table);
        let ids = pushdown::IdSet::range(tables.clone());
        let scan = scan::CatalogScanExec::try_new(
            arrow::Shape::Table(table),
            snapshot.clone(),
            scan::Access::Ranges {
                ranges: vec![
                    snapshot
                        .keyspace()
                        .table_span(kind, TableId(*tables.start())..=TableId(*tables.end())),
                ],
                tables: Some(ids),
            },
            arrow::Keep::default(),
            self.catalog
                .ducklake()
                .positions(table)
                .map(<[usize]>::to_vec),
            1,
            None,
        )
        .map_err(from_datafusion)?;
        self.run(Arc::new(scan))
    }

    /// Streams one catalog table, optionally only the rows of one DuckLake table.
    ///
    /// # Errors
    /// As [`execute`](Self::execute).
    pub async fn scan_table(
        &self,
        table: CatalogTable,
        table_id: Option<i64>,
    ) -> Result<SendableRecordBatchStream> {
        let sql = match table_id {
            Some(id) => format!("SELECT * FROM {} WHERE table_id = {id}", table.name()),
            None => format!("SELECT * FROM {}", table.name()),
        };
        self.execute(&sql, Vec::new()).await
    }
}

/// The normalizations of [`rewrite`], also under `EXPLAIN`, so that it shows the plan the
/// statement runs with.
fn normalize(statement: &mut datafusion::sql::parser::Statement, mapping_load: bool) {
    use datafusion::sql::parser::Statement;
    match statement {
        Statement::Statement(inner) => rewrite::normalize(inner, mapping_load),
        Statement::Explain(explain) => normalize(&mut explain.statement, mapping_load),
        _ => {}
    }
}

/// Statements refused before planning, since planning them already resolves file formats and
/// paths: `COPY` and `CREATE EXTERNAL TABLE`, also under `EXPLAIN`.
fn touches_files(statement: &datafusion::sql::parser::Statement) -> bool {
    use datafusion::sql::parser::Statement;
    match statement {
        Statement::CopyTo(_) | Statement::CreateExternalTable(_) => true,
        Statement::Explain(explain) => touches_files(&explain.statement),
        Statement::Statement(_) | Statement::Reset(_) => false,
    }
}

/// `$1`, `$2`, … as Flight SQL's positional fields `"0"`, `"1"`, …
fn parameter_schema(types: &HashMap<String, Option<DataType>>) -> SchemaRef {
    let mut numbered: Vec<(usize, DataType)> = types
        .iter()
        .filter_map(|(name, ty)| {
            let n: usize = name.strip_prefix('$')?.parse().ok()?;
            Some((n, ty.clone().unwrap_or(DataType::Null)))
        })
        .collect();
    numbered.sort_by_key(|(n, _)| *n);
    Arc::new(Schema::new(
        numbered
            .into_iter()
            .map(|(n, ty)| Field::new(n.saturating_sub(1).to_string(), ty, true))
            .collect::<Vec<_>>(),
    ))
}

/// Our error, carried through DataFusion.
pub(crate) fn to_datafusion(err: Error) -> DataFusionError {
    DataFusionError::External(Box::new(err))
}

/// A DataFusion error as ours: our own errors come back out; DataFusion's are classified.
#[must_use]
#[allow(clippy::needless_pass_by_value, reason = "used as a map_err adaptor")]
pub fn from_datafusion(err: DataFusionError) -> Error {
    let root = err.find_root();
    if let DataFusionError::External(inner) = root
        && let Some(ours) = inner.downcast_ref::<Error>()
    {
        return ours.clone();
    }
    let kind = match root {
        DataFusionError::SQL(..)
        | DataFusionError::Plan(_)
        | DataFusionError::SchemaError(..)
        | DataFusionError::NotImplemented(_)
        | DataFusionError::Configuration(_) => QueryErrorKind::Invalid,
        DataFusionError::ResourcesExhausted(_) => QueryErrorKind::ResourcesExhausted,
        DataFusionError::Execution(_) | DataFusionError::ArrowError(..) => {
            QueryErrorKind::Execution
        }
        _ => QueryErrorKind::Internal,
    };
    Error::Query {
        kind,
        message: root.to_string(),
    }
}

/// The catalog table `statement` reads whole, when it is exactly `SELECT * FROM <table>`.
fn whole_table_of(statement: &datafusion::sql::parser::Statement) -> Option<CatalogTable> {
    use datafusion::sql::sqlparser::ast::{
        SelectItem, SetExpr, Statement, TableFactor, WildcardAdditionalOptions,
    };
    let datafusion::sql::parser::Statement::Statement(statement) = statement else {
        return None;
    };
    let Statement::Query(query) = statement.as_ref() else {
        return None;
    };

    let plain_query = query.with.is_none()
        && query.order_by.is_none()
        && query.limit_clause.is_none()
        && query.fetch.is_none()
        && query.locks.is_empty();
    let SetExpr::Select(select) = query.body.as_ref() else {
        return None;
    };
    let plain_select = plain_query
        && select.distinct.is_none()
        && select.top.is_none()
        && select.selection.is_none()
        && select.having.is_none()
        && select.qualify.is_none()
        && select.named_window.is_empty()
        && select.lateral_views.is_empty()
        && matches!(&select.group_by, datafusion::sql::sqlparser::ast::GroupByExpr::Expressions(e, m) if e.is_empty() && m.is_empty())
        && matches!(select.projection.as_slice(), [SelectItem::Wildcard(options)] if *options == WildcardAdditionalOptions::default());
    let [from] = select.from.as_slice() else {
        return None;
    };
    if !plain_select || !from.joins.is_empty() {
        return None;
    }
    let TableFactor::Table {
        name,
        alias: None,
        args: None,
        with_hints,
        version: None,
        partitions,
        ..
    } = &from.relation
    else {
        return None;
    };
    if !with_hints.is_empty() || !partitions.is_empty() {
        return None;
    }
    let parts: Vec<String> = name
        .0
        .iter()
        .map(|part| {
            // Unquoted names are folded to lower case, as the planner folds them.
            part.as_ident().map(|ident| match ident.quote_style {
                Some(_) => ident.value.clone(),
                None => ident.value.to_lowercase(),
            })
        })
        .collect::<Option<_>>()?;
    let (table, qualifiers) = parts.split_last()?;
    let known = match qualifiers {
        [] => true,
        [schema] => schema == SCHEMA_NAME,
        [catalog, schema] => catalog == CATALOG_NAME && schema == SCHEMA_NAME,
        _ => false,
    };
    known.then(|| CatalogTable::from_name(table)).flatten()
}
