//! Admin keys: named bearer keys with one role, issued and revoked through admin, stored as
//! hashes like inbound tokens (`tak_<lookup>_<secret>`), with an optional expiry. Every request
//! looks its key up here, so a revocation holds at once on every admin instance.

use std::fmt;

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use time::OffsetDateTime;
use tocsin_domain::{AccessToken, Role};
use uuid::Uuid;

use crate::schema::admin_keys;
use crate::{Cursor, DbError, Listed, Page};

/// A key's record; the key itself is never stored.
#[derive(Clone, Queryable, Selectable)]
#[diesel(table_name = admin_keys)]
pub struct AdminKeyRow {
    pub id: Uuid,
    pub name: String,
    pub role: String,
    pub lookup: String,
    pub key_hash: Vec<u8>,
    pub created_at: OffsetDateTime,
    pub expires_at: Option<OffsetDateTime>,
    pub last_used_at: Option<OffsetDateTime>,
    pub revoked_at: Option<OffsetDateTime>,
}

/// An admin key's record, its role parsed. `Debug` leaves the hash out.
#[derive(Clone)]
pub struct AdminKey {
    pub id: Uuid,
    pub name: String,
    pub role: Role,
    /// The public part of the key (`tak_<lookup>_…`), to tell keys apart.
    pub lookup: String,
    pub key_hash: Vec<u8>,
    pub created_at: OffsetDateTime,
    pub expires_at: Option<OffsetDateTime>,
    pub last_used_at: Option<OffsetDateTime>,
    pub revoked_at: Option<OffsetDateTime>,
}

impl fmt::Debug for AdminKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminKey")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("role", &self.role)
            .field("lookup", &self.lookup)
            .field("expires_at", &self.expires_at)
            .field("revoked_at", &self.revoked_at)
            .finish_non_exhaustive()
    }
}

impl AdminKey {
    /// Neither revoked nor expired at `now`.
    pub fn is_live(&self, now: OffsetDateTime) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|at| at > now)
    }
}

impl TryFrom<AdminKeyRow> for AdminKey {
    type Error = DbError;
    fn try_from(row: AdminKeyRow) -> Result<Self, DbError> {
        let role = row
            .role
            .parse::<Role>()
            .map_err(|_| DbError::Corrupt(format!("admin key {}: bad role", row.id)))?;
        Ok(AdminKey {
            id: row.id,
            name: row.name,
            role,
            lookup: row.lookup,
            key_hash: row.key_hash,
            created_at: row.created_at,
            expires_at: row.expires_at,
            last_used_at: row.last_used_at,
            revoked_at: row.revoked_at,
        })
    }
}

impl Listed for AdminKey {
    fn cursor(&self) -> Cursor {
        Cursor::new(self.created_at, self.id)
    }
}

/// A key to issue.
#[derive(Debug, Clone)]
pub struct NewAdminKey<'a> {
    pub name: &'a str,
    pub role: Role,
    pub expires_at: Option<OffsetDateTime>,
}

/// Issues a key. The returned [`AccessToken`] is the only copy of it.
pub async fn issue(
    conn: &mut AsyncPgConnection,
    new: &NewAdminKey<'_>,
) -> Result<(AdminKey, AccessToken), DbError> {
    let key = AccessToken::generate_admin_key();
    let row = diesel::insert_into(admin_keys::table)
        .values((
            admin_keys::id.eq(Uuid::now_v7()),
            admin_keys::name.eq(new.name),
            admin_keys::role.eq(new.role.as_str()),
            admin_keys::lookup.eq(key.lookup()),
            admin_keys::key_hash.eq(key.hash()),
            admin_keys::created_at.eq(OffsetDateTime::now_utc()),
            admin_keys::expires_at.eq(new.expires_at),
        ))
        .returning(AdminKeyRow::as_returning())
        .get_result(conn)
        .await?;
    Ok((row.try_into()?, key))
}

/// The live key matching `presented` (compared in constant time); `None` for an unknown,
/// revoked or expired key. Notes its use, at most once a minute.
pub async fn authenticate(
    conn: &mut AsyncPgConnection,
    presented: &AccessToken,
) -> Result<Option<AdminKey>, DbError> {
    let row: Option<AdminKeyRow> = admin_keys::table
        .filter(admin_keys::lookup.eq(presented.lookup()))
        .select(AdminKeyRow::as_select())
        .first(conn)
        .await
        .optional()?;
    let now = OffsetDateTime::now_utc();
    let Some(key) = row
        .filter(|row| presented.matches(&row.key_hash))
        .map(AdminKey::try_from)
        .transpose()?
        .filter(|key| key.is_live(now))
    else {
        return Ok(None);
    };
    note_use(conn, &key, now).await?;
    Ok(Some(key))
}

/// A key by id, whatever its state.
pub async fn get(conn: &mut AsyncPgConnection, id: Uuid) -> Result<AdminKey, DbError> {
    admin_keys::table
        .find(id)
        .select(AdminKeyRow::as_select())
        .first(conn)
        .await
        .optional()?
        .ok_or(DbError::NotFound)?
        .try_into()
}

/// Records that `key` was used at `now`, unless it was within the last minute (to keep
/// requests free of writes).
pub async fn note_use(
    conn: &mut AsyncPgConnection,
    key: &AdminKey,
    now: OffsetDateTime,
) -> Result<(), DbError> {
    if key
        .last_used_at
        .is_none_or(|used| now - used > time::Duration::MINUTE)
    {
        diesel::update(admin_keys::table.find(key.id))
            .set(admin_keys::last_used_at.eq(now))
            .execute(conn)
            .await?;
    }
    Ok(())
}

/// Keys, newest first, revoked and expired ones included.
pub async fn list(
    conn: &mut AsyncPgConnection,
    page: &Page,
) -> Result<(Vec<AdminKey>, Option<Cursor>), DbError> {
    let mut query = admin_keys::table
        .select(AdminKeyRow::as_select())
        .order((admin_keys::created_at.desc(), admin_keys::id.desc()))
        .limit(page.limit + 1)
        .into_boxed();
    if let Some(cursor) = &page.cursor {
        query = query.filter(cursor.before("admin_keys"));
    }
    let rows: Vec<AdminKeyRow> = query.load(conn).await?;
    page.finish(rows)
}

/// Revokes a live key (`NotFound` for an unknown or already revoked one); returns it as it
/// was. Its next request is refused.
pub async fn revoke(conn: &mut AsyncPgConnection, id: Uuid) -> Result<AdminKey, DbError> {
    let row: Option<AdminKeyRow> = diesel::update(
        admin_keys::table
            .find(id)
            .filter(admin_keys::revoked_at.is_null()),
    )
    .set(admin_keys::revoked_at.eq(OffsetDateTime::now_utc()))
    .returning(AdminKeyRow::as_returning())
    .get_result(conn)
    .await
    .optional()?;
    row.ok_or(DbError::NotFound)?.try_into()
}

/// Whether some live key has the `admin` role (admin refuses to start with the bootstrap
/// token off without one).
pub async fn any_live_admin(conn: &mut AsyncPgConnection) -> Result<bool, DbError> {
    let now = OffsetDateTime::now_utc();
    let count: i64 = admin_keys::table
        .filter(admin_keys::role.eq(Role::Admin.as_str()))
        .filter(admin_keys::revoked_at.is_null())
        .filter(
            admin_keys::expires_at
                .is_null()
                .or(admin_keys::expires_at.gt(now)),
        )
        .count()
        .get_result(conn)
        .await?;
    Ok(count > 0)
}
