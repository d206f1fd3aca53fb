-- The delivery log moves into day partitions by the time in its UUIDv7 ids (see
-- `src/partitions.rs`; the move itself is made by the services, not by this migration). Ids made
-- in SQL are UUIDv7s too, made by these: `uuid_v7(at)`, a UUIDv7 of the time `at`
-- (milliseconds), and `uuid_v7_sharing_time(id)`, a new UUIDv7 with the time `id` holds. A
-- delivery's id is `uuid_v7_sharing_time(event_id)`, so that it lives in its event's day.
CREATE FUNCTION uuid_v7(at timestamptz) RETURNS uuid LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
        PLACING substring(int8send(floor(extract(epoch FROM at) * 1000)::int8) FROM 3)
        FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid
$$;

CREATE FUNCTION uuid_v7_sharing_time(id uuid) RETURNS uuid LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
        PLACING substring(uuid_send(id) FROM 1 FOR 6)
        FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid
$$;
