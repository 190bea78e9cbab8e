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
pub mod dml;
pub mod load;
pub mod provider;
pub mod pushdown;
pub mod rewrite;
pub mod scan;

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{MemoryCatalogProvider, MemoryCatalogProviderList, MemorySchemaProvider};
use datafusion::common::ScalarValue;
use datafusion::error::DataFusionError;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::context::SQLOptions;
use datafusion::execution::session_state::{SessionState, SessionStateBuilder};
use datafusion::prelude::{DataFrame, SessionConfig, SessionContext};

use crate::catalog::{Catalog, CatalogSnapshot};
use crate::error::{Error, QueryErrorKind, Result};
use crate::model::CatalogTable;
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
    fast: FastPaths,
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

impl QueryEngine {
    /// An engine over `catalog`.
    #[must_use]
    pub fn new(catalog: Catalog) -> Self {
        Self::with_fast_paths(catalog, FastPaths::ALL)
    }

    /// An engine over `catalog` with only the fast paths `fast` on.
    #[must_use]
    pub fn with_fast_paths(catalog: Catalog, fast: FastPaths) -> Self {
        let config = SessionConfig::new()
            .with_default_catalog_and_schema(CATALOG_NAME, SCHEMA_NAME)
            .with_create_default_catalog_and_schema(false)
            .with_information_schema(false);
        let base = SessionStateBuilder::new()
            .with_config(config)
            .with_default_features()
            .build();
        Self {
            catalog,
            base,
            fast,
        }
    }

    /// The catalog queried.
    #[must_use]
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// A session whose catalog tables read `snapshot`.
    fn session(&self, snapshot: &CatalogSnapshot) -> Result<SessionContext> {
        let schema = MemorySchemaProvider::new();
        for table in CatalogTable::ALL {
            let provider = Arc::new(CatalogTableProvider::new(
                table,
                snapshot.clone(),
                self.fast,
            ));
            datafusion::catalog::SchemaProvider::register_table(
                &schema,
                table.name().to_owned(),
                provider,
            )
            .map_err(from_datafusion)?;
        }
        datafusion::catalog::SchemaProvider::register_table(
            &schema,
            load::MAPPING_LOAD_TABLE.to_owned(),
            Arc::new(load::MappingLoadProvider::new(snapshot.clone())),
        )
        .map_err(from_datafusion)?;
        let catalog = MemoryCatalogProvider::new();
        datafusion::catalog::CatalogProvider::register_schema(
            &catalog,
            SCHEMA_NAME,
            Arc::new(schema),
        )
        .map_err(from_datafusion)?;
        let catalogs = MemoryCatalogProviderList::new();
        datafusion::catalog::CatalogProviderList::register_catalog(
            &catalogs,
            CATALOG_NAME.to_owned(),
            Arc::new(catalog),
        );
        let state = SessionStateBuilder::new_from_existing(self.base.clone())
            .with_catalog_list(Arc::new(catalogs))
            .build();
        Ok(SessionContext::new_with_state(state))
    }

    async fn dataframe(
        &self,
        snapshot: &CatalogSnapshot,
        sql: &str,
        params: Vec<ScalarValue>,
    ) -> Result<DataFrame> {
        let ctx = self.session(snapshot)?;
        let options = SQLOptions::new()
            .with_allow_ddl(false)
            .with_allow_dml(false)
            .with_allow_statements(false);
        let state = ctx.state();
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
        normalize(&mut statement, self.fast.mapping_load);
        let plan = state
            .statement_to_plan(statement)
            .await
            .map_err(from_datafusion)?;
        options.verify_plan(&plan).map_err(from_datafusion)?;
        let frame = ctx
            .execute_logical_plan(plan)
            .await
            .map_err(from_datafusion)?;
        if params.is_empty() {
            Ok(frame)
        } else {
            frame.with_param_values(params).map_err(from_datafusion)
        }
    }

    /// Plans `sql` without running it: the result schema and the parameters.
    ///
    /// # Errors
    /// [`Error::Query`] for SQL that does not parse or plan, or is not read-only.
    pub async fn shape(&self, sql: &str) -> Result<QueryShape> {
        let snapshot = self.catalog.snapshot().await?;
        let frame = self.dataframe(&snapshot, sql, Vec::new()).await?;
        let types = frame
            .logical_plan()
            .get_parameter_types()
            .map_err(from_datafusion)?;
        let parameters = parameter_schema(&types);
        let schema = if types.is_empty() {
            frame
                .create_physical_plan()
                .await
                .map_err(from_datafusion)?
                .schema()
        } else {
            Arc::new(frame.schema().as_arrow().clone())
        };
        Ok(QueryShape { schema, parameters })
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
        let frame = self.dataframe(snapshot, sql, params).await?;
        Ok(frame
            .create_physical_plan()
            .await
            .map_err(from_datafusion)?
            .schema())
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
        let frame = self.dataframe(snapshot, sql, params).await?;
        frame.execute_stream().await.map_err(from_datafusion)
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
