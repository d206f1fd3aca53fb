# Shared by deploy/local/up and deploy/local/test: make sure what Tocsin needs is running or
# installed, starting or installing it when it is not. Sourced, not run.

# shellcheck shell=bash
TOCSIN_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PG_HOST=127.0.0.1
PG_PORT=5432
AMQP_PORT=5672
RABBIT_API_PORT=15672

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# port_open PORT: whether something listens on 127.0.0.1:PORT.
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# wait_for WHAT SECONDS COMMAND...: runs COMMAND until it succeeds or SECONDS pass.
wait_for() {
  local what=$1 seconds=$2; shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "$what did not come up within ${seconds}s"
    sleep 1
  done
}

docker_engine() { command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; }

apt_install() {
  say "installing $* (apt-get)"
  if [ -z "${TOCSIN_APT_UPDATED:-}" ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    export TOCSIN_APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

ensure_postgres() {
  if port_open "$PG_PORT"; then return; fi
  if docker_engine; then
    say "starting PostgreSQL (docker compose)"
    docker compose -f "$TOCSIN_ROOT/docker-compose.yml" up -d postgres
  else
    if ! command -v pg_ctlcluster >/dev/null 2>&1; then apt_install postgresql; fi
    local version
    version=$(ls /etc/postgresql | sort -V | tail -1)
    [ -n "$version" ] || die "no PostgreSQL cluster found under /etc/postgresql"
    # Tests and the quick start connect as postgres without a password on loopback.
    local hba="/etc/postgresql/$version/main/pg_hba.conf"
    if ! grep -qE '^host\s+all\s+all\s+127\.0\.0\.1/32\s+trust' "$hba"; then
      sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
    fi
    say "starting PostgreSQL $version"
    pg_ctlcluster --skip-systemctl-redirect "$version" main start
  fi
  wait_for "PostgreSQL" 60 port_open "$PG_PORT"
  wait_for "PostgreSQL" 60 psql -h "$PG_HOST" -U postgres -d postgres -Atc 'select 1'
}

ensure_rabbitmq() {
  if ! port_open "$AMQP_PORT"; then
    if docker_engine; then
      say "starting RabbitMQ (docker compose)"
      docker compose -f "$TOCSIN_ROOT/docker-compose.yml" up -d rabbitmq
    else
      if ! command -v rabbitmq-server >/dev/null 2>&1; then apt_install rabbitmq-server; fi
      say "starting RabbitMQ"
      rabbitmq-server -detached
    fi
    wait_for "RabbitMQ" 120 port_open "$AMQP_PORT"
  fi
  # The management API lets tests read queue arguments as the broker reports them.
  if ! port_open "$RABBIT_API_PORT"; then
    if command -v rabbitmq-plugins >/dev/null 2>&1; then
      say "enabling the RabbitMQ management plugin"
      wait_for "RabbitMQ" 120 rabbitmqctl await_startup
      rabbitmq-plugins enable rabbitmq_management >/dev/null
    fi
    wait_for "the RabbitMQ management API" 120 port_open "$RABBIT_API_PORT"
  fi
}

ensure_database() {
  local name=$1
  if ! psql -h "$PG_HOST" -U postgres -d postgres -Atc "select 1 from pg_database where datname = '$name'" | grep -q 1; then
    say "creating database $name"
    psql -h "$PG_HOST" -U postgres -d postgres -qc "create database $name"
  fi
}

ensure_python_tools() {
  command -v python3 >/dev/null 2>&1 || apt_install python3 python3-pip
  if ! python3 -c 'import standardwebhooks' >/dev/null 2>&1; then
    say "installing standardwebhooks (PyPI), the independent signature verifier used by the tests"
    python3 -m pip install -q standardwebhooks 2>/dev/null \
      || python3 -m pip install -q --break-system-packages standardwebhooks
  fi
  if ! python3 -c 'import moto.server, flask_cors, boto3, requests' >/dev/null 2>&1; then
    say "installing moto[server] (PyPI), the SNS emulator the ingest SNS test drives"
    python3 -m pip install -q 'moto[server]>=5,<6' 2>/dev/null \
      || python3 -m pip install -q --break-system-packages 'moto[server]>=5,<6'
  fi
}

# promtool, which deploy/ci/validate-manifests.sh runs on the alert rules, comes with Debian's
# prometheus package. Installing it starts no Prometheus server: invoke-rc.d is told no for the
# length of the install (where no policy-rc.d says so already) and the service is left disabled.
ensure_promtool() {
  if command -v promtool >/dev/null 2>&1; then return; fi
  local policy=/usr/sbin/policy-rc.d added="" rc=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && added=1
  fi
  apt_install --no-install-recommends prometheus || rc=$?
  if [ -n "$added" ]; then rm -f "$policy"; fi
  if [ "$rc" -eq 0 ]; then
    if command -v systemctl >/dev/null 2>&1; then
      systemctl disable --quiet prometheus.service >/dev/null 2>&1 || true
    elif command -v update-rc.d >/dev/null 2>&1; then
      update-rc.d prometheus disable >/dev/null 2>&1 || true
    fi
  fi
  command -v promtool >/dev/null 2>&1 || die "promtool is not installed (Debian package prometheus)"
}

ensure_nextest() {
  if ! cargo nextest --version >/dev/null 2>&1; then
    say "installing cargo-nextest"
    cargo install --locked cargo-nextest
  fi
}

# The browser tests (crates/e2e/tests/e2e/browser.rs, oidc.rs) drive Debian's Chromium with
# Playwright's library (npm playwright-core; oidc.rs also runs the OpenID provider
# oidc-provider; both pinned by crates/e2e/tests/browser/package-lock.json). No browser is
# downloaded: Playwright launches /usr/bin/chromium.
ensure_browser_tools() {
  if [ ! -x /usr/bin/chromium ]; then apt_install chromium; fi
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    apt_install nodejs npm
  fi
  local dir="$TOCSIN_ROOT/crates/e2e/tests/browser"
  local stamp="$dir/node_modules/.tocsin-package-lock.json"
  if [ ! -d "$dir/node_modules/playwright-core" ] || ! cmp -s "$dir/package-lock.json" "$stamp"; then
    say "installing the browser test's npm packages (npm ci)"
    npm ci --prefix "$dir" --no-audit --no-fund --loglevel=error
    cp "$dir/package-lock.json" "$stamp"
  fi
}
