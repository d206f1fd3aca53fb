//! Inbound tokens on the real database: a token's source and credential opt-ins are stored as
//! issued and come back with its authentication; the database's list of source names is the
//! domain's; a signing secret belongs to a Sentry token only, SNS's signature to a CloudWatch one.

use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use tocsin_domain::alerts::AlertFormat;
use tocsin_domain::{AccessToken, SigningSecret};
use tocsin_storage::tokens::{self, NewToken};
use tocsin_storage::Page;
use tocsin_testkit::TestDb;

#[tokio::test]
async fn a_tokens_source_and_opt_ins_come_back_with_its_authentication() {
    let db = TestDb::new().await;
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    let secret = SigningSecret::parse("sentry-client-secret").unwrap();
    let (record, token) = tokens::issue(
        &mut conn,
        &NewToken {
            name: "sentry",
            source: Some(AlertFormat::Sentry),
            basic_auth: true,
            query_token: false,
            signing_secret: Some(&secret),
            sns_signature: false,
        },
    )
    .await
    .unwrap();
    assert_eq!(record.source.as_deref(), Some("sentry"));
    assert!(record.basic_auth && !record.query_token);
    assert!(!format!("{record:?}").contains("sentry-client-secret"));

    let (_, plain) = tokens::create(&mut conn, "plain").await.unwrap();
    let unknown = AccessToken::generate();
    let live = tokens::authenticate_all(&mut conn, &[token.clone(), plain, unknown])
        .await
        .unwrap();
    let sentry = live[0].clone().expect("the sentry token is live");
    assert_eq!(sentry.id, record.id);
    assert_eq!(sentry.source, Some(AlertFormat::Sentry));
    assert!(sentry.basic_auth && !sentry.query_token);
    assert_eq!(sentry.signing_secret, Some(secret));
    let plain = live[1].clone().expect("the plain token is live");
    assert_eq!(
        (
            plain.source,
            plain.basic_auth,
            plain.query_token,
            plain.signing_secret,
            plain.sns_signature
        ),
        (None, false, false, None, false)
    );
    assert!(live[2].is_none());

    let page = Page {
        limit: 10,
        cursor: None,
    };
    let (listed, _) = tokens::list(&mut conn, &page).await.unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[1].source.as_deref(), Some("sentry"));
}

#[tokio::test]
async fn the_database_admits_exactly_the_domains_source_names() {
    let db = TestDb::new().await;
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    for format in AlertFormat::ALL {
        let name = format.as_str();
        let new = NewToken {
            source: Some(format),
            ..NewToken::named(name)
        };
        tokens::issue(&mut conn, &new).await.unwrap();
    }
    let refused = diesel::sql_query(
        "INSERT INTO inbound_tokens (id, name, lookup, token_hash, created_at, source) \
         VALUES (gen_random_uuid(), 'x', 'x', '\\x00', now(), 'nagios')",
    )
    .execute(&mut conn)
    .await;
    assert!(refused.is_err(), "an unknown source name must be refused");
}

#[tokio::test]
async fn only_a_sentry_token_keeps_a_signing_secret() {
    let db = TestDb::new().await;
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    let secret = SigningSecret::parse("s").unwrap();
    for source in [None, Some(AlertFormat::CloudWatch)] {
        let new = NewToken {
            source,
            signing_secret: Some(&secret),
            ..NewToken::named("signed")
        };
        assert!(
            tokens::issue(&mut conn, &new).await.is_err(),
            "{source:?} must not keep a secret"
        );
    }
}

#[tokio::test]
async fn only_a_cloudwatch_token_requires_sns_signatures() {
    let db = TestDb::new().await;
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    for source in [None, Some(AlertFormat::Sentry), Some(AlertFormat::Generic)] {
        let new = NewToken {
            source,
            sns_signature: true,
            ..NewToken::named("sns")
        };
        assert!(
            tokens::issue(&mut conn, &new).await.is_err(),
            "{source:?} must not require SNS signatures"
        );
    }
    let (record, token) = tokens::issue(
        &mut conn,
        &NewToken {
            source: Some(AlertFormat::CloudWatch),
            basic_auth: true,
            sns_signature: true,
            ..NewToken::named("sns")
        },
    )
    .await
    .unwrap();
    assert!(record.sns_signature);
    let live = tokens::authenticate_all(&mut conn, &[token]).await.unwrap();
    assert!(live[0].as_ref().expect("live").sns_signature);
}
