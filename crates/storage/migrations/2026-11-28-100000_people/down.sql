DROP TABLE audit_log;
DROP TABLE admin_keys;
