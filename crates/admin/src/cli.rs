//! The operator's command line: `tocsin-admin token ...` (inbound tokens, for bootstrapping and
//! scripts), `key ...` (admin keys), `audit` (the audit log), `migrate`, `reshape`,
//! `deliveries failed|retry|recover`, `prune` and `parked list|replay`. Only the token goes to
//! stdout on `token create` (and the key on `key create`), so
//! `TOKEN=$(tocsin-admin token create --name x)` captures it; everything else a command says
//! about itself goes to stderr. Its changes are recorded in the audit log as made by
//! `cli:$USER` through the `cli` surface.

use std::io::Write;

use anyhow::Context;
use diesel_async::{AsyncConnection, AsyncPgConnection};
use tocsin_storage::{tokens, DbError, Page};

use crate::actor::Actor;
use crate::api::admin_keys::{CheckedKey, NewAdminKey};
use crate::api::tokens::{CheckedToken, NewToken};
use crate::audit::Change;
use crate::config::{
    AuditArgs, DeliveriesAction, DeliveriesArgs, KeyAction, KeyArgs, MigrateArgs, ParkedAction,
    ParkedArgs, PruneArgs, TokenAction, TokenArgs,
};
use crate::error::AdminError;
use crate::store;

/// Migrates, then connects.
async fn connect(url: &str) -> anyhow::Result<AsyncPgConnection> {
    tocsin_storage::migrate(url)
        .await
        .context("DATABASE_URL: migrating the database")?;
    AsyncPgConnection::establish(url).await.with_context(|| {
        format!(
            "DATABASE_URL: connecting to {}",
            tocsin_domain::redact_url(url)
        )
    })
}

/// `tocsin-admin migrate`.
pub async fn migrate(args: MigrateArgs) -> anyhow::Result<()> {
    let applied = tocsin_storage::migrate(&args.common.database_url)
        .await
        .context("DATABASE_URL: migrating the database")?;
    eprintln!("applied {applied} migration(s); the database is up to date");
    Ok(())
}

/// `tocsin-admin prune`, recorded in the audit log (as `delivery.prune`, with what it removed)
/// once it is done.
pub async fn prune(args: PruneArgs) -> anyhow::Result<()> {
    let mut conn = connect(&args.common.database_url).await?;
    let now = time::OffsetDateTime::now_utc();
    let keep = time::Duration::try_from(args.retention).context("--retention: too long")?;
    let before = now - keep;
    let pruned =
        tocsin_storage::retention::prune(&mut conn, before, now - keep.min(time::Duration::DAY))
            .await?;
    let change = Change {
        action: "delivery.prune",
        resource_type: "delivery",
        resource_id: None,
        before: None,
        after: Some(serde_json::json!({
            "before": tocsin_domain::rfc3339_utc::format(before),
            "days_dropped": pruned.days.dropped,
            "days_emptied": pruned.days.emptied,
            "unfinished_kept": pruned.days.kept,
            "deliveries": pruned.deliveries,
            "events": pruned.events,
            "outbox": pruned.outbox,
        })),
    };
    Actor::cli()
        .record(&mut conn, change)
        .await
        .context("recording the prune in the audit log")?;
    eprintln!(
        "pruned {} days of the delivery log ({} more emptied but for {} unfinished deliveries), \
         {} deliveries (with their attempts) and {} events row by row, {} outbox rows",
        pruned.days.dropped,
        pruned.days.emptied,
        pruned.days.kept,
        pruned.deliveries,
        pruned.events,
        pruned.outbox
    );
    Ok(())
}

/// `tocsin-admin reshape`.
pub async fn reshape(args: MigrateArgs) -> anyhow::Result<()> {
    let mut conn = connect(&args.common.database_url).await?;
    let reshaped = tocsin_storage::partitions::reshape(&mut conn, time::OffsetDateTime::now_utc())
        .await
        .context("moving the delivery log into day partitions")?;
    if reshaped.tables.is_empty() {
        eprintln!("the delivery log is already in day partitions");
    } else {
        eprintln!(
            "moved {} into day partitions ({} deliveries given a time-ordered id)",
            reshaped.tables.join(", "),
            reshaped.rekeyed
        );
    }
    Ok(())
}

/// `tocsin-admin parked ...`: reads and replays the parking queue (needs only `AMQP_URL` and
/// `TOCSIN_AMQP_PREFIX`).
pub async fn parked(args: ParkedArgs) -> anyhow::Result<()> {
    use tocsin_broker::ParkedBody;
    let broker = args.common.broker("admin-cli");
    let queue = broker.topology().parking_queue();
    let mut out = std::io::stdout().lock();
    match args.action {
        ParkedAction::List { limit } => {
            let parked = broker
                .parked(limit)
                .await
                .context("AMQP_URL: reading the parking queue")?;
            writeln!(out, "KIND\tID\tREASON\tFROM")?;
            for message in &parked {
                let (kind, id) = match &message.body {
                    ParkedBody::Event(event) => ("event", event.event_id.to_string()),
                    ParkedBody::Delivery(delivery) => {
                        ("delivery", delivery.delivery_id.to_string())
                    }
                    ParkedBody::Unreadable => ("unreadable", "-".to_owned()),
                };
                writeln!(
                    out,
                    "{kind}\t{id}\t{}\t{}",
                    message.reason.as_deref().unwrap_or("-"),
                    message.from_queue.as_deref().unwrap_or("-")
                )?;
            }
            eprintln!(
                "{} message(s) parked in {queue} listed; nothing removed",
                parked.len()
            );
        }
        ParkedAction::Replay { limit } => {
            let replayed = broker
                .replay_parked(limit)
                .await
                .context("AMQP_URL: replaying the parking queue")?;
            writeln!(out, "{}", replayed.events + replayed.deliveries)?;
            eprintln!(
                "replayed {} event(s) to the fan-out and {} attempt(s) to the delivery queue; \
                 {} unreadable message(s) left in {queue}",
                replayed.events, replayed.deliveries, replayed.left
            );
        }
    }
    broker.close().await;
    Ok(())
}

/// `tocsin-admin deliveries ...`.
pub async fn deliveries(args: DeliveriesArgs) -> anyhow::Result<()> {
    use tocsin_storage::deliveries::{self as repo, DeliveryFilter, DeliveryState};
    let mut conn = connect(&args.common.database_url).await?;
    let mut out = std::io::stdout().lock();
    match args.action {
        DeliveriesAction::Failed { webhook, limit } => {
            let filter = DeliveryFilter {
                webhook_id: webhook,
                state: Some(DeliveryState::Failed),
                ..DeliveryFilter::default()
            };
            let page = Page {
                limit: limit.clamp(1, Page::MAX_LIMIT),
                cursor: None,
            };
            let (items, _) = repo::list(&mut conn, &filter, &page).await?;
            writeln!(out, "ID\tWEBHOOK\tEVENT\tINCIDENT\tATTEMPTS\tUPDATED")?;
            for d in items {
                writeln!(
                    out,
                    "{}\t{}\t{}\t{}\t{}\t{}",
                    d.id,
                    d.webhook_id,
                    d.event,
                    d.incident_id,
                    d.attempt_count,
                    tocsin_domain::rfc3339_utc::format(d.updated_at)
                )?;
            }
        }
        DeliveriesAction::Retry { id } => {
            match store::retry(&mut conn, &Actor::cli(), id, crate::actions::undeliverable).await {
                Ok(Ok(Some(_))) => {}
                Ok(Ok(None)) => {
                    anyhow::bail!("delivery {id} succeeded already: nothing is retried")
                }
                Ok(Err(refused)) => anyhow::bail!("delivery {id}: {refused}"),
                Err(DbError::NotFound) => anyhow::bail!("no delivery {id}"),
                Err(error) => return Err(error.into()),
            }
            eprintln!("enqueued a manual attempt of delivery {id}");
        }
        DeliveriesAction::Replay {
            webhook,
            since,
            until,
            events,
        } => {
            let request = crate::actions::replay_request(
                webhook,
                &since,
                until.as_deref(),
                events.as_deref(),
            )
            .map_err(|e| anyhow::anyhow!("{e}"))?;
            let replay = match store::replay(&mut conn, &Actor::cli(), &request).await {
                Ok(replay) => replay,
                Err(DbError::NotFound) => anyhow::bail!("no webhook {webhook}"),
                Err(error) => return Err(error.into()),
            };
            writeln!(out, "{}", replay.id)?;
            eprintln!(
                "recorded replay {} of webhook {webhook}; dispatchers make its deliveries",
                replay.id
            );
        }
        DeliveriesAction::Recover { webhook, since } => {
            let recovered = store::recover(
                &mut conn,
                &Actor::cli(),
                webhook,
                since,
                crate::actions::undeliverable,
            )
            .await;
            let (n, waiting) = match recovered {
                Ok(Ok(counts)) => counts,
                Ok(Err(refused)) => anyhow::bail!("webhook {webhook}: {refused}"),
                Err(DbError::NotFound) => anyhow::bail!("no webhook {webhook}"),
                Err(error) => return Err(error.into()),
            };
            writeln!(out, "{n}")?;
            eprintln!(
                "enqueued a manual attempt of {n} failed deliveries, and {waiting} deliveries that waited while the webhook was disabled"
            );
        }
    }
    Ok(())
}

/// Runs a token command.
pub async fn run(args: TokenArgs) -> anyhow::Result<()> {
    let mut conn = connect(&args.common.database_url).await?;
    let mut out = std::io::stdout().lock();
    match args.action {
        TokenAction::Create {
            name,
            source,
            basic_auth,
            query_token,
            signing_secret,
            sns_signature,
        } => {
            let new = NewToken {
                name,
                source,
                basic_auth,
                query_token,
                signing_secret,
                sns_signature,
            };
            let checked = CheckedToken::check(new).map_err(flag_error)?;
            let (record, token) =
                store::issue_token(&mut conn, &Actor::cli(), &checked.as_new()).await?;
            writeln!(out, "{}", token.expose())?;
            eprintln!(
                "created inbound token {} ({}, prefix {}{}); it is shown only this once",
                record.id,
                record.name,
                record.lookup,
                record
                    .source
                    .as_deref()
                    .map_or_else(String::new, |source| format!(", source {source}"))
            );
        }
        TokenAction::List => {
            writeln!(out, "ID\tNAME\tPREFIX\tSOURCE\tCREATED\tLAST USED\tREVOKED")?;
            let mut page = Page {
                limit: Page::MAX_LIMIT,
                cursor: None,
            };
            loop {
                let (items, next) = tokens::list(&mut conn, &page).await?;
                for t in items {
                    writeln!(
                        out,
                        "{}\t{}\t{}\t{}\t{}\t{}\t{}",
                        t.id,
                        t.name,
                        t.lookup,
                        t.source.as_deref().unwrap_or("-"),
                        tocsin_domain::rfc3339_utc::format(t.created_at),
                        time_or_dash(t.last_used_at),
                        time_or_dash(t.revoked_at)
                    )?;
                }
                match next {
                    Some(cursor) => page.cursor = Some(cursor),
                    None => break,
                }
            }
        }
        TokenAction::Revoke { id } => match store::revoke_token(&mut conn, &Actor::cli(), id).await
        {
            Ok(()) => eprintln!("revoked inbound token {id}"),
            Err(DbError::NotFound) => {
                anyhow::bail!("no live inbound token {id} (unknown or already revoked)")
            }
            Err(error) => return Err(error.into()),
        },
    }
    Ok(())
}

/// The message of a refused field, named as the command line's flag (`--expires-at`).
fn flag_error(error: AdminError) -> anyhow::Error {
    match error {
        AdminError::Invalid { field, message } => {
            anyhow::anyhow!("--{}: {message}", field.replace('_', "-"))
        }
        other => anyhow::anyhow!("{other}"),
    }
}

fn time_or_dash(at: Option<time::OffsetDateTime>) -> String {
    at.map_or_else(|| "-".to_owned(), tocsin_domain::rfc3339_utc::format)
}

/// `tocsin-admin key ...`.
pub async fn keys(args: KeyArgs) -> anyhow::Result<()> {
    use tocsin_storage::admin_keys;
    let mut conn = connect(&args.common.database_url).await?;
    let mut out = std::io::stdout().lock();
    match args.action {
        KeyAction::Create {
            name,
            role,
            expires_at,
        } => {
            let checked = CheckedKey::check(&NewAdminKey {
                name,
                role,
                expires_at,
            })
            .map_err(flag_error)?;
            let (record, key) =
                store::issue_admin_key(&mut conn, &Actor::cli(), &checked.as_new()).await?;
            writeln!(out, "{}", key.expose())?;
            eprintln!(
                "created admin key {} ({}, role {}, prefix {}); it is shown only this once",
                record.id, record.name, record.role, record.lookup
            );
        }
        KeyAction::List => {
            writeln!(
                out,
                "ID\tNAME\tROLE\tPREFIX\tCREATED\tEXPIRES\tLAST USED\tREVOKED"
            )?;
            let mut page = Page {
                limit: Page::MAX_LIMIT,
                cursor: None,
            };
            loop {
                let (items, next) = admin_keys::list(&mut conn, &page).await?;
                for k in items {
                    writeln!(
                        out,
                        "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
                        k.id,
                        k.name,
                        k.role,
                        k.lookup,
                        tocsin_domain::rfc3339_utc::format(k.created_at),
                        time_or_dash(k.expires_at),
                        time_or_dash(k.last_used_at),
                        time_or_dash(k.revoked_at)
                    )?;
                }
                match next {
                    Some(cursor) => page.cursor = Some(cursor),
                    None => break,
                }
            }
        }
        KeyAction::Revoke { id } => {
            match store::revoke_admin_key(&mut conn, &Actor::cli(), id).await {
                Ok(_) => eprintln!("revoked admin key {id}"),
                Err(DbError::NotFound) => {
                    anyhow::bail!("no live admin key {id} (unknown or already revoked)")
                }
                Err(error) => return Err(error.into()),
            }
        }
    }
    Ok(())
}

/// `tocsin-admin audit`: the newest entries, one a line, tab-separated.
pub async fn audit(args: AuditArgs) -> anyhow::Result<()> {
    let query = crate::api::audit_log::AuditQuery {
        actor: args.actor,
        resource_type: args.resource_type,
        resource_id: args.resource_id,
        action: args.action,
        since: args.since,
        until: args.until,
        limit: None,
        cursor: None,
    };
    let filter = query.filter().map_err(|e| anyhow::anyhow!("--{e}"))?;
    let mut conn = connect(&args.common.database_url).await?;
    let page = Page {
        limit: args.limit.clamp(1, Page::MAX_LIMIT),
        cursor: None,
    };
    let (entries, _) = tocsin_storage::audit::list(&mut conn, &filter, &page).await?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "AT\tACTOR\tACTOR ID\tSURFACE\tADDRESS\tACTION\tRESOURCE\tID"
    )?;
    for e in entries {
        writeln!(
            out,
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            tocsin_domain::rfc3339_utc::format(e.created_at),
            e.actor_name,
            e.actor_id
                .map_or_else(|| "-".to_owned(), |id| id.to_string()),
            e.surface,
            e.address.as_deref().unwrap_or("-"),
            e.action,
            e.resource_type,
            e.resource_id.as_deref().unwrap_or("-"),
        )?;
    }
    Ok(())
}
