//! Diesel's view of the tables created by `migrations/`.

diesel::table! {
    incidents (id) {
        id -> Uuid,
        dedup_key -> Text,
        title -> Text,
        severity -> Text,
        status -> Text,
        source -> Nullable<Text>,
        description -> Nullable<Text>,
        created_at -> Timestamptz,
        updated_at -> Timestamptz,
        resolved_at -> Nullable<Timestamptz>,
        labels -> Jsonb,
    }
}

diesel::table! {
    events (id) {
        id -> Uuid,
        kind -> Text,
        incident_id -> Uuid,
        occurred_at -> Timestamptz,
        body -> Text,
        test_webhook_id -> Nullable<Uuid>,
        seq -> Nullable<Int8>,
    }
}

diesel::table! {
    outbox (id) {
        id -> Int8,
        topic -> Text,
        headers -> Jsonb,
        payload -> Bytea,
        created_at -> Timestamptz,
        published_at -> Nullable<Timestamptz>,
        held_until -> Nullable<Timestamptz>,
    }
}

diesel::table! {
    webhooks (id) {
        id -> Uuid,
        name -> Text,
        url -> Text,
        events -> Array<Text>,
        max_attempts -> Int2,
        timeout_ms -> Int4,
        enabled -> Bool,
        secret -> Text,
        previous_secret -> Nullable<Text>,
        previous_secret_expires_at -> Nullable<Timestamptz>,
        created_at -> Timestamptz,
        updated_at -> Timestamptz,
        deleted_at -> Nullable<Timestamptz>,
        filters -> Jsonb,
        headers -> Jsonb,
        rate_limit_per_second -> Nullable<Int4>,
        disabled_reason -> Nullable<Text>,
        disabled_at -> Nullable<Timestamptz>,
        ordering -> Text,
    }
}

diesel::table! {
    webhook_health (webhook_id) {
        webhook_id -> Uuid,
        consecutive_failures -> Int4,
        failing_since -> Nullable<Timestamptz>,
        last_success_at -> Nullable<Timestamptz>,
        last_failure_at -> Nullable<Timestamptz>,
        last_error -> Nullable<Text>,
    }
}

diesel::table! {
    webhook_outcomes (webhook_id, bucket) {
        webhook_id -> Uuid,
        bucket -> Timestamptz,
        successes -> Int4,
        failures -> Int4,
    }
}

diesel::table! {
    webhook_rate_budgets (webhook_id) {
        webhook_id -> Uuid,
        next_free_at -> Timestamptz,
    }
}

diesel::table! {
    deliveries (id) {
        id -> Uuid,
        webhook_id -> Uuid,
        event_id -> Uuid,
        event -> Text,
        incident_id -> Uuid,
        state -> Text,
        attempt_count -> Int4,
        auto_attempts -> Int4,
        next_attempt_at -> Nullable<Timestamptz>,
        created_at -> Timestamptz,
        updated_at -> Timestamptz,
        wait_reason -> Nullable<Text>,
        attempting_until -> Nullable<Timestamptz>,
        manual_requested -> Bool,
        replayed -> Bool,
    }
}

diesel::table! {
    attempts (delivery_id, number) {
        delivery_id -> Uuid,
        number -> Int4,
        trigger -> Text,
        started_at -> Timestamptz,
        success -> Nullable<Bool>,
        status_code -> Nullable<Int4>,
        duration_ms -> Nullable<Int4>,
        error -> Nullable<Text>,
        error_detail -> Nullable<Text>,
        request_headers -> Jsonb,
        response_body -> Nullable<Text>,
        response_truncated -> Bool,
    }
}

diesel::table! {
    inbound_tokens (id) {
        id -> Uuid,
        name -> Text,
        lookup -> Text,
        token_hash -> Bytea,
        created_at -> Timestamptz,
        last_used_at -> Nullable<Timestamptz>,
        revoked_at -> Nullable<Timestamptz>,
        source -> Nullable<Text>,
        basic_auth -> Bool,
        query_token -> Bool,
        signing_secret -> Nullable<Text>,
        sns_signature -> Bool,
    }
}

diesel::joinable!(deliveries -> webhooks (webhook_id));
diesel::joinable!(deliveries -> events (event_id));
diesel::table! {
    replays (id) {
        id -> Uuid,
        webhook_id -> Uuid,
        since -> Timestamptz,
        until -> Nullable<Timestamptz>,
        kinds -> Nullable<Array<Text>>,
        cursor_at -> Timestamptz,
        cursor_id -> Uuid,
        created -> Int8,
        created_at -> Timestamptz,
        finished_at -> Nullable<Timestamptz>,
    }
}

diesel::joinable!(attempts -> deliveries (delivery_id));
diesel::joinable!(webhook_health -> webhooks (webhook_id));

diesel::allow_tables_to_appear_in_same_query!(
    incidents,
    events,
    outbox,
    webhooks,
    deliveries,
    attempts,
    inbound_tokens,
    webhook_health,
    webhook_outcomes,
    webhook_rate_budgets,
    replays,
);

diesel::table! {
    admin_keys (id) {
        id -> Uuid,
        name -> Text,
        role -> Text,
        lookup -> Text,
        key_hash -> Bytea,
        created_at -> Timestamptz,
        expires_at -> Nullable<Timestamptz>,
        last_used_at -> Nullable<Timestamptz>,
        revoked_at -> Nullable<Timestamptz>,
    }
}

diesel::table! {
    audit_log (id) {
        id -> Uuid,
        created_at -> Timestamptz,
        actor_kind -> Text,
        actor_id -> Nullable<Uuid>,
        actor_name -> Text,
        surface -> Text,
        address -> Nullable<Text>,
        user_agent -> Nullable<Text>,
        action -> Text,
        resource_type -> Text,
        resource_id -> Nullable<Text>,
        before -> Nullable<Jsonb>,
        after -> Nullable<Jsonb>,
    }
}
