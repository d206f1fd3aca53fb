-- The health of each webhook in $1: its failure streak and last outcomes, and its success
-- rates over the last hour and day (NULL without outcomes).
-- Each webhook's outcome buckets are read through the key (LATERAL: a join planned on few
-- buckets read the table whole).
WITH ids AS (SELECT unnest($1::uuid[]) AS webhook_id)
SELECT ids.webhook_id, coalesce(h.consecutive_failures, 0) AS consecutive_failures,
    h.last_success_at, h.last_failure_at, h.last_error,
    (r.s1::float8 / nullif(r.n1, 0)) AS success_rate_1h,
    (r.s24::float8 / nullif(r.n24, 0)) AS success_rate_24h
FROM ids LEFT JOIN webhook_health h USING (webhook_id)
    CROSS JOIN LATERAL (
        SELECT sum(o.successes) FILTER (WHERE o.bucket >= now() - interval '1 hour') AS s1,
            sum(o.successes + o.failures)
                FILTER (WHERE o.bucket >= now() - interval '1 hour') AS n1,
            sum(o.successes) AS s24, sum(o.successes + o.failures) AS n24
        FROM webhook_outcomes o
        WHERE o.webhook_id = ids.webhook_id AND o.bucket >= now() - interval '24 hours') r
