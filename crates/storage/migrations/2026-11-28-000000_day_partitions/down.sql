DROP FUNCTION uuid_v7_sharing_time(uuid);
DROP FUNCTION uuid_v7(timestamptz);
