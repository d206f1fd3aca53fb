//! Inbound access tokens: issued through admin, stored as hashes, revocable.

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::schema::inbound_tokens;
use crate::{Cursor, DbError, Listed, Page};
use tocsin_domain::AccessToken;

/// A token's record; the token itself is never stored.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = inbound_tokens)]
pub struct InboundToken {
    pub id: Uuid,
    pub name: String,
    /// The public part of the token (`tsn_<prefix>_…`), to tell tokens apart.
    pub lookup: String,
    pub token_hash: Vec<u8>,
    pub created_at: OffsetDateTime,
    pub last_used_at: Option<OffsetDateTime>,
    pub revoked_at: Option<OffsetDateTime>,
}

impl Listed for InboundToken {
    fn cursor(&self) -> Cursor {
        Cursor::new(self.created_at, self.id)
    }
}

/// Issues a token. The returned [`AccessToken`] is the only copy of it.
pub async fn create(
    conn: &mut AsyncPgConnection,
    name: &str,
) -> Result<(InboundToken, AccessToken), DbError> {
    let token = AccessToken::generate();
    let record = diesel::insert_into(inbound_tokens::table)
        .values((
            inbound_tokens::id.eq(Uuid::now_v7()),
            inbound_tokens::name.eq(name),
            inbound_tokens::lookup.eq(token.lookup()),
            inbound_tokens::token_hash.eq(token.hash()),
            inbound_tokens::created_at.eq(OffsetDateTime::now_utc()),
        ))
        .returning(InboundToken::as_returning())
        .get_result(conn)
        .await?;
    Ok((record, token))
}

/// The id of the live token matching `presented`, compared in constant time; `None` for an
/// unknown or revoked token.
pub async fn authenticate(
    conn: &mut AsyncPgConnection,
    presented: &AccessToken,
) -> Result<Option<Uuid>, DbError> {
    Ok(authenticate_all(conn, std::slice::from_ref(presented))
        .await?
        .pop()
        .flatten())
}

/// [`authenticate`] for several presented tokens, in one query (ingest gathers the requests
/// it receives concurrently). Answers per token.
pub async fn authenticate_all(
    conn: &mut AsyncPgConnection,
    presented: &[AccessToken],
) -> Result<Vec<Option<Uuid>>, DbError> {
    let lookups: Vec<&str> = presented.iter().map(AccessToken::lookup).collect();
    let records: Vec<InboundToken> = inbound_tokens::table
        .filter(inbound_tokens::lookup.eq_any(&lookups))
        .filter(inbound_tokens::revoked_at.is_null())
        .select(InboundToken::as_select())
        .load(conn)
        .await?;
    let matched: Vec<Option<&InboundToken>> = presented
        .iter()
        .map(|token| {
            records
                .iter()
                .find(|r| r.lookup == token.lookup() && token.matches(&r.token_hash))
        })
        .collect();
    let now = OffsetDateTime::now_utc();
    // Written at most once a minute per token, to keep the hot path free of writes.
    let mut stale: Vec<Uuid> = matched
        .iter()
        .flatten()
        .filter(|r| {
            r.last_used_at
                .is_none_or(|used| now - used > time::Duration::MINUTE)
        })
        .map(|r| r.id)
        .collect();
    stale.sort_unstable();
    stale.dedup();
    if !stale.is_empty() {
        diesel::update(inbound_tokens::table.filter(inbound_tokens::id.eq_any(&stale)))
            .set(inbound_tokens::last_used_at.eq(now))
            .execute(conn)
            .await?;
    }
    Ok(matched.iter().map(|r| r.map(|r| r.id)).collect())
}

/// Tokens, newest first, revoked ones included.
pub async fn list(
    conn: &mut AsyncPgConnection,
    page: &Page,
) -> Result<(Vec<InboundToken>, Option<Cursor>), DbError> {
    let mut query = inbound_tokens::table
        .select(InboundToken::as_select())
        .order((inbound_tokens::created_at.desc(), inbound_tokens::id.desc()))
        .limit(page.limit + 1)
        .into_boxed();
    if let Some(cursor) = &page.cursor {
        query = query.filter(cursor.before("inbound_tokens"));
    }
    let rows: Vec<InboundToken> = query.load(conn).await?;
    page.finish(rows)
}

/// Revokes a token; the next request with it is refused.
pub async fn revoke(conn: &mut AsyncPgConnection, id: Uuid) -> Result<(), DbError> {
    let updated = diesel::update(
        inbound_tokens::table
            .find(id)
            .filter(inbound_tokens::revoked_at.is_null()),
    )
    .set(inbound_tokens::revoked_at.eq(OffsetDateTime::now_utc()))
    .execute(conn)
    .await?;
    if updated == 0 {
        return Err(DbError::NotFound);
    }
    Ok(())
}
