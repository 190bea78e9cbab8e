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

use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};

use crate::error::{Error, QueryErrorKind, Result};

/// Most tokens of one expression on the levels of parentheses open around any point of it:
/// bounds the depth of the expression tree the engine walks.
pub const MAX_EXPRESSION_TOKENS: usize = 256;

/// Refuses SQL whose expressions nest deeper than [`MAX_EXPRESSION_TOKENS`] allows. SQL that
/// does not tokenize passes: the parser reports it.
///
/// # Errors
/// [`Error::Query`] (invalid) naming the limit.
pub fn check_nesting(sql: &str) -> Result<()> {
    let Ok(tokens) = Tokenizer::new(&GenericDialect {}, sql).tokenize() else {
        return Ok(());
    };
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
            Token::Comma | Token::SemiColon => {
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
                    return Err(Error::Query {
                        kind: QueryErrorKind::Invalid,
                        message: format!(
                            "an expression nests too deep: more than {MAX_EXPRESSION_TOKENS} tokens \
                             on the levels of parentheses around one point (the server's limit on \
                             expression depth); split it, or put long value lists in IN (...)"
                        ),
                    });
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(terms: usize, op: &str) -> String {
        vec!["1"; terms].join(op)
    }

    #[test]
    fn long_chains_are_refused_and_lists_are_not() {
        // `SELECT` and 128 terms joined by 127 operators: 256 tokens.
        assert!(check_nesting(&format!("SELECT {}", chain(128, "+"))).is_ok());
        let err = check_nesting(&format!("SELECT {}", chain(129, "+"))).expect_err("too deep");
        assert!(err.to_string().contains("256 tokens"), "{err}");
        // Parentheses around each term do not split the chain; nesting adds up.
        let wrapped = vec!["(1)"; 300].join("+");
        assert!(check_nesting(&format!("SELECT {wrapped}")).is_err());
        let nested = format!(
            "SELECT {}",
            "(1+1+1+1+".repeat(120) + "1" + &")".repeat(120)
        );
        assert!(check_nesting(&nested).is_err());
        // Commas start new expressions: a long IN list or select list passes.
        let list = (0..5000)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        assert!(
            check_nesting(&format!(
                "DELETE FROM ducklake_data_file WHERE data_file_id IN ({list})"
            ))
            .is_ok()
        );
        let ors = (0..3000)
            .map(|i| format!("data_file_id = {i}"))
            .collect::<Vec<_>>()
            .join(" OR ");
        assert!(check_nesting(&format!("DELETE FROM ducklake_data_file WHERE {ors}")).is_err());
    }
}
