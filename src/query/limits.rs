//! Limits on the shape of client SQL, checked on its tokens before anything parses it.
//!
//! A left-deep chain of operators (`1+1+…`, `a OR b OR …`) parses without recursion, but the
//! tree it makes is as deep as the chain is long, and parts of the engine (cloning, dropping
//! and rewriting expressions) walk such trees recursively: a few thousand terms overflow a
//! worker's stack and abort the process. So an expression may hold at most
//! [`MAX_EXPRESSION_TOKENS`] tokens on the levels of parentheses open around any point of it.
//! Commas start a new expression; what lies between a pair of parentheses counts towards the
//! levels it is nested in. Real catalog queries stay far below the limit (DuckLake's longest
//! hold a few dozen); long value lists belong in `IN (…)`, whose commas keep each item apart.

use std::time::Duration;

use datafusion::error::DataFusionError;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
use futures::StreamExt as _;

use crate::error::{Error, QueryErrorKind, Result};

/// Most tokens of one expression on the levels of parentheses open around any point of it:
/// bounds the depth of the expression tree the engine walks.
pub const MAX_EXPRESSION_TOKENS: usize = 256;

/// Longest SQL text the server parses, in bytes. DuckLake's longest statements (an INSERT of
/// a few thousand rows of VALUES) stay well below it.
pub const MAX_SQL_BYTES: usize = 4 << 20;

/// Refuses SQL longer than [`MAX_SQL_BYTES`], of more than one statement, or whose expressions
/// nest deeper than [`MAX_EXPRESSION_TOKENS`] allows, before anything parses it. SQL that does
/// not tokenize passes: the parser reports it.
///
/// # Errors
/// [`Error::Query`] (invalid) naming the limit.
pub fn check_sql(sql: &str) -> Result<()> {
    let invalid = |message: String| Error::Query {
        kind: QueryErrorKind::Invalid,
        message,
    };
    if sql.len() > MAX_SQL_BYTES {
        return Err(invalid(format!(
            "SQL text of {} bytes is over the server's limit of {MAX_SQL_BYTES} bytes",
            sql.len()
        )));
    }
    let Ok(tokens) = Tokenizer::new(&GenericDialect {}, sql).tokenize() else {
        return Ok(());
    };
    let statements = tokens
        .split(|token| *token == Token::SemiColon)
        .filter(|part| {
            part.iter()
                .any(|token| !matches!(token, Token::Whitespace(_) | Token::EOF))
        })
        .count();
    if statements > 1 {
        return Err(invalid(format!(
            "{statements} statements in one request; send one statement at a time"
        )));
    }
    // Tokens counted on each open level, and their sum with one for each open parenthesis.
    let mut levels: Vec<usize> = vec![0];
    let mut open = 0_usize;
    for token in &tokens {
        match token {
            Token::Whitespace(_) => {}
            Token::LParen | Token::LBracket | Token::LBrace => {
                levels.push(0);
                open += 1;
            }
            Token::RParen | Token::RBracket | Token::RBrace => {
                if levels.len() > 1 {
                    let counted = levels.pop().unwrap_or_default();
                    open = open.saturating_sub(counted + 1);
                }
            }
            Token::Comma => {
                if let Some(counted) = levels.last_mut() {
                    open = open.saturating_sub(*counted);
                    *counted = 0;
                }
            }
            _ => {
                if let Some(counted) = levels.last_mut() {
                    *counted += 1;
                }
                open += 1;
                if open > MAX_EXPRESSION_TOKENS {
                    return Err(invalid(format!(
                        "an expression nests too deep: more than {MAX_EXPRESSION_TOKENS} tokens \
                         on the levels of parentheses around one point (the server's limit on \
                         expression depth); split it, or put long value lists in IN (...)"
                    )));
                }
            }
        }
    }
    Ok(())
}

/// `stream`, ended with an error naming the limit once `timeout` has passed since now.
#[must_use]
pub fn with_deadline(
    stream: SendableRecordBatchStream,
    timeout: Duration,
) -> SendableRecordBatchStream {
    let schema = stream.schema();
    let deadline = Box::pin(tokio::time::sleep(timeout));
    let timed = futures::stream::unfold(Some((stream, deadline)), move |state| async move {
        let (mut stream, mut deadline) = state?;
        tokio::select! {
            biased;
            () = &mut deadline => {
                let err = Error::Timeout { after: timeout };
                Some((Err(DataFusionError::External(Box::new(err))), None))
            }
            next = stream.next() => next.map(|item| (item, Some((stream, deadline)))),
        }
    });
    Box::pin(RecordBatchStreamAdapter::new(schema, timed))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(terms: usize, op: &str) -> String {
        vec!["1"; terms].join(op)
    }

    #[test]
    fn long_texts_and_several_statements_are_refused() {
        let long = format!("SELECT 1 -- {}", "x".repeat(MAX_SQL_BYTES));
        let err = check_sql(&long).expect_err("too long");
        assert!(err.to_string().contains("limit of 4194304 bytes"), "{err}");
        let err = check_sql("SELECT 1; SELECT 2").expect_err("two statements");
        assert!(err.to_string().contains("2 statements"), "{err}");
        assert!(check_sql("SELECT 1;").is_ok());
        assert!(check_sql("SELECT ';' AS semicolon").is_ok());
    }

    #[test]
    fn long_chains_are_refused_and_lists_are_not() {
        // `SELECT` and 128 terms joined by 127 operators: 256 tokens.
        assert!(check_sql(&format!("SELECT {}", chain(128, "+"))).is_ok());
        let err = check_sql(&format!("SELECT {}", chain(129, "+"))).expect_err("too deep");
        assert!(err.to_string().contains("256 tokens"), "{err}");
        // Parentheses around each term do not split the chain; nesting adds up.
        let wrapped = vec!["(1)"; 300].join("+");
        assert!(check_sql(&format!("SELECT {wrapped}")).is_err());
        let nested = format!(
            "SELECT {}",
            "(1+1+1+1+".repeat(120) + "1" + &")".repeat(120)
        );
        assert!(check_sql(&nested).is_err());
        // Commas start new expressions: a long IN list or select list passes.
        let list = (0..5000)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        assert!(
            check_sql(&format!(
                "DELETE FROM ducklake_data_file WHERE data_file_id IN ({list})"
            ))
            .is_ok()
        );
        let ors = (0..3000)
            .map(|i| format!("data_file_id = {i}"))
            .collect::<Vec<_>>()
            .join(" OR ");
        assert!(check_sql(&format!("DELETE FROM ducklake_data_file WHERE {ors}")).is_err());
    }
}
