#!/usr/bin/env bash
# Runs Schemathesis (PyPI) against the OpenAPI document a real tocsin-admin serves: generated
# requests for every operation must get no 5xx and no response the document does not describe.
# The admin runs against a scratch database and AMQP prefix, both removed afterwards. The
# document also describes the ingest endpoint, which tocsin-ingest serves on its own address:
# it is left out here (ingest has its own property tests over arbitrary bodies). Schemathesis
# sends many wrong tokens from one address on purpose, so the per-address limit on failed
# attempts is lifted for this run (crates/admin/tests/admin/auth.rs tests the limit itself).
#
# A second run sends the same operations with a `viewer` admin key (issued by the CLI) and the
# check in schemathesis_viewer.py: no write may succeed; every answer must still be one the
# document describes (403 naming the role needed, for what a viewer may not do).
#
#   deploy/ci/schemathesis.sh            # as deploy/local/test runs it
#   ST_MAX_EXAMPLES=200 deploy/ci/schemathesis.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

python3 -c 'import schemathesis' 2>/dev/null \
  || python3 -m pip install -q 'schemathesis>=4,<5' 2>/dev/null \
  || python3 -m pip install -q --break-system-packages 'schemathesis>=4,<5'

cargo build --locked -q -p tocsin-admin
suffix=$(head -c 6 /dev/urandom | od -An -tx1 | tr -d ' \n')
database="tocsin_schemathesis_$suffix"
prefix="schemathesis-$suffix"
token="schemathesis-admin-token-$suffix"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
psql -h 127.0.0.1 -U postgres -d postgres -qc "create database $database"

cleanup() {
  [ -n "${admin_pid:-}" ] && kill -TERM "$admin_pid" 2>/dev/null && wait "$admin_pid" 2>/dev/null
  psql -h 127.0.0.1 -U postgres -d postgres -qc "drop database if exists $database with (force)" || true
  for queue in events.fanout deliveries parking retry.1m retry.5m retry.30m retry.2h; do
    rabbitmqctl -q delete_queue "$prefix.$queue" >/dev/null 2>&1 || true
  done
  for exchange in events deliveries parking; do
    rabbitmqadmin_url="http://guest:guest@127.0.0.1:15672/api/exchanges/%2F/$prefix.$exchange"
    curl -s -X DELETE "$rabbitmqadmin_url" >/dev/null || true
  done
}
trap cleanup EXIT

DATABASE_URL="postgres://postgres@127.0.0.1:5432/$database" \
TOCSIN_AMQP_PREFIX="$prefix" \
TOCSIN_ADMIN_TOKEN="$token" \
TOCSIN_ADMIN_ADDR="127.0.0.1:$port" \
TOCSIN_ADMIN_AUTH_FAILURES=65535 \
RUST_LOG=warn \
  "${CARGO_TARGET_DIR:-target}/debug/tocsin-admin" &
admin_pid=$!
for _ in $(seq 1 60); do
  curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && break
  sleep 1
done
curl -sf "http://127.0.0.1:$port/readyz" >/dev/null || { echo "tocsin-admin did not become ready"; exit 1; }

st --config-file deploy/ci/schemathesis.toml run "http://127.0.0.1:$port/api/v1/openapi.json" \
  --header "Authorization: Bearer $token" \
  --checks all \
  --exclude-path /api/v1/webhooks/alerts \
  --max-examples "${ST_MAX_EXAMPLES:-30}" \
  --workers 2 \
  --max-time "${ST_MAX_TIME:-180}" \
  --suppress-health-check all

viewer=$(DATABASE_URL="postgres://postgres@127.0.0.1:5432/$database" \
  "${CARGO_TARGET_DIR:-target}/debug/tocsin-admin" key create --name schemathesis-viewer --role viewer)
SCHEMATHESIS_HOOKS=deploy/ci/schemathesis_viewer.py \
st --config-file deploy/ci/schemathesis.toml run "http://127.0.0.1:$port/api/v1/openapi.json" \
  --header "Authorization: Bearer $viewer" \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance,no_write_succeeds \
  --exclude-path /api/v1/webhooks/alerts \
  --max-examples "${ST_MAX_EXAMPLES:-30}" \
  --workers 2 \
  --max-time "${ST_MAX_TIME:-180}" \
  --suppress-health-check all
