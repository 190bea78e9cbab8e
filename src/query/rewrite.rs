//! Normalizations of client SQL before DataFusion plans it, for what clients send that
//! DataFusion reads differently:
//!
//! - `?` placeholders (ADBC, JDBC style) become `$1`, `$2`, … in order of appearance;
//!   DataFusion would read every `?` as one and the same parameter.
//! - DuckLake's join of `ducklake_column_mapping` and `ducklake_name_mapping` `USING
//!   (mapping_id)` reads the joined table of [`super::load`] instead, which holds the same rows
//!   in the load's order; qualified column names lose their qualifier (the joined table's
//!   columns are unique).
//! - In a `SELECT` over `a JOIN b USING (c)`, a bare `c` in `WHERE` or `ORDER BY` is
//!   qualified with the left relation. The join makes both sides equal, so this changes no
//!   result; DataFusion would otherwise call `c` ambiguous in DuckLake's cursor query
//!   (`... USING (mapping_id) WHERE mapping_id >= <cursor>`).

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    Expr, Ident, JoinConstraint, JoinOperator, ObjectName, OrderByKind, SelectItem, SetExpr,
    Statement, TableFactor, TableWithJoins, Value, visit_expressions_mut,
};

use crate::model::CatalogTable;

/// Applies every normalization to `statement`; DuckLake's mapping load reads the joined
/// table only with `mapping_load`.
pub fn normalize(statement: &mut Statement, mapping_load: bool) {
    number_placeholders(statement);
    if mapping_load && read_mapping_load(statement) {
        return;
    }
    if let Statement::Query(query) = statement {
        let SetExpr::Select(select) = query.body.as_mut() else {
            return;
        };
        let Some(from) = select.from.first() else {
            return;
        };
        let Some(qualifier) = relation_name(&from.relation) else {
            return;
        };
        let using: Vec<String> = from
            .joins
            .iter()
            .filter_map(|join| match &join.join_operator {
                JoinOperator::Join(JoinConstraint::Using(columns))
                | JoinOperator::Inner(JoinConstraint::Using(columns)) => Some(columns),
                _ => None,
            })
            .flatten()
            .filter_map(|name| match name.0.as_slice() {
                [part] => part.as_ident().map(|i| i.value.to_lowercase()),
                _ => None,
            })
            .collect();
        if using.is_empty() {
            return;
        }
        let qualify = |expr: &mut Expr| {
            if let Expr::Identifier(ident) = expr
                && using.contains(&ident.value.to_lowercase())
            {
                let mut parts = qualifier.clone();
                parts.push(ident.clone());
                *expr = Expr::CompoundIdentifier(parts);
            }
            ControlFlow::<()>::Continue(())
        };
        if let Some(selection) = select.selection.as_mut() {
            let _ = visit_expressions_mut(selection, qualify);
        }
        if let Some(order_by) = query.order_by.as_mut()
            && let OrderByKind::Expressions(exprs) = &mut order_by.kind
        {
            for item in exprs {
                let _ = visit_expressions_mut(&mut item.expr, qualify);
            }
        }
    }
}

/// The name a relation is referred to by: its alias, else its (possibly qualified) name.
fn relation_name(relation: &TableFactor) -> Option<Vec<Ident>> {
    match relation {
        TableFactor::Table {
            alias: Some(alias), ..
        } => Some(vec![alias.name.clone()]),
        TableFactor::Table { name, .. } => idents(name),
        _ => None,
    }
}

/// A mapping table as a query names it: which one, and the qualifier its columns take.
fn mapping_table(relation: &TableFactor) -> Option<(CatalogTable, String)> {
    let TableFactor::Table { name, alias, .. } = relation else {
        return None;
    };
    let parts = idents(name)?;
    let last = parts.last()?;
    let table = CatalogTable::from_name(&last.value)
        .filter(|t| matches!(t, CatalogTable::ColumnMapping | CatalogTable::NameMapping))?;
    let qualifier = alias.as_ref().map_or(&last.value, |a| &a.name.value);
    Some((table, qualifier.to_lowercase()))
}

/// Rewrites `SELECT … FROM ducklake_column_mapping JOIN ducklake_name_mapping USING
/// (mapping_id) …` (either order, any aliases) to read the joined table. Returns whether it did.
fn read_mapping_load(statement: &mut Statement) -> bool {
    let Statement::Query(query) = statement else {
        return false;
    };
    let SetExpr::Select(select) = query.body.as_mut() else {
        return false;
    };
    let [from] = select.from.as_slice() else {
        return false;
    };
    let [join] = from.joins.as_slice() else {
        return false;
    };
    let on_mapping_id = match &join.join_operator {
        JoinOperator::Join(JoinConstraint::Using(columns))
        | JoinOperator::Inner(JoinConstraint::Using(columns)) => match columns.as_slice() {
            [column] => idents(column).is_some_and(|parts| {
                matches!(parts.as_slice(), [c] if c.value.eq_ignore_ascii_case("mapping_id"))
            }),
            _ => false,
        },
        _ => false,
    };
    let (Some((left, left_q)), Some((right, right_q))) =
        (mapping_table(&from.relation), mapping_table(&join.relation))
    else {
        return false;
    };
    let plain_items = select.projection.iter().all(|item| {
        matches!(
            item,
            SelectItem::UnnamedExpr(_) | SelectItem::ExprWithAlias { .. } | SelectItem::Wildcard(_)
        )
    });
    if !on_mapping_id || left == right || !plain_items {
        return false;
    }
    let mut relation = from.relation.clone();
    if let TableFactor::Table { name, alias, .. } = &mut relation {
        *name = ObjectName::from(vec![Ident::new(super::load::MAPPING_LOAD_TABLE)]);
        *alias = None;
    }
    select.from = vec![TableWithJoins {
        relation,
        joins: Vec::new(),
    }];
    let qualifiers = [left_q, right_q];
    let _ = visit_expressions_mut(statement, |expr| {
        if let Expr::CompoundIdentifier(parts) = expr
            && let [qualifier, column] = parts.as_slice()
            && qualifiers.contains(&qualifier.value.to_lowercase())
        {
            *expr = Expr::Identifier(column.clone());
        }
        ControlFlow::<()>::Continue(())
    });
    true
}

fn idents(name: &ObjectName) -> Option<Vec<Ident>> {
    name.0.iter().map(|part| part.as_ident().cloned()).collect()
}

fn number_placeholders(statement: &mut Statement) {
    let mut next = 0;
    let _ = visit_expressions_mut(statement, |expr| {
        if let Expr::Value(value) = expr
            && matches!(&value.value, Value::Placeholder(p) if p == "?")
        {
            next += 1;
            value.value = Value::Placeholder(format!("${next}"));
        }
        ControlFlow::<()>::Continue(())
    });
}

#[cfg(test)]
mod tests {
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::parser::Parser;

    use super::*;

    fn normalized(sql: &str) -> String {
        let mut statements = Parser::parse_sql(&GenericDialect {}, sql).expect("parses");
        let statement = statements.first_mut().expect("one statement");
        normalize(statement, true);
        statement.to_string()
    }

    #[test]
    fn question_marks_become_numbered_placeholders_in_order() {
        assert_eq!(
            normalized("SELECT ? FROM t WHERE a = ? AND b = '?' AND c IN (?, ?)"),
            "SELECT $1 FROM t WHERE a = $2 AND b = '?' AND c IN ($3, $4)"
        );
    }

    #[test]
    fn using_columns_are_qualified_outside_the_projection() {
        assert_eq!(
            normalized(
                "SELECT mapping_id FROM m JOIN n USING (mapping_id) WHERE mapping_id >= 10 ORDER BY mapping_id, parent_column NULLS FIRST"
            ),
            "SELECT mapping_id FROM m JOIN n USING(mapping_id) WHERE m.mapping_id >= 10 ORDER BY m.mapping_id, parent_column NULLS FIRST"
        );
        assert_eq!(
            normalized("SELECT x FROM main.m AS q JOIN n USING (x) WHERE x = 1"),
            "SELECT x FROM main.m AS q JOIN n USING(x) WHERE q.x = 1"
        );
        assert_eq!(
            normalized("SELECT a FROM m WHERE a = 1"),
            "SELECT a FROM m WHERE a = 1"
        );
    }

    #[test]
    fn ducklakes_mapping_join_reads_the_joined_table() {
        assert_eq!(
            normalized(
                "SELECT mapping_id, table_id, type, column_id, source_name, target_field_id, parent_column, is_partition FROM ducklake_column_mapping JOIN ducklake_name_mapping USING (mapping_id) WHERE mapping_id >= ? ORDER BY mapping_id, parent_column NULLS FIRST"
            ),
            "SELECT mapping_id, table_id, type, column_id, source_name, target_field_id, parent_column, is_partition FROM __moraine_mapping_load WHERE mapping_id >= $1 ORDER BY mapping_id, parent_column NULLS FIRST"
        );
        assert_eq!(
            normalized(
                "SELECT n.source_name, m.table_id FROM main.ducklake_name_mapping n INNER JOIN ducklake_column_mapping AS m USING (mapping_id) WHERE m.mapping_id = 3"
            ),
            "SELECT source_name, table_id FROM __moraine_mapping_load WHERE mapping_id = 3"
        );
        // Anything else keeps its join: another key, an outer join, a qualified wildcard.
        for sql in [
            "SELECT * FROM ducklake_column_mapping JOIN ducklake_name_mapping USING (table_id)",
            "SELECT * FROM ducklake_column_mapping LEFT JOIN ducklake_name_mapping USING (mapping_id)",
            "SELECT n.* FROM ducklake_column_mapping m JOIN ducklake_name_mapping n USING (mapping_id)",
            "SELECT * FROM ducklake_column_mapping a JOIN ducklake_column_mapping b USING (mapping_id)",
        ] {
            assert!(!normalized(sql).contains("__moraine_mapping_load"), "{sql}");
        }
    }
}
