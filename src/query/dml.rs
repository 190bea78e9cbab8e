//! Write statements (`INSERT`, `DELETE`, `UPDATE`) turned into staged changes.
//!
//! A statement is checked for the shapes the catalog takes, then planned by DataFusion as
//! what it is (`LogicalPlan::Dml`), and its rows are found by running that plan's input
//! against the view it writes to (the latest state, or a transaction's view of its own staged
//! changes): for `DELETE FROM t WHERE p` the filtered scan, of which the keys are read and
//! exactly those deleted; for `UPDATE ducklake_data_file SET end_snapshot = e WHERE p` the
//! filtered scan with each file's current `end_snapshot` and the value of `e`. `INSERT INTO t
//! [(cols)] <query>` runs DataFusion's plan of the query, its columns named by the table's
//! columns they go to, but not DataFusion's INSERT plan: that casts every value to its
//! column's type (and types `VALUES` by the columns), so a value that does not fit would fail
//! as an Arrow cast naming neither column nor row; the catalog's own decoder checks each value
//! instead, and names both.
//! Filters on `table_id`, `mapping_id` and `data_file_id` reach the scans as key ranges, as for
//! any query. What the query's scans read is held until the commit ([`Hold`]), so that a
//! concurrent change there conflicts with the statement. The changes are then staged and
//! validated like any other.

use std::ops::ControlFlow;
use std::sync::Arc;

use datafusion::arrow::array::AsArray as _;
use datafusion::arrow::datatypes::{DataType, Int64Type, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::ScalarValue;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::logical_expr::{Expr, ExprSchemable as _, LogicalPlan, LogicalPlanBuilder, col};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{
    AssignmentTarget, Delete, Expr as SqlExpr, FromTable, Ident, Insert, ObjectName, Statement,
    TableFactor, TableObject, TableWithJoins, Update as SqlUpdate, visit_expressions_mut,
};
use futures::TryStreamExt as _;

use super::scan::CatalogScanExec;
use super::{QueryEngine, from_datafusion, rewrite};
use crate::catalog::CatalogSnapshot;
use crate::error::{Error, Limit, Result};
use crate::model::{CatalogTable, DataFileId, MappingId};
use crate::write::decode::{MissingColumns, RowDecoder, RowShape};
use crate::write::{Delete as DeleteOp, EndTarget, Hold, Op, Update};

/// A write statement, parsed and checked, ready to find its rows.
#[derive(Debug, Clone)]
pub struct WriteStatement {
    table: CatalogTable,
    action: Action,
    /// What DataFusion plans (normalized, placeholders numbered): the statement, or an
    /// INSERT's source query; `None` for a refused statement.
    statement: Option<Box<Statement>>,
}

#[derive(Debug, Clone)]
enum Action {
    Delete,
    /// `SET end_snapshot = <value>`: the rows are `data_file_id, end_snapshot, value`.
    EndDataFiles,
    /// Refused when staged, with this change's violation.
    Refused(Op),
    /// The rows are the source query's; its columns go to the named columns, or (`None`)
    /// all of the table's in the deployment's DuckLake version, in order.
    Insert {
        columns: Option<Vec<String>>,
    },
}

fn invalid(reason: String) -> Error {
    Error::Query {
        kind: crate::error::QueryErrorKind::Invalid,
        message: reason,
    }
}

fn unsupported(what: String) -> Error {
    Error::Unsupported { what }
}

/// The catalog table an object name refers to: `t`, `main.t` or `moraine.main.t`.
fn table_of(name: &ObjectName) -> Result<CatalogTable> {
    let parts: Vec<String> = name
        .0
        .iter()
        .filter_map(|part| part.as_ident().map(|i| i.value.clone()))
        .collect();
    let table = match parts.as_slice() {
        [table] => Some(table),
        [schema, table] if schema.eq_ignore_ascii_case(super::SCHEMA_NAME) => Some(table),
        [catalog, schema, table]
            if catalog.eq_ignore_ascii_case(super::CATALOG_NAME)
                && schema.eq_ignore_ascii_case(super::SCHEMA_NAME) =>
        {
            Some(table)
        }
        _ => None,
    };
    table
        .and_then(|t| CatalogTable::from_name(t))
        .ok_or_else(|| Error::NotFound {
            what: crate::error::Named::Table(name.to_string()),
        })
}

/// The one plain table a statement writes, and its alias.
fn target(from: &[TableWithJoins]) -> Result<(CatalogTable, Option<String>)> {
    let [from] = from else {
        return Err(unsupported(
            "a write statement over more than one table is not supported".into(),
        ));
    };
    if !from.joins.is_empty() {
        return Err(unsupported(
            "a write statement with a JOIN is not supported".into(),
        ));
    }
    let TableFactor::Table { name, alias, .. } = &from.relation else {
        return Err(unsupported(format!(
            "writing to {} is not supported",
            from.relation
        )));
    };
    Ok((
        table_of(name)?,
        alias.as_ref().map(|a| a.name.value.clone()),
    ))
}

/// `delete` with its table's alias (DuckLake's orphan sweep has one) replaced by the table's
/// name, which is what DataFusion's DELETE plan qualifies the table's columns with.
fn without_alias(delete: &mut Delete, table: CatalogTable, alias: &str) {
    let (FromTable::WithFromKeyword(from) | FromTable::WithoutKeyword(from)) = &mut delete.from;
    for from in from.iter_mut() {
        if let TableFactor::Table { alias: slot, .. } = &mut from.relation {
            *slot = None;
        }
    }
    if let Some(selection) = delete.selection.as_mut() {
        let _ = visit_expressions_mut(selection, |expr| {
            if let SqlExpr::CompoundIdentifier(parts) = expr
                && let [qualifier, _] = parts.as_mut_slice()
                && qualifier.value.eq_ignore_ascii_case(alias)
            {
                *qualifier = Ident::new(table.name());
            }
            ControlFlow::<()>::Continue(())
        });
    }
}

fn parse_delete(mut delete: Delete) -> Result<WriteStatement> {
    if !delete.tables.is_empty()
        || delete.using.is_some()
        || delete.returning.is_some()
        || delete.output.is_some()
        || !delete.order_by.is_empty()
        || delete.limit.is_some()
    {
        return Err(unsupported(
            "DELETE supports FROM <table> [WHERE ...] only (no USING, RETURNING, ORDER BY or LIMIT)"
                .into(),
        ));
    }
    let (FromTable::WithFromKeyword(from) | FromTable::WithoutKeyword(from)) = &delete.from;
    let (table, alias) = target(from)?;
    if let Some(alias) = alias {
        without_alias(&mut delete, table, &alias);
    }
    Ok(WriteStatement {
        table,
        action: Action::Delete,
        statement: Some(Box::new(Statement::Delete(delete))),
    })
}

fn parse_update(update: &SqlUpdate) -> Result<WriteStatement> {
    if update.from.is_some()
        || update.returning.is_some()
        || update.output.is_some()
        || update.or.is_some()
        || !update.order_by.is_empty()
        || update.limit.is_some()
    {
        return Err(unsupported(
            "UPDATE supports <table> SET ... [WHERE ...] only (no FROM, RETURNING, ORDER BY or LIMIT)"
                .into(),
        ));
    }
    let (table, _) = target(std::slice::from_ref(&update.table))?;
    let refused = |op| WriteStatement {
        table,
        action: Action::Refused(op),
        statement: None,
    };
    if table != CatalogTable::DataFile {
        return Ok(refused(Op::Update(Update::MappingTable(table))));
    }
    let ends = match update.assignments.as_slice() {
        [assignment] => match &assignment.target {
            AssignmentTarget::ColumnName(column) => column
                .0
                .last()
                .and_then(|p| p.as_ident())
                .is_some_and(|i| i.value.eq_ignore_ascii_case("end_snapshot")),
            AssignmentTarget::Tuple(_) => false,
        },
        _ => false,
    };
    if !ends {
        let description = update
            .assignments
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        return Ok(refused(Op::Update(Update::OtherDataFileUpdate {
            description: format!("SET {description}"),
        })));
    }
    Ok(WriteStatement {
        table,
        action: Action::EndDataFiles,
        statement: Some(Box::new(Statement::Update(update.clone()))),
    })
}

fn parse_insert(insert: &Insert) -> Result<WriteStatement> {
    let TableObject::TableName(name) = &insert.table else {
        return Err(unsupported(
            "INSERT INTO a table function is not supported".into(),
        ));
    };
    let table = table_of(name)?;
    if insert.overwrite
        || insert.on.is_some()
        || insert.returning.is_some()
        || insert.output.is_some()
        || insert.or.is_some()
        || insert.ignore
        || insert.replace_into
        || insert.partitioned.is_some()
        || !insert.assignments.is_empty()
    {
        return Err(unsupported(format!(
            "INSERT into {table} supports [(columns)] VALUES ... or SELECT ... only"
        )));
    }
    let Some(source) = &insert.source else {
        return Err(invalid(format!("INSERT into {table} has no rows")));
    };
    let columns: Option<Vec<String>> = (!insert.columns.is_empty()).then(|| {
        insert
            .columns
            .iter()
            .map(|c| {
                c.0.last()
                    .and_then(|p| p.as_ident())
                    .map_or_else(|| c.to_string(), |i| i.value.clone())
            })
            .collect()
    });
    Ok(WriteStatement {
        table,
        action: Action::Insert { columns },
        statement: Some(Box::new(Statement::Query(source.clone()))),
    })
}

impl QueryEngine {
    /// The write statement `sql` is, or `None` for anything else (a query, or SQL that does
    /// not parse: the read path reports that). A query planned before is known from the plan
    /// cache, without parsing it again.
    ///
    /// # Errors
    /// For a write statement of a shape not supported, or to an unknown table.
    pub fn write_statement(&self, sql: &str) -> Result<Option<WriteStatement>> {
        if self.is_planned_query(sql) {
            return Ok(None);
        }
        super::limits::check_sql(sql)?;
        let dialect = self.base.config().options().sql_parser.dialect;
        let Ok(statement) = self.base.sql_to_statement(sql, &dialect) else {
            return Ok(None);
        };
        let DfStatement::Statement(mut statement) = statement else {
            return Ok(None);
        };
        rewrite::normalize(&mut statement, self.fast.mapping_load);
        match *statement {
            Statement::Delete(delete) => parse_delete(delete).map(Some),
            Statement::Update(ref update) => parse_update(update).map(Some),
            Statement::Insert(ref insert) => parse_insert(insert).map(Some),
            _ => Ok(None),
        }
    }

    /// The plan that finds `write`'s rows, or `None` for a refused statement: DataFusion's
    /// own plan of the statement (`LogicalPlan::Dml`), of which the input is the filtered
    /// scan (DELETE) or the updated rows projected over it (UPDATE), with what the changes
    /// need projected from it; for an INSERT, the plan of its source query with its columns
    /// named by the table's columns they go to.
    async fn rows_plan(&self, write: &WriteStatement) -> Result<Option<LogicalPlan>> {
        let Some(statement) = &write.statement else {
            return Ok(None);
        };
        let plan = self
            .base
            .statement_to_plan(DfStatement::Statement(statement.clone()))
            .await
            .map_err(from_datafusion)?;
        let rows = match (&write.action, plan) {
            (Action::Insert { columns }, source) => {
                let columns = columns.clone().unwrap_or_else(|| {
                    self.catalog()
                        .ducklake()
                        .columns(write.table)
                        .iter()
                        .map(|c| c.name.to_owned())
                        .collect()
                });
                let given = source.schema().columns();
                if given.len() != columns.len() {
                    return Err(invalid(format!(
                        "INSERT into {} gives {} values per row for {} columns ({})",
                        write.table,
                        given.len(),
                        columns.len(),
                        columns.join(", ")
                    )));
                }
                let named = given
                    .into_iter()
                    .zip(columns)
                    .map(|(given, name)| Expr::Column(given).alias(name));
                LogicalPlanBuilder::from(source).project(named)
            }
            (Action::Delete, LogicalPlan::Dml(dml)) => {
                let key = match write.table {
                    CatalogTable::DataFile => "data_file_id",
                    CatalogTable::ColumnMapping | CatalogTable::NameMapping => "mapping_id",
                };
                let keys =
                    LogicalPlanBuilder::from(Arc::unwrap_or_clone(dml.input)).project([col(key)]);
                if write.table == CatalogTable::NameMapping {
                    keys.and_then(LogicalPlanBuilder::distinct)
                } else {
                    keys
                }
            }
            (Action::EndDataFiles, LogicalPlan::Dml(dml)) => {
                let LogicalPlan::Projection(updated) = Arc::unwrap_or_clone(dml.input) else {
                    return Err(unexpected_plan("UPDATE"));
                };
                // The new end_snapshot as DataFusion computes it, beside the current one.
                let Some(new) = updated
                    .schema
                    .index_of_column_by_name(None, "end_snapshot")
                    .and_then(|at| updated.expr.get(at).cloned())
                else {
                    return Err(unexpected_plan("UPDATE"));
                };
                let new = new
                    .unalias()
                    .cast_to(&DataType::Int64, updated.input.schema())
                    .map_err(from_datafusion)?;
                LogicalPlanBuilder::from(Arc::unwrap_or_clone(updated.input)).project([
                    col("data_file_id"),
                    col("end_snapshot"),
                    new.alias("new_end_snapshot"),
                ])
            }
            _ => return Err(unexpected_plan("a write statement")),
        };
        rows.and_then(LogicalPlanBuilder::build)
            .map(Some)
            .map_err(from_datafusion)
    }
}

fn unexpected_plan(what: &str) -> Error {
    Error::Internal {
        context: "planning a write statement",
        reason: format!("DataFusion planned {what} in a shape this server does not read"),
    }
}

impl QueryEngine {
    /// The parameters of a write statement, as Flight SQL names them.
    ///
    /// # Errors
    /// When the statement does not plan.
    pub async fn write_parameters(&self, write: &WriteStatement) -> Result<SchemaRef> {
        let Some(plan) = self.rows_plan(write).await? else {
            return Ok(Arc::new(Schema::empty()));
        };
        let types = plan.get_parameter_types().map_err(from_datafusion)?;
        Ok(super::parameter_schema(&types))
    }

    /// The changes `write` makes to `view` with `params` bound. Empty when it matches nothing.
    ///
    /// # Errors
    /// [`Error::Query`] when the derived query fails; [`Error::InvalidRequest`] for inserted
    /// values that do not fit the table.
    pub async fn write_ops(
        &self,
        view: &CatalogSnapshot,
        write: &WriteStatement,
        params: Vec<ScalarValue>,
    ) -> Result<Vec<Op>> {
        let Some(plan) = self.rows_plan(write).await? else {
            let Action::Refused(op) = &write.action else {
                return Ok(Vec::new());
            };
            return Ok(vec![op.clone()]);
        };
        let plan = if params.is_empty() {
            plan
        } else {
            plan.with_param_values(params).map_err(from_datafusion)?
        };
        let physical = self.plan_physical(view, &plan, false).await?;
        // What the statement reads to find its rows is held until the commit, so that a
        // concurrent change there (a file inserted into a table it ends whole) conflicts.
        let mut holds = Vec::new();
        if !matches!(write.action, Action::Insert { .. }) {
            holds_of(&physical, &mut holds);
        }
        let mut stream = self.run(physical)?;
        let mut ops = self.ops_of(write, &mut stream).await?;
        // Held even when nothing matched: a DROP of a table without files still conflicts
        // with a file inserted into it concurrently.
        ops.splice(0..0, holds.into_iter().map(Op::Hold));
        Ok(ops)
    }

    /// The changes of `write` from the rows its query streams.
    async fn ops_of(
        &self,
        write: &WriteStatement,
        stream: &mut SendableRecordBatchStream,
    ) -> Result<Vec<Op>> {
        match &write.action {
            Action::Refused(_) => Ok(Vec::new()),
            Action::Delete => {
                let mut ids = Vec::new();
                while let Some(batch) = stream.try_next().await.map_err(from_datafusion)? {
                    ids.extend(int_column(&batch, 0).into_iter().flatten());
                }
                if ids.is_empty() {
                    return Ok(Vec::new());
                }
                let op = match write.table {
                    CatalogTable::DataFile => {
                        DeleteOp::DataFiles(ids.into_iter().map(DataFileId).collect())
                    }
                    CatalogTable::ColumnMapping => {
                        DeleteOp::ColumnMappings(ids.into_iter().map(MappingId).collect())
                    }
                    CatalogTable::NameMapping => {
                        DeleteOp::NameMappings(ids.into_iter().map(MappingId).collect())
                    }
                };
                Ok(vec![Op::Delete(op)])
            }
            Action::EndDataFiles => {
                let mut ids = Vec::new();
                let mut end = None;
                while let Some(batch) = stream.try_next().await.map_err(from_datafusion)? {
                    let current = int_column(&batch, 1);
                    let values = int_column(&batch, 2);
                    for ((id, current), value) in
                        int_column(&batch, 0).into_iter().zip(current).zip(values)
                    {
                        let Some(id) = id else { continue };
                        if let Some(current) = current {
                            return Ok(vec![other_update(format!(
                                "data file {id} already ended at snapshot {current}; end_snapshot only changes from NULL (add AND end_snapshot IS NULL)"
                            ))]);
                        }
                        let Some(value) = value else {
                            return Ok(vec![other_update(format!(
                                "end_snapshot of data file {id} would be NULL"
                            ))]);
                        };
                        if end.is_some_and(|e| e != value) {
                            return Ok(vec![other_update(
                                "the new end_snapshot differs between files".into(),
                            )]);
                        }
                        end = Some(value);
                        ids.push(DataFileId(id));
                    }
                }
                let Some(end_snapshot) = end else {
                    return Ok(Vec::new());
                };
                Ok(vec![Op::Update(Update::EndDataFiles {
                    end_snapshot,
                    target: EndTarget::DataFiles(ids),
                })])
            }
            Action::Insert { .. } => {
                let mut decoder: Option<RowDecoder> = None;
                let mut ops = Vec::new();
                let (mut rows, mut bytes) = (0_u64, 0_u64);
                while let Some(batch) = stream.try_next().await.map_err(from_datafusion)? {
                    rows += batch.num_rows() as u64;
                    bytes += batch.get_array_memory_size() as u64;
                    if rows > self.limits.write_rows || bytes > self.limits.write_bytes {
                        return Err(Error::LimitExceeded {
                            limit: if rows > self.limits.write_rows {
                                Limit::TransactionRows
                            } else {
                                Limit::TransactionBytes
                            },
                            max: if rows > self.limits.write_rows {
                                self.limits.write_rows
                            } else {
                                self.limits.write_bytes
                            },
                        });
                    }
                    let decoder = match &mut decoder {
                        Some(decoder) => decoder,
                        None => decoder.insert(RowDecoder::new(
                            RowShape::Table(write.table),
                            self.catalog().ducklake(),
                            &batch.schema(),
                            MissingColumns::Null,
                        )?),
                    };
                    ops.extend(decoder.decode(&batch)?);
                }
                Ok(ops)
            }
        }
    }
}

/// What every catalog scan of `plan` reads, as holds.
fn holds_of(plan: &Arc<dyn ExecutionPlan>, out: &mut Vec<Hold>) {
    if let Some(scan) = plan.downcast_ref::<CatalogScanExec>() {
        out.push(scan.hold());
    }
    for child in plan.children() {
        holds_of(child, out);
    }
}

fn other_update(description: String) -> Op {
    Op::Update(Update::OtherDataFileUpdate { description })
}

fn int_column(batch: &RecordBatch, column: usize) -> Vec<Option<i64>> {
    batch
        .columns()
        .get(column)
        .and_then(|a| a.as_primitive_opt::<Int64Type>())
        .map_or_else(|| vec![None; batch.num_rows()], |a| a.iter().collect())
}

/// The batch's columns named, in order, as the INSERT's target columns.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Catalog;
    use crate::codec::{KeyPrefix, Keyspace};
    use crate::kv::Store;

    fn engine() -> QueryEngine {
        QueryEngine::new(Catalog::new(
            Store::memory(),
            Keyspace::new(KeyPrefix::none()),
        ))
    }

    /// Files 1 and 2 in table 1 (file 2 already ended at snapshot 4), file 3 in table 2, and
    /// mapping 5 of table 1 with one name row.
    async fn seeded() -> QueryEngine {
        use crate::model::{ColumnMappingRow, DataFileRow, NameMappingRow};
        use crate::write::{Insert, StagedBatch, commit_batch};
        let engine = engine();
        let file = |id: i64, table: i64, end: Option<i64>| DataFileRow {
            data_file_id: Some(id),
            table_id: Some(table),
            begin_snapshot: Some(1),
            end_snapshot: end,
            path: Some(format!("f{id}.parquet")),
            ..DataFileRow::default()
        };
        let mut batch = StagedBatch::new();
        batch
            .push(Op::Insert(Insert::column_mappings(&[ColumnMappingRow {
                mapping_id: Some(5),
                table_id: Some(1),
                map_type: Some("map_by_name".into()),
            }])))
            .push(Op::Insert(Insert::name_mappings(&[NameMappingRow {
                mapping_id: Some(5),
                column_id: Some(1),
                source_name: Some("a".into()),
                target_field_id: Some(1),
                parent_column: None,
                is_partition: Some(false),
            }])))
            .push(Op::Insert(Insert::data_files(&[
                file(1, 1, None),
                file(2, 1, Some(4)),
                file(3, 2, None),
            ])));
        commit_batch(engine.catalog(), &batch)
            .await
            .expect("committed");
        engine
    }

    /// The changes of `sql` with `params` against the seeded catalog, holds left out.
    async fn changes(engine: &QueryEngine, sql: &str, params: Vec<ScalarValue>) -> Vec<Op> {
        let write = engine
            .write_statement(sql)
            .expect("parses")
            .expect("a write");
        let view = engine.catalog().snapshot().await.expect("snapshot");
        let mut ops = engine
            .write_ops(&view, &write, params)
            .await
            .expect("evaluates");
        ops.retain(|op| !matches!(op, Op::Hold(_)));
        ops
    }

    #[tokio::test]
    async fn write_statements_find_exactly_their_rows() {
        let engine = seeded().await;
        let deleted = changes(
            &engine,
            "DELETE FROM ducklake_data_file WHERE data_file_id IN (1, 3, 9)",
            vec![],
        )
        .await;
        assert!(
            matches!(&deleted[..], [Op::Delete(DeleteOp::DataFiles(ids))]
                if ids.iter().map(|id| id.0).collect::<std::collections::BTreeSet<_>>()
                    == [1, 3].into()),
            "{deleted:?}"
        );
        // DuckLake's DROP TABLE: only the live files of the named table, ended at `?`.
        let ended = changes(
            &engine,
            "UPDATE ducklake_data_file SET end_snapshot = ? WHERE end_snapshot IS NULL AND table_id IN (?)",
            vec![ScalarValue::Int64(Some(9)), ScalarValue::Int64(Some(1))],
        )
        .await;
        assert!(
            matches!(&ended[..], [Op::Update(Update::EndDataFiles {
                end_snapshot: 9,
                target: EndTarget::DataFiles(ids),
            })] if ids.iter().map(|id| id.0).collect::<Vec<_>>() == [1]),
            "{ended:?}"
        );
        // The orphan sweep finds nothing: every name row's mapping is there.
        let swept = changes(
            &engine,
            "DELETE FROM ducklake_name_mapping tbl WHERE NOT EXISTS (SELECT 1 FROM ducklake_column_mapping m WHERE m.mapping_id = tbl.mapping_id)",
            vec![],
        )
        .await;
        assert!(swept.is_empty(), "{swept:?}");
        let mappings = changes(
            &engine,
            "DELETE FROM ducklake_column_mapping WHERE table_id IN (1, 2)",
            vec![],
        )
        .await;
        assert!(
            matches!(&mappings[..], [Op::Delete(DeleteOp::ColumnMappings(ids))]
                if ids.iter().map(|id| id.0).collect::<Vec<_>>() == [5]),
            "{mappings:?}"
        );
    }

    #[tokio::test]
    async fn reads_ducklake_write_shapes_and_ignores_queries() {
        let engine = engine();
        let w = |sql: &str| {
            engine
                .write_statement(sql)
                .expect("parses")
                .expect("a write")
        };
        let d = w("DELETE FROM ducklake_data_file WHERE data_file_id IN (1, 2)");
        assert_eq!(d.table, CatalogTable::DataFile);
        let end = w(
            "UPDATE ducklake_data_file SET end_snapshot = ? WHERE end_snapshot IS NULL AND table_id IN (?)",
        );
        assert!(matches!(end.action, Action::EndDataFiles));
        let immutable = w("UPDATE ducklake_name_mapping SET source_name = 'x'");
        assert!(matches!(
            immutable.action,
            Action::Refused(Op::Update(Update::MappingTable(CatalogTable::NameMapping)))
        ));
        let path = w("UPDATE ducklake_data_file SET path = 'x' WHERE data_file_id = 1");
        assert!(matches!(
            path.action,
            Action::Refused(Op::Update(Update::OtherDataFileUpdate { .. }))
        ));
        let insert =
            w("INSERT INTO main.ducklake_column_mapping (table_id, mapping_id) VALUES (1, 2)");
        assert!(matches!(insert.action, Action::Insert { .. }));
        // DataFusion's plan of its source gives the values under their columns' names, as
        // typed in the statement.
        let rows = engine
            .rows_plan(&insert)
            .await
            .expect("plans")
            .expect("a plan");
        let columns: Vec<String> = rows
            .schema()
            .fields()
            .iter()
            .map(|f| format!("{} {}", f.name(), f.data_type()))
            .collect();
        assert_eq!(columns, ["table_id Int64", "mapping_id Int64"]);
        assert!(
            engine
                .write_statement("SELECT 1")
                .expect("parses")
                .is_none()
        );
        assert!(matches!(
            engine.write_statement("DELETE FROM nowhere"),
            Err(Error::NotFound { .. })
        ));
    }
}
