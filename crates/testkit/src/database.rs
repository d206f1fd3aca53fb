//! A database per test, cloned from a template migrated once per migration set.

use std::time::Duration;

use anyhow::Context;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use ring::digest;
use tokio::sync::OnceCell;

/// The PostgreSQL server tests use, without a database name.
pub fn database_server_url() -> String {
    std::env::var("TOCSIN_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".to_owned())
}

fn url_for(database: &str) -> String {
    format!("{}/{database}", database_server_url().trim_end_matches('/'))
}

static TEMPLATE: OnceCell<String> = OnceCell::const_new();

/// The template's name carries a hash of the migrations, of the code that puts the delivery log
/// in day partitions, and of today's date (a template's partitions start on the day it was
/// made), so a change to any of them makes a new one.
fn template_name() -> String {
    let mut context = digest::Context::new(&digest::SHA256);
    let storage = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../storage");
    let mut files = vec![storage.join("src/partitions.rs")];
    context.update(
        time::OffsetDateTime::now_utc()
            .date()
            .to_string()
            .as_bytes(),
    );
    let mut dirs = vec![storage.join("migrations")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files.sort();
    for file in files {
        context.update(file.to_string_lossy().as_bytes());
        context.update(&std::fs::read(&file).unwrap_or_default());
    }
    let hash = context.finish();
    let hex: String = hash.as_ref()[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("tocsin_template_{hex}")
}

async fn admin_connection() -> anyhow::Result<AsyncPgConnection> {
    AsyncPgConnection::establish(&url_for("postgres"))
        .await
        .context("connecting to the test PostgreSQL server (is it running? see README)")
}

async fn ensure_template() -> anyhow::Result<String> {
    let name = template_name();
    let mut conn = admin_connection().await?;
    // Test binaries run in parallel: one creates the template, the others wait for it.
    diesel::sql_query("SELECT pg_advisory_lock(1952670574)")
        .execute(&mut conn)
        .await?;
    let exists = diesel::sql_query(format!(
        "SELECT 1 AS one FROM pg_database WHERE datname = '{name}'"
    ))
    .execute(&mut conn)
    .await?
        > 0;
    let result = async {
        if !exists {
            let building = format!("{name}_building");
            diesel::sql_query(format!("DROP DATABASE IF EXISTS {building} WITH (FORCE)"))
                .execute(&mut conn)
                .await?;
            diesel::sql_query(format!("CREATE DATABASE {building}"))
                .execute(&mut conn)
                .await?;
            tocsin_storage::migrate(&url_for(&building)).await?;
            diesel::sql_query(format!("ALTER DATABASE {building} RENAME TO {name}"))
                .execute(&mut conn)
                .await?;
        }
        anyhow::Ok(())
    }
    .await;
    diesel::sql_query("SELECT pg_advisory_unlock(1952670574)")
        .execute(&mut conn)
        .await?;
    result?;
    Ok(name)
}

/// A database of its own for one test, migrated, dropped when the value is dropped.
#[derive(Debug)]
pub struct TestDb {
    pub name: String,
    pub url: String,
}

impl TestDb {
    pub async fn new() -> TestDb {
        Self::try_new().await.expect("creating a test database")
    }

    /// Rows of `table_and_condition`, e.g. `"deliveries WHERE state = 'failed'"`.
    pub async fn count(&self, table_and_condition: &str) -> i64 {
        #[derive(diesel::QueryableByName)]
        struct N {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        let mut conn = AsyncPgConnection::establish(&self.url)
            .await
            .expect("connecting to the test database");
        diesel::sql_query(format!("SELECT count(*) AS n FROM {table_and_condition}"))
            .load::<N>(&mut conn)
            .await
            .expect("counting rows")[0]
            .n
    }

    /// A database of its own with no tables (to test migrations themselves).
    pub async fn empty() -> TestDb {
        let name = format!("tocsin_test_{}", uuid::Uuid::new_v4().simple());
        let mut conn = admin_connection().await.expect("connecting to PostgreSQL");
        diesel::sql_query(format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .await
            .expect("creating an empty test database");
        TestDb {
            url: url_for(&name),
            name,
        }
    }

    async fn try_new() -> anyhow::Result<TestDb> {
        let template = TEMPLATE
            .get_or_try_init(ensure_template)
            .await
            .context("preparing the template database")?
            .clone();
        let name = format!("tocsin_test_{}", uuid::Uuid::new_v4().simple());
        let mut conn = admin_connection().await?;
        let mut tries = 0;
        loop {
            let created = diesel::sql_query(format!("CREATE DATABASE {name} TEMPLATE {template}"))
                .execute(&mut conn)
                .await;
            match created {
                Ok(_) => break,
                // "source database is being accessed by other users": another clone is copying.
                Err(error) if tries < 50 => {
                    tries += 1;
                    tracing::debug!(%error, "template busy; retrying");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(error) => return Err(error).context("cloning the template database"),
            }
        }
        Ok(TestDb {
            url: url_for(&name),
            name,
        })
    }

    /// This database's URL in the libpq multi-host form, with `hosts` (`host:port`, comma
    /// separated) listed before the real server and `target_session_attrs=read-write`.
    pub fn multi_host_url(&self, hosts: &str) -> String {
        let (scheme, rest) = self.url.split_once("://").expect("a URL");
        let authority_at = rest.find('@').map_or(0, |at| at + 1);
        let (user, server) = rest.split_at(authority_at);
        let separator = if server.contains('?') { '&' } else { '?' };
        format!("{scheme}://{user}{hosts},{server}{separator}target_session_attrs=read-write")
    }

    /// A pool on this database.
    pub fn pool(&self) -> tocsin_storage::DbPool {
        tocsin_storage::pool(&self.url, 8).expect("building a pool")
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop may run inside a runtime: do the async clean-up on a thread of its own.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async {
                let mut conn = admin_connection().await.ok()?;
                diesel::sql_query(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .execute(&mut conn)
                    .await
                    .ok()
            })
        })
        .join();
    }
}
