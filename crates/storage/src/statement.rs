//! Hand-written SQL that PostgreSQL prepares once per connection.
//!
//! diesel's `sql_query` marks itself unsafe to cache, so PostgreSQL parses and plans it on every
//! call; for the hot paths' multi-statement CTEs that was close to half of PostgreSQL's time. A
//! [`Statement`] is fixed text with numbered placeholders (`$1`, `$2`, ... which may repeat), so
//! diesel's statement cache keeps it prepared on each connection.
//!
//! The text is sent without its comments (`--` to the end of a line, outside quotes), so a `$n`
//! in a comment is prose, never a parameter; a placeholder that repeats is one parameter, its
//! value sent once; and every value bound must have a placeholder: a statement whose binds and
//! placeholders disagree fails before it reaches the database.

use diesel::pg::Pg;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::result::QueryResult;
use diesel::serialize::ToSql;
use diesel::sql_types::{HasSqlType, Untyped};
use std::borrow::Cow;
use std::marker::PhantomData;

/// One bound value of a [`Statement`].
trait Bind: Send + Sync {
    fn push<'b>(&'b self, out: &mut AstPass<'_, 'b, Pg>) -> QueryResult<()>;
}

struct Typed<ST, T> {
    value: T,
    sql_type: PhantomData<fn() -> ST>,
}

impl<ST, T> Bind for Typed<ST, T>
where
    Pg: HasSqlType<ST>,
    T: ToSql<ST, Pg> + Send + Sync,
{
    fn push<'b>(&'b self, out: &mut AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_bind_param::<ST, T>(&self.value)
    }
}

/// Fixed SQL text and its binds: `$n` in the text stands for the n-th value given to
/// [`Statement::bind`], as often as it appears.
pub(crate) struct Statement<'a> {
    sql: Cow<'static, str>,
    binds: Vec<Box<dyn Bind + 'a>>,
}

impl<'a> Statement<'a> {
    /// `sql` is usually a file's text; text made at run time is prepared once per connection
    /// for each distinct text (diesel's statement cache keys it by its text).
    pub fn new(sql: impl Into<Cow<'static, str>>) -> Self {
        Statement {
            sql: sql.into(),
            binds: Vec::new(),
        }
    }

    /// Binds the next placeholder to `value` as SQL type `ST`.
    pub fn bind<ST, T>(mut self, value: T) -> Self
    where
        Pg: HasSqlType<ST>,
        T: ToSql<ST, Pg> + Send + Sync + 'a,
        ST: 'a,
    {
        self.binds.push(Box::new(Typed {
            value,
            sql_type: PhantomData,
        }));
        self
    }
}

impl QueryFragment<Pg> for Statement<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        let error = |message: String| diesel::result::Error::QueryBuilderError(message.into());
        // The parameter each bound value became, in the order of first use: diesel numbers the
        // parameters it is given from 1, so a repeat names the number its first use got.
        let mut sent: Vec<Option<usize>> = vec![None; self.binds.len()];
        let mut count = 0;
        for piece in pieces(&self.sql) {
            match piece {
                Piece::Sql(text) => out.push_sql(text),
                Piece::Placeholder(number) => {
                    let index = number
                        .checked_sub(1)
                        .filter(|index| *index < self.binds.len())
                        .ok_or_else(|| error(format!("${number} has no bound value")))?;
                    match sent[index] {
                        Some(parameter) => out.push_sql(&format!("${parameter}")),
                        None => {
                            self.binds[index].push(&mut out)?;
                            count += 1;
                            sent[index] = Some(count);
                        }
                    }
                }
            }
        }
        match sent.iter().position(Option::is_none) {
            Some(unused) => Err(error(format!(
                "the value bound to ${} has no placeholder",
                unused + 1
            ))),
            None => Ok(()),
        }
    }
}

/// A part of a statement's text.
#[derive(Debug, PartialEq, Eq)]
enum Piece<'a> {
    /// Text sent as it is.
    Sql(&'a str),
    /// `$n`.
    Placeholder(usize),
}

/// The statement's text as sent, in pieces: comments left out, placeholders found outside
/// quoted strings and identifiers.
fn pieces(sql: &str) -> impl Iterator<Item = Piece<'_>> {
    let bytes = sql.as_bytes();
    let mut at = 0;
    let mut start = 0;
    let mut pending: Option<Piece<'_>> = None;
    std::iter::from_fn(move || {
        if let Some(piece) = pending.take() {
            return Some(piece);
        }
        while at < bytes.len() {
            match bytes[at] {
                quote @ (b'\'' | b'"') => {
                    // To the closing quote (a doubled quote closes and reopens: the same).
                    at += 1;
                    while at < bytes.len() && bytes[at] != quote {
                        at += 1;
                    }
                    at += 1;
                }
                b'-' if bytes.get(at + 1) == Some(&b'-') => {
                    let text = &sql[start..at];
                    while at < bytes.len() && bytes[at] != b'\n' {
                        at += 1;
                    }
                    start = at;
                    if !text.is_empty() {
                        return Some(Piece::Sql(text));
                    }
                }
                b'$' if bytes.get(at + 1).is_some_and(u8::is_ascii_digit) => {
                    let text = &sql[start..at];
                    let digits = bytes[at + 1..]
                        .iter()
                        .take_while(|b| b.is_ascii_digit())
                        .count();
                    let number = sql[at + 1..at + 1 + digits].parse().unwrap_or(usize::MAX);
                    at += 1 + digits;
                    start = at;
                    let placeholder = Piece::Placeholder(number);
                    if text.is_empty() {
                        return Some(placeholder);
                    }
                    pending = Some(placeholder);
                    return Some(Piece::Sql(text));
                }
                _ => at += 1,
            }
        }
        let text = &sql[start.min(sql.len())..];
        start = sql.len();
        (!text.is_empty()).then_some(Piece::Sql(text))
    })
}

impl QueryId for Statement<'_> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl Query for Statement<'_> {
    type SqlType = Untyped;
}

#[cfg(test)]
mod tests {
    use super::*;
    use diesel::sql_types::{Integer, Text};

    fn sql_of(statement: &Statement<'_>) -> String {
        diesel::debug_query::<Pg, _>(statement)
            .to_string()
            .split(" -- binds")
            .next()
            .unwrap_or_default()
            .to_owned()
    }

    #[test]
    fn a_repeated_placeholder_is_one_parameter_sent_once() {
        let statement = Statement::new("SELECT $2::text, $1::int4, $2::text")
            .bind::<Integer, _>(7)
            .bind::<Text, _>("x");
        assert_eq!(sql_of(&statement), "SELECT $1::text, $2::int4, $1::text");
        let rendered = diesel::debug_query::<Pg, _>(&statement).to_string();
        assert!(rendered.contains("[\"x\", 7]"), "{rendered}");
    }

    #[test]
    fn comments_are_not_sent_and_their_placeholders_are_prose() {
        let statement = Statement::new(
            "-- $1 the id, $9 nothing\nSELECT $1::int4 -- and $2\n  , '--$2' AS \"$3--\"",
        )
        .bind::<Integer, _>(7);
        assert_eq!(
            sql_of(&statement),
            "\nSELECT $1::int4 \n  , '--$2' AS \"$3--\""
        );
    }

    #[test]
    fn binds_and_placeholders_must_agree() {
        let mut builder = diesel::pg::PgQueryBuilder::default();
        let missing = Statement::new("SELECT $2::int4").bind::<Integer, _>(1);
        assert!(missing.to_sql(&mut builder, &Pg).is_err());
        let unused = Statement::new("SELECT $1::int4 -- $2")
            .bind::<Integer, _>(1)
            .bind::<Integer, _>(2);
        let mut builder = diesel::pg::PgQueryBuilder::default();
        let error = unused.to_sql(&mut builder, &Pg).unwrap_err().to_string();
        assert!(error.contains("$2 has no placeholder"), "{error}");
    }

    /// Every statement of `src/sql/` numbers its placeholders 1 to n without a gap (with the
    /// check above, its call's binds must then be exactly n), and none is left in the text sent.
    #[test]
    fn every_sql_file_numbers_its_placeholders_without_a_gap() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/sql");
        let mut files = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let sql = std::fs::read_to_string(&path).unwrap();
            let mut numbers: Vec<usize> = pieces(&sql)
                .filter_map(|piece| match piece {
                    Piece::Placeholder(number) => Some(number),
                    Piece::Sql(_) => None,
                })
                .collect();
            numbers.sort_unstable();
            numbers.dedup();
            let expected: Vec<usize> = (1..=numbers.len()).collect();
            assert_eq!(numbers, expected, "{}", path.display());
            files += 1;
        }
        assert!(files >= 10, "{files} files in {dir}");
    }
}
