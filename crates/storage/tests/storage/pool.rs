//! The pool and ping: pooled connections' session settings and age, an unreachable database,
//! and a multi-host database URL that skips an unreachable host.

use std::time::Duration;

use diesel_async::RunQueryDsl;
use tocsin_testkit::TestDb;

/// The pool's connections plan as `tocsin_storage::SESSION_SETTINGS` says: once, without JIT
/// (a query costed above `jit_above_cost` was compiled with LLVM on every call,
/// docs/performance.md), and with sequential scans left to the planner.
#[tokio::test]
async fn pooled_connections_plan_once_and_without_jit() {
    use diesel::sql_types::Text;
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    for (setting, expected) in [
        ("plan_cache_mode", "force_generic_plan"),
        ("enable_seqscan", "on"),
        ("jit", "off"),
    ] {
        let value: String = diesel::select(diesel::dsl::sql::<Text>(&format!(
            "current_setting('{setting}')"
        )))
        .get_result(&mut conn)
        .await
        .unwrap();
        assert_eq!(value, expected, "{setting}");
    }
}

/// A connection past its age is replaced when it is next taken; a younger one is handed out again.
#[tokio::test]
async fn a_connection_past_its_age_is_replaced() {
    use diesel::sql_types::Integer;
    let db = TestDb::new().await;
    async fn backend(pool: &tocsin_storage::DbPool) -> i32 {
        let mut conn = pool.get().await.unwrap();
        diesel::select(diesel::dsl::sql::<Integer>("pg_backend_pid()"))
            .get_result(&mut conn)
            .await
            .unwrap()
    }
    let young = tocsin_storage::pool_with_max_age(&db.url, 1, Duration::from_secs(3600)).unwrap();
    assert_eq!(backend(&young).await, backend(&young).await, "kept");
    let old = tocsin_storage::pool_with_max_age(&db.url, 1, Duration::ZERO).unwrap();
    assert_ne!(backend(&old).await, backend(&old).await, "replaced");
}

#[tokio::test]
async fn ping_reports_an_unreachable_database() {
    let pool = tocsin_storage::pool("postgres://postgres@127.0.0.1:1/none", 1).unwrap();
    let error = tocsin_storage::ping(&pool, Duration::from_secs(2))
        .await
        .unwrap_err();
    assert!(error.is_transient(), "{error}");
}

#[tokio::test]
async fn a_multi_host_database_url_skips_an_unreachable_host() {
    let db = TestDb::new().await;
    let url = db.multi_host_url("127.0.0.1:1");
    assert!(url.contains("127.0.0.1:1,"), "{url}");
    assert_eq!(
        tocsin_storage::migrate(&url).await.unwrap(),
        0,
        "already migrated"
    );
    let pool = tocsin_storage::pool(&url, 2).unwrap();
    tocsin_storage::ping(&pool, Duration::from_secs(5))
        .await
        .unwrap();
    // Only unreachable hosts: unavailable, as with one.
    let nowhere =
        tocsin_storage::pool("postgres://postgres@127.0.0.1:1,127.0.0.1:2/none", 1).unwrap();
    let error = tocsin_storage::ping(&nowhere, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(error.is_transient(), "{error}");
}
