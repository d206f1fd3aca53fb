-- Claims attempts before their requests are sent: each input row ($1 delivery ids, $2
-- triggers, $3 for an automatic attempt the automatic attempts the caller saw made) that its
-- guard admits adds an attempt row with no outcome yet, numbered by the delivery's new attempt
-- count, in the same statement. Ids are distinct (the caller splits repeats into rounds).
--
-- An automatic attempt is admitted only while the delivery is unfinished, no other automatic
-- attempt of it is under way (`attempting_until` unset), its automatic attempts are those the
-- caller saw (a redelivered or duplicate message finds them moved on), the schedule has
-- attempts left (the webhook's max_attempts, at most $5), the attempt is due (no earlier than
-- $6 ms ahead of `next_attempt_at`), and the webhook is enabled and not deleted. It takes a
-- lease: `attempting_until` is now plus the webhook's timeout plus $4 ms (if its outcome is
-- not recorded by then, the sweeper records it as interrupted), and no next attempt is due
-- while it holds (`next_attempt_at` is NULL until the outcome sets it).
--
-- A rate-limited webhook's automatic attempts also spend its budget (`webhook_rate_budgets`,
-- locked in webhook order): the k-th in this statement gets the slot at the budget's next
-- free time (now, if that has passed) plus (k - 1) / rate, and is admitted while its slot is
-- at most 1 - 1/rate seconds ahead (a bucket of `rate` attempts: up to `rate` start at once
-- after an idle spell, then one every 1/rate seconds); the budget moves past the last slot
-- admitted. One not admitted waits, `rate_limited`, until its slot is admissible
-- (`next_attempt_at`); the waiting pass takes it then.
--
-- An automatic attempt of a webhook that receives each incident's events in order
-- (`ordering = 'incident'`) is admitted only once every earlier delivery of its incident to the
-- webhook (by the events' `seq`) has finished; until then the delivery waits (`ordering`), and
-- the dispatcher that records the outcome finishing the one before it (`next_in_order.sql`),
-- or the waiting pass, takes it.
--
-- A manual attempt is admitted for an enabled, undeleted webhook's delivery unless it has
-- succeeded, and only while a manual attempt is asked for (`manual_requested`, set by the
-- request and cleared by this claim: one request, one attempt, however often its message is
-- delivered); it moves neither the automatic attempt count nor the schedule, nor the budget.
--
-- Each admitted claim answers with everything making its attempt needs (the delivery, its
-- webhook's row as JSON, the event's body), so that claiming and loading are one step.
--
-- The guards read the delivery rows as locked (their latest versions), never an older
-- snapshot of them.
--
-- $7 and $8 are the least and the greatest of the ids: every read of a delivery by id is bounded
-- by them, so that PostgreSQL reads only the day partitions between them (`partitions.rs`); an
-- `= ANY` of an array, or a join on one, prunes none, and probes every day's index.
WITH input AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::int4[]) AS v(id, trigger, auto_attempts)
), locked AS (
    SELECT d.id, d.webhook_id, d.state, d.attempting_until, d.auto_attempts, d.next_attempt_at,
        d.manual_requested, d.event_id, d.incident_id
    FROM deliveries d JOIN input v ON v.id = d.id
    WHERE d.id BETWEEN $7 AND $8
    ORDER BY d.id FOR UPDATE OF d
), admissible AS (
    SELECT l.id, l.webhook_id, l.event_id, l.incident_id, v.trigger, w.timeout_ms, w.ordering,
        w.rate_limit_per_second AS rate_limit
    FROM locked l JOIN input v ON v.id = l.id JOIN webhooks w ON w.id = l.webhook_id
    WHERE w.deleted_at IS NULL AND w.enabled
        AND CASE v.trigger
            WHEN 'automatic' THEN
                l.state IN ('pending', 'waiting', 'retrying')
                AND l.attempting_until IS NULL
                AND l.auto_attempts = v.auto_attempts
                AND l.auto_attempts < least(w.max_attempts, $5)
                AND l.next_attempt_at <= now() + $6 * interval '1 millisecond'
            ELSE l.state <> 'succeeded' AND l.manual_requested
        END
), eligible AS (
    SELECT a.id, a.webhook_id, a.trigger, a.timeout_ms, a.behind,
        CASE WHEN a.trigger = 'automatic' AND NOT a.behind THEN a.rate_limit END AS rate
    FROM (SELECT a.*, a.trigger = 'automatic' AND a.ordering = 'incident' AND EXISTS (
            SELECT 1 FROM deliveries p JOIN events pe ON pe.id = p.event_id,
                events me
            WHERE me.id = a.event_id AND p.webhook_id = a.webhook_id
                AND p.incident_id = a.incident_id AND p.id <> a.id
                AND p.state IN ('pending', 'waiting', 'retrying')
                AND (coalesce(pe.seq, 0), pe.id) < (coalesce(me.seq, 0), me.id)) AS behind
        FROM admissible a) a
), budget AS (
    SELECT b.webhook_id, greatest(b.next_free_at, now()) AS free_at
    FROM webhook_rate_budgets b
    WHERE b.webhook_id IN (SELECT e.webhook_id FROM eligible e WHERE e.rate IS NOT NULL)
    ORDER BY b.webhook_id FOR UPDATE
), slotted AS (
    SELECT e.*, b.free_at + (row_number() OVER (
            PARTITION BY e.webhook_id, e.rate IS NOT NULL ORDER BY e.id) - 1)
            * interval '1 second' / e.rate AS slot
    FROM eligible e LEFT JOIN budget b ON b.webhook_id = e.webhook_id AND e.rate IS NOT NULL
), judged AS (
    SELECT s.*, coalesce(s.slot <= now() + s.burst, true) AND NOT s.behind AS admitted
    FROM (SELECT s.*, interval '1 second' - interval '1 second' / s.rate AS burst
          FROM slotted s) s
), spent AS (
    UPDATE webhook_rate_budgets b SET
        next_free_at = x.last_slot + interval '1 second' / x.rate
    FROM (SELECT j.webhook_id, max(j.slot) AS last_slot, min(j.rate) AS rate
          FROM judged j WHERE j.admitted AND j.slot IS NOT NULL GROUP BY j.webhook_id) x
    WHERE b.webhook_id = x.webhook_id
), limited AS (
    UPDATE deliveries AS d SET
        state = 'waiting',
        wait_reason = CASE WHEN j.behind THEN 'ordering' ELSE 'rate_limited' END,
        next_attempt_at = CASE WHEN j.behind THEN d.next_attempt_at ELSE j.slot - j.burst END,
        updated_at = now()
    FROM judged j
    WHERE d.id = j.id AND NOT j.admitted AND d.id BETWEEN $7 AND $8
), claimed AS (
    UPDATE deliveries AS d SET
        attempt_count = d.attempt_count + 1,
        auto_attempts = d.auto_attempts + CASE WHEN j.trigger = 'automatic' THEN 1 ELSE 0 END,
        state = CASE
            WHEN j.trigger = 'automatic' AND d.state = 'waiting' AND d.auto_attempts = 0 THEN 'pending'
            WHEN j.trigger = 'automatic' AND d.state = 'waiting' THEN 'retrying'
            ELSE d.state END,
        wait_reason = CASE WHEN j.trigger = 'automatic' THEN NULL ELSE d.wait_reason END,
        attempting_until = CASE WHEN j.trigger = 'automatic'
            THEN now() + (j.timeout_ms + $4) * interval '1 millisecond'
            ELSE d.attempting_until END,
        next_attempt_at = CASE WHEN j.trigger = 'automatic' THEN NULL
            ELSE d.next_attempt_at END,
        manual_requested = d.manual_requested AND j.trigger <> 'manual',
        updated_at = now()
    FROM judged j
    WHERE d.id = j.id AND j.admitted AND d.id BETWEEN $7 AND $8
    RETURNING d.*
), logged AS (
    INSERT INTO attempts (delivery_id, number, trigger, started_at, request_headers)
    SELECT c.id, c.attempt_count, v.trigger, now(), '{}'::jsonb
    FROM claimed c JOIN input v ON v.id = c.id
)
SELECT c.*, row_to_json(w)::text AS webhook, e.body, e.occurred_at, e.test_webhook_id
FROM claimed c JOIN webhooks w ON w.id = c.webhook_id JOIN events e ON e.id = c.event_id
