//! Inbound access tokens: issued through admin, stored as hashes, revocable. A token may be
//! bound to an alert source and may accept credentials other than `Authorization: Bearer`
//! (basic authentication, a query parameter) and check a source's signature: each an opt-in.

use std::collections::HashSet;
use std::fmt;

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::schema::inbound_tokens;
use crate::{Cursor, DbError, Listed, Page};
use tocsin_domain::alerts::AlertFormat;
use tocsin_domain::{AccessToken, SigningSecret};

/// A token's record; the token itself is never stored. `Debug` leaves the signing secret out.
#[derive(Clone, Queryable, Selectable)]
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
    /// The alert source (format name) its bodies are read as; `None`: detected.
    pub source: Option<String>,
    /// Accepts HTTP basic authentication with the token as password.
    pub basic_auth: bool,
    /// Accepts the token in the `token` query parameter.
    pub query_token: bool,
    /// The secret bodies must be signed with (Sentry's client secret).
    pub signing_secret: Option<String>,
    /// Bodies must carry SNS's signature (only for a token bound to `cloudwatch`).
    pub sns_signature: bool,
}

impl fmt::Debug for InboundToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InboundToken")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("lookup", &self.lookup)
            .field("source", &self.source)
            .field("basic_auth", &self.basic_auth)
            .field("query_token", &self.query_token)
            .field("signed", &self.signing_secret.is_some())
            .field("sns_signature", &self.sns_signature)
            .field("revoked_at", &self.revoked_at)
            .finish_non_exhaustive()
    }
}

/// A token to issue: its name, and what it binds and accepts besides a bearer header.
#[derive(Debug, Clone)]
pub struct NewToken<'a> {
    pub name: &'a str,
    pub source: Option<AlertFormat>,
    pub basic_auth: bool,
    pub query_token: bool,
    /// Only for a token bound to `sentry` (the database refuses it otherwise).
    pub signing_secret: Option<&'a SigningSecret>,
    /// Only for a token bound to `cloudwatch` (the database refuses it otherwise).
    pub sns_signature: bool,
}

impl<'a> NewToken<'a> {
    /// A token with no source and no credential but the bearer header.
    pub fn named(name: &'a str) -> Self {
        NewToken {
            name,
            source: None,
            basic_auth: false,
            query_token: false,
            signing_secret: None,
            sns_signature: false,
        }
    }
}

/// A live token that authenticated a request: what it allows.
#[derive(Clone, PartialEq, Eq)]
pub struct LiveToken {
    pub id: Uuid,
    /// Bodies are read as this source, without detection.
    pub source: Option<AlertFormat>,
    pub basic_auth: bool,
    pub query_token: bool,
    /// When set, a body must carry the source's signature made with it.
    pub signing_secret: Option<SigningSecret>,
    /// A body must be an SNS message with a valid SNS signature.
    pub sns_signature: bool,
}

impl fmt::Debug for LiveToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LiveToken")
            .field("id", &self.id)
            .field("source", &self.source)
            .field("basic_auth", &self.basic_auth)
            .field("query_token", &self.query_token)
            .field("signed", &self.signing_secret.is_some())
            .field("sns_signature", &self.sns_signature)
            .finish()
    }
}

impl TryFrom<&InboundToken> for LiveToken {
    type Error = DbError;
    fn try_from(record: &InboundToken) -> Result<Self, DbError> {
        let corrupt = |what: &str| DbError::Corrupt(format!("token {}: bad {what}", record.id));
        Ok(LiveToken {
            id: record.id,
            source: record
                .source
                .as_deref()
                .map(str::parse::<AlertFormat>)
                .transpose()
                .map_err(|_| corrupt("source"))?,
            basic_auth: record.basic_auth,
            query_token: record.query_token,
            signing_secret: record
                .signing_secret
                .as_deref()
                .map(SigningSecret::parse)
                .transpose()
                .map_err(|_| corrupt("signing secret"))?,
            sns_signature: record.sns_signature,
        })
    }
}

impl Listed for InboundToken {
    fn cursor(&self) -> Cursor {
        Cursor::new(self.created_at, self.id)
    }
}

/// Issues a token with no source and only the bearer header ([`issue`]).
pub async fn create(
    conn: &mut AsyncPgConnection,
    name: &str,
) -> Result<(InboundToken, AccessToken), DbError> {
    issue(conn, &NewToken::named(name)).await
}

/// Issues a token. The returned [`AccessToken`] is the only copy of it.
pub async fn issue(
    conn: &mut AsyncPgConnection,
    new: &NewToken<'_>,
) -> Result<(InboundToken, AccessToken), DbError> {
    let token = AccessToken::generate();
    let record = diesel::insert_into(inbound_tokens::table)
        .values((
            inbound_tokens::id.eq(Uuid::now_v7()),
            inbound_tokens::name.eq(new.name),
            inbound_tokens::lookup.eq(token.lookup()),
            inbound_tokens::token_hash.eq(token.hash()),
            inbound_tokens::created_at.eq(OffsetDateTime::now_utc()),
            inbound_tokens::source.eq(new.source.map(AlertFormat::as_str)),
            inbound_tokens::basic_auth.eq(new.basic_auth),
            inbound_tokens::query_token.eq(new.query_token),
            inbound_tokens::signing_secret.eq(new.signing_secret.map(SigningSecret::expose)),
            inbound_tokens::sns_signature.eq(new.sns_signature),
        ))
        .returning(InboundToken::as_returning())
        .get_result(conn)
        .await?;
    Ok((record, token))
}

/// The id of the live token matching `presented`, compared in constant time; `None` for an
/// unknown or revoked token. Notes the use ([`note_use`]).
pub async fn authenticate(
    conn: &mut AsyncPgConnection,
    presented: &AccessToken,
) -> Result<Option<Uuid>, DbError> {
    let live = authenticate_all(conn, std::slice::from_ref(presented))
        .await?
        .pop()
        .flatten()
        .map(|live| live.id);
    note_use(conn, live.as_slice()).await?;
    Ok(live)
}

/// [`authenticate`] for several presented tokens, in one query (ingest gathers the requests
/// it receives concurrently), answering per token with what the live token allows. It only
/// reads: the caller notes the use ([`note_use`]), off the request's way.
pub async fn authenticate_all(
    conn: &mut AsyncPgConnection,
    presented: &[AccessToken],
) -> Result<Vec<Option<LiveToken>>, DbError> {
    let lookups: Vec<&str> = presented.iter().map(AccessToken::lookup).collect();
    let records: Vec<InboundToken> = inbound_tokens::table
        .filter(inbound_tokens::lookup.eq_any(&lookups))
        .filter(inbound_tokens::revoked_at.is_null())
        .select(InboundToken::as_select())
        .load(conn)
        .await?;
    presented
        .iter()
        .map(|token| {
            records
                .iter()
                .find(|r| r.lookup == token.lookup() && token.matches(&r.token_hash))
                .map(LiveToken::try_from)
                .transpose()
        })
        .collect()
}

/// Writes `last_used_at` of the tokens `ids`, where it is more than a minute old: a token used
/// all day is written once a minute at most.
pub async fn note_use(conn: &mut AsyncPgConnection, ids: &[Uuid]) -> Result<(), DbError> {
    let now = OffsetDateTime::now_utc();
    diesel::update(
        inbound_tokens::table
            .filter(inbound_tokens::id.eq_any(ids))
            .filter(
                inbound_tokens::last_used_at
                    .is_null()
                    .or(inbound_tokens::last_used_at.lt(now - time::Duration::MINUTE)),
            ),
    )
    .set(inbound_tokens::last_used_at.eq(now))
    .execute(conn)
    .await?;
    Ok(())
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

/// Which of `ids` are not live tokens (revoked, or not there): no query when there are none.
pub async fn not_live(
    conn: &mut AsyncPgConnection,
    ids: impl IntoIterator<Item = Uuid>,
) -> Result<HashSet<Uuid>, DbError> {
    let mut ids: Vec<Uuid> = ids.into_iter().collect();
    if ids.is_empty() {
        return Ok(HashSet::new());
    }
    ids.sort_unstable();
    ids.dedup();
    let live: HashSet<Uuid> = inbound_tokens::table
        .filter(inbound_tokens::id.eq_any(&ids))
        .filter(inbound_tokens::revoked_at.is_null())
        .select(inbound_tokens::id)
        .load::<Uuid>(conn)
        .await?
        .into_iter()
        .collect();
    Ok(ids.into_iter().filter(|id| !live.contains(id)).collect())
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
