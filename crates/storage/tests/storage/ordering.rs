//! Ordered delivery per incident, and replays, at the statements: the fan-out of an incident's later event
//! creates the earlier deliveries it finds missing and makes the later ones wait (`ordering`);
//! the claim admits a delivery only once every earlier one has finished; the next in order is
//! found when one finishes; and a webhook with `ordering: none` is untouched by all of it.

use diesel_async::AsyncPgConnection;
use tocsin_domain::alerts::AlertAction;
use tocsin_domain::{EventKind, WebhookOrdering};
use tocsin_storage::attempts::{self, Claim, Trigger};
use tocsin_storage::deliveries::{self, Delivery, DeliveryState, WaitReason};
use tocsin_storage::fan_out;
use tocsin_storage::outbox::{NewEvent, Wake};
use tocsin_storage::webhooks::{self, Webhook, WebhookChanges};
use tocsin_testkit::deliveries::{answered, claim_rules};
use tocsin_testkit::TestDb;

use crate::common::{
    completion, deliveries_of, fan_out_request, open, signal, webhook_for_every_event, PENDING,
};

async fn ordered_webhook(conn: &mut AsyncPgConnection, name: &str) -> Webhook {
    let webhook = webhook_for_every_event(conn, name).await;
    webhooks::update(
        conn,
        webhook.id,
        &WebhookChanges {
            ordering: Some(WebhookOrdering::Incident),
            ..Default::default()
        },
    )
    .await
    .unwrap()
}

/// Resolves the incident of `key`: its `status_changed` and `resolved` events.
async fn resolve(conn: &mut AsyncPgConnection, key: &str) -> Vec<NewEvent> {
    tocsin_testkit::apply_signals(conn, &[signal(key, AlertAction::Resolve)], Wake::Listeners)
        .await
        .unwrap()
        .remove(0)
        .events
}

fn by_kind(deliveries: &[Delivery], kind: EventKind) -> &Delivery {
    deliveries.iter().find(|d| d.event == kind).unwrap()
}

async fn claim(conn: &mut AsyncPgConnection, id: uuid::Uuid) -> Option<attempts::Job> {
    attempts::claim(
        conn,
        &[Claim {
            delivery_id: id,
            trigger: Trigger::Automatic,
            auto_attempts: 0,
        }],
        claim_rules(),
    )
    .await
    .unwrap()
    .pop()
    .unwrap()
}

/// The incident's last event is fanned out first (another dispatcher has the earlier ones):
/// every delivery of the incident is created, the first due, the later ones waiting for their
/// order; a claim of a later one is refused until the earlier ones have finished, and each
/// finish names the next. An unordered webhook gets its one delivery, due at once.
#[tokio::test]
async fn a_later_event_fanned_out_first_creates_the_earlier_deliveries_and_waits() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let ordered = ordered_webhook(&mut conn, "ordered").await;
    let unordered = webhook_for_every_event(&mut conn, "unordered").await;
    let opened = open(&mut conn, "k").await;
    let later = resolve(&mut conn, "k").await;
    let resolved = later
        .iter()
        .find(|e| e.kind == EventKind::IncidentResolved)
        .unwrap();
    fan_out::fan_out(&mut conn, &[fan_out_request(resolved, false)], &[], PENDING)
        .await
        .unwrap();

    let mine = deliveries_of(&mut conn, ordered.id).await;
    assert_eq!(
        mine.len(),
        3,
        "the earlier events' deliveries were made too"
    );
    let first = by_kind(&mine, EventKind::IncidentOpened);
    let changed = by_kind(&mine, EventKind::IncidentStatusChanged);
    let last = by_kind(&mine, EventKind::IncidentResolved);
    assert_eq!(first.state, DeliveryState::Pending);
    for later in [changed, last] {
        assert_eq!(
            (later.state, later.wait_reason),
            (DeliveryState::Waiting, Some(WaitReason::Ordering))
        );
    }
    let theirs = deliveries_of(&mut conn, unordered.id).await;
    assert_eq!(
        theirs.len(),
        1,
        "an unordered webhook gets only the event fanned out"
    );
    assert_eq!(theirs[0].state, DeliveryState::Pending);

    // Fanned out now, the earlier events make nothing more.
    let earlier: Vec<_> = std::iter::once(&opened)
        .chain(
            later
                .iter()
                .filter(|e| e.kind != EventKind::IncidentResolved),
        )
        .map(|e| fan_out_request(e, false))
        .collect();
    fan_out::fan_out(&mut conn, &earlier, &[], PENDING)
        .await
        .unwrap();
    assert_eq!(deliveries_of(&mut conn, ordered.id).await.len(), 3);

    // The last one cannot be claimed while the first is unfinished; its detail names the
    // delivery it waits for.
    assert!(claim(&mut conn, last.id).await.is_none());
    let detail = deliveries::get_detail(&mut conn, last.id).await.unwrap();
    assert_eq!(detail.delivery.wait_reason, Some(WaitReason::Ordering));
    assert_eq!(detail.waits_for, Some(changed.id));
    assert_eq!(
        deliveries::next_in_order(&mut conn, first.id)
            .await
            .unwrap(),
        None
    );

    // The first succeeds: the next in order is the status change, then the resolution.
    let job = claim(&mut conn, first.id).await.expect("the first is due");
    attempts::complete(&mut conn, &[completion(&job, answered(204))])
        .await
        .unwrap();
    let next = deliveries::next_in_order(&mut conn, first.id)
        .await
        .unwrap();
    assert_eq!(next.map(|d| d.delivery_id), Some(changed.id));
    assert!(claim(&mut conn, last.id).await.is_none(), "still behind");
    let job = claim(&mut conn, changed.id).await.expect("its turn");
    attempts::complete(&mut conn, &[completion(&job, answered(204))])
        .await
        .unwrap();
    let next = deliveries::next_in_order(&mut conn, changed.id)
        .await
        .unwrap();
    assert_eq!(next.map(|d| d.delivery_id), Some(last.id));
    assert!(claim(&mut conn, last.id).await.is_some());
}

/// A replay gives a webhook created after the events every matching one it has no delivery of,
/// a page at a time, marked `replayed` and with its first attempt enqueued; the kinds asked
/// for only; a second replay of the same window creates nothing.
#[tokio::test]
async fn a_replay_gives_each_past_event_once_a_page_at_a_time() {
    use tocsin_storage::replays::{self, NewReplay};
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let since = time::OffsetDateTime::now_utc() - time::Duration::minutes(1);
    for key in ["a", "b", "c"] {
        open(&mut conn, key).await;
    }
    resolve(&mut conn, "a").await;
    let webhook = webhook_for_every_event(&mut conn, "late").await;
    let replay = |kinds: Option<Vec<EventKind>>| NewReplay {
        webhook_id: webhook.id,
        since,
        until: None,
        kinds,
    };
    let margin = std::time::Duration::from_secs(5);

    replays::create(&mut conn, &replay(Some(vec![EventKind::IncidentOpened])))
        .await
        .unwrap();
    let mut pages = 0;
    while let Some(step) = replays::advance(&mut conn, 2, margin).await.unwrap() {
        pages += 1;
        if step.finished {
            break;
        }
    }
    assert_eq!(pages, 2, "3 events, 2 a page");
    let mine = deliveries_of(&mut conn, webhook.id).await;
    assert_eq!(mine.len(), 3, "the opened events only");
    assert!(mine
        .iter()
        .all(|d| d.replayed && d.event == EventKind::IncidentOpened));
    assert_eq!(
        db.count("outbox WHERE topic = 'delivery'").await,
        3,
        "each first attempt enqueued"
    );

    // Every kind now: the two events of the resolution are new; the rest it has already.
    let again = replays::create(&mut conn, &replay(None)).await.unwrap();
    while let Some(step) = replays::advance(&mut conn, 1000, margin).await.unwrap() {
        assert!(step.finished);
    }
    assert_eq!(deliveries_of(&mut conn, webhook.id).await.len(), 5);
    assert_eq!(replays::get(&mut conn, again.id).await.unwrap().created, 2);
    let third = replays::create(&mut conn, &replay(None)).await.unwrap();
    while replays::advance(&mut conn, 1000, margin)
        .await
        .unwrap()
        .is_some()
    {}
    assert_eq!(
        deliveries_of(&mut conn, webhook.id).await.len(),
        5,
        "nothing twice"
    );
    let third = replays::get(&mut conn, third.id).await.unwrap();
    assert_eq!(third.created, 0);
    assert!(third.finished_at.is_some());
}

/// A disabled ordered webhook that subscribes to an incident's first event only: when a later
/// event of another kind is fanned out first, the first event's delivery it brings in waits for
/// the webhook (`webhook_disabled`), unclaimed, like any delivery to a disabled webhook. It
/// used to be read as enabled, since only the given events' kinds were locked.
#[tokio::test]
async fn earlier_events_brought_in_respect_a_disabled_webhook() {
    let db = TestDb::new().await;
    let mut conn = db.pool().get().await.unwrap();
    let webhook = ordered_webhook(&mut conn, "opened only").await;
    webhooks::update(
        &mut conn,
        webhook.id,
        &WebhookChanges {
            events: Some([EventKind::IncidentOpened].into_iter().collect()),
            enabled: Some(false),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    open(&mut conn, "k").await;
    let later = resolve(&mut conn, "k").await;
    let claiming = fan_out::FanOutRules {
        claim: true,
        ..PENDING
    };
    let fanned = fan_out::fan_out(
        &mut conn,
        &[fan_out_request(&later[0], false)],
        &[],
        claiming,
    )
    .await
    .unwrap();
    assert!(
        fanned[0].claimed.is_empty(),
        "nothing claimed for a disabled webhook"
    );
    let mine = deliveries_of(&mut conn, webhook.id).await;
    assert_eq!(mine.len(), 1);
    assert_eq!(
        (mine[0].event, mine[0].state, mine[0].wait_reason),
        (
            EventKind::IncidentOpened,
            DeliveryState::Waiting,
            Some(WaitReason::WebhookDisabled)
        )
    );
}
