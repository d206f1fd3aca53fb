//! Hand-written SQL that PostgreSQL prepares once per connection.
//!
//! diesel's `sql_query` marks itself unsafe to cache, so PostgreSQL parses and plans it on every
//! call; for the hot paths' multi-statement CTEs that was close to half of PostgreSQL's time. A
//! [`Statement`] is fixed text with numbered placeholders (`$1`, `$2`, ... which may repeat), so
//! diesel's statement cache keeps it prepared on each connection.

use diesel::pg::Pg;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::result::QueryResult;
use diesel::serialize::ToSql;
use diesel::sql_types::{HasSqlType, Untyped};
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
    sql: &'static str,
    binds: Vec<Box<dyn Bind + 'a>>,
}

impl<'a> Statement<'a> {
    pub fn new(sql: &'static str) -> Self {
        Statement {
            sql,
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
        let mut rest = self.sql;
        while let Some(at) = rest.find('$') {
            out.push_sql(&rest[..at]);
            let digits = rest[at + 1..]
                .bytes()
                .take_while(u8::is_ascii_digit)
                .count();
            let number: usize = rest[at + 1..at + 1 + digits].parse().map_err(|_| {
                diesel::result::Error::QueryBuilderError("a `$` without a number".into())
            })?;
            let bind = number
                .checked_sub(1)
                .and_then(|index| self.binds.get(index))
                .ok_or_else(|| {
                    diesel::result::Error::QueryBuilderError(
                        format!("${number} has no bound value").into(),
                    )
                })?;
            bind.push(&mut out)?;
            rest = &rest[at + 1 + digits..];
        }
        out.push_sql(rest);
        Ok(())
    }
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
    fn placeholders_are_numbered_in_order_and_may_repeat() {
        let statement = Statement::new("SELECT $1::int4, $2::text, $1::int4")
            .bind::<Integer, _>(7)
            .bind::<Text, _>("x");
        assert_eq!(sql_of(&statement), "SELECT $1::int4, $2::text, $3::int4");
        let rendered = diesel::debug_query::<Pg, _>(&statement).to_string();
        assert!(rendered.contains("[7, \"x\", 7]"), "{rendered}");
    }

    #[test]
    fn a_placeholder_without_a_value_is_an_error() {
        let statement = Statement::new("SELECT $2::int4").bind::<Integer, _>(1);
        let mut builder = diesel::pg::PgQueryBuilder::default();
        assert!(statement.to_sql(&mut builder, &Pg).is_err());
    }
}
