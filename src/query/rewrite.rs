//! Normalizations of client SQL before DataFusion plans it, for what clients send that
//! DataFusion reads differently:
//!
//! - `?` placeholders (ADBC, JDBC style) become `$1`, `$2`, … in order of appearance;
//!   DataFusion would read every `?` as one and the same parameter.
//! - In a `SELECT` over `a JOIN b USING (c)`, a bare `c` in `WHERE` or `ORDER BY` is
//!   qualified with the left relation. The join makes both sides equal, so this changes no
//!   result; DataFusion would otherwise call `c` ambiguous in DuckLake's cursor query
//!   (`... USING (mapping_id) WHERE mapping_id >= <cursor>`).

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    Expr, Ident, JoinConstraint, JoinOperator, ObjectName, OrderByKind, SetExpr, Statement,
    TableFactor, Value, visit_expressions_mut,
};

/// Applies every normalization to `statement`.
pub fn normalize(statement: &mut Statement) {
    number_placeholders(statement);
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
        normalize(statement);
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
}
