# Shared by deploy/image/build and deploy/image/test: a Docker engine (the one that answers, or
# a temporary one of our own), the base image that deploy/Dockerfile's runtime stage names (made
# from Debian's packages when the engine does not have it), and the image built from that
# stage's own lines. Sourced, not run. See docs/operations/image.md.

# shellcheck shell=bash
# shellcheck source=../local/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../local/lib.sh"

IMAGE_TAG=${TOCSIN_IMAGE_TAG:-tocsin:local}
# The debootstrap tarball of the base image is kept here between runs (one per Debian suite).
IMAGE_CACHE=${TOCSIN_IMAGE_CACHE:-/var/cache/tocsin-image}
# The tarball is made again when it is older than this many days.
BASE_MAX_AGE_DAYS=${TOCSIN_BASE_MAX_AGE_DAYS:-30}
DEBIAN_MIRROR=${TOCSIN_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# Where the three binaries come from: the debug build that `cargo nextest run` leaves.
IMAGE_BINARIES=${TOCSIN_IMAGE_BINARIES:-${CARGO_TARGET_DIR:-$TOCSIN_ROOT/target}/debug}
DOCKERFILE="$TOCSIN_ROOT/deploy/Dockerfile"
BINARIES=(tocsin-ingest tocsin-dispatcher tocsin-admin)

DOCKER=(docker)
ENGINE_DIR=""  # set when this script started the engine: its state, socket and log
ENGINE_PID=""
ENGINE_STARTED=0
DEBOOTSTRAPPED=0

# What dockerd, containerd and runc create outside their --data-root and --exec-root whatever
# their flags (dockerd's identity key, empty runtime and plugin folders), and the folder that
# mount and umount make for their lock (debootstrap's mounts, the engine's leftovers). Those
# that were absent when the script started are removed at its end (folders only when empty),
# so the machine is left as found.
SIDE_PATHS=(/etc/docker/key.json /run/docker/plugins /run/docker /run/containerd/s
  /run/containerd /opt/containerd/bin /opt/containerd/lib /opt/containerd /run/runc /run/mount)
ABSENT_SIDE_PATHS=()
for _path in "${SIDE_PATHS[@]}"; do
  [ -e "$_path" ] || ABSENT_SIDE_PATHS+=("$_path")
done
unset _path

# restore_side_paths: removes what this script's engine or debootstrap left outside their
# folders (see SIDE_PATHS), when it started an engine or ran debootstrap.
restore_side_paths() {
  local path
  ((ENGINE_STARTED || DEBOOTSTRAPPED)) || return 0
  for path in "${ABSENT_SIDE_PATHS[@]}"; do
    if [ -f "$path" ]; then
      rm -f "$path"
    elif [ -d "$path" ]; then
      rmdir "$path" 2>/dev/null || echo "note: $path is not empty: left in place" >&2
    fi
  done
}

dk() { "${DOCKER[@]}" "$@"; }

# --- timing -----------------------------------------------------------------------------------

STEP_NAMES=()
STEP_TIMES=()
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# timed NAME COMMAND...: runs COMMAND in this shell, says how long it took and keeps the time
# for times_table.
CURRENT_STEP=""
CURRENT_START=""
timed() {
  local name=$1
  shift
  say "$name"
  CURRENT_STEP=$name
  CURRENT_START=$(now)
  "$@"
  STEP_NAMES+=("$name")
  STEP_TIMES+=("$(elapsed "$CURRENT_START")")
  CURRENT_STEP=""
  printf '    done in %s s\n' "${STEP_TIMES[-1]}" >&2
}

# end_failed_step: records the step under way, if one is, as failed.
end_failed_step() {
  [ -n "$CURRENT_STEP" ] || return 0
  STEP_NAMES+=("FAILED: $CURRENT_STEP")
  STEP_TIMES+=("$(elapsed "$CURRENT_START")")
  CURRENT_STEP=""
}

# times_table: the time of each step that ended, and of the one that failed, if one did.
times_table() {
  local i total=0
  end_failed_step
  printf '\n%-60s %8s\n' "step" "seconds" >&2
  for i in "${!STEP_NAMES[@]}"; do
    printf '%-60s %8s\n' "${STEP_NAMES[$i]}" "${STEP_TIMES[$i]}" >&2
    total=$(awk -v a="$total" -v b="${STEP_TIMES[$i]}" 'BEGIN { printf "%.1f", a + b }')
  done
  printf '%-60s %8s\n' "total" "$total" >&2
}

# --- the engine -------------------------------------------------------------------------------

engine_answers() { timeout 20 "${DOCKER[@]}" version >/dev/null 2>&1; }

# ensure_engine: uses the Docker engine that answers the docker client as it is set up here
# (DOCKER_HOST, or /var/run/docker.sock); when none does, starts one of its own, its whole state
# in a temporary folder, and stop_engine stops it. That engine touches no firewall rule and
# makes no network device (--iptables=false, --ip6tables=false, --bridge=none): containers run
# with --network host. Its storage driver is overlay2 where the kernel has overlayfs (a
# container then costs no copy of the image), vfs otherwise or when overlay2 fails to start
# (vfs copies the whole image for each container and layer, but needs nothing of the kernel);
# TOCSIN_ENGINE_STORAGE_DRIVER chooses one.
ensure_engine() {
  if command -v docker >/dev/null 2>&1 && engine_answers; then
    say "a Docker engine answers (server $(dk version -f '{{.Server.Version}}')): using it; it is left running"
    return
  fi
  if ! command -v dockerd >/dev/null 2>&1; then
    apt_install --no-install-recommends docker.io
  fi
  local dockerd client version driver drivers
  dockerd=$(command -v dockerd)
  # The client of the engine's own version (Debian's: /usr/bin/docker beside /usr/sbin/dockerd),
  # rather than another docker first on PATH: the two speak the same API, and it builds with
  # BuildKit without the buildx plugin.
  version=$("$dockerd" --version | awk '{ sub(",", "", $3); print $3 }')
  for client in "$(dirname "$dockerd")/docker" /usr/bin/docker "$(command -v docker || true)"; do
    [ -x "$client" ] && [ "$("$client" --version | awk '{ sub(",", "", $3); print $3 }')" = "$version" ] && break
    client=""
  done
  [ -n "$client" ] || client=docker
  DOCKER=("$client")
  if [ -n "${TOCSIN_ENGINE_STORAGE_DRIVER:-}" ]; then
    drivers=("$TOCSIN_ENGINE_STORAGE_DRIVER")
  elif grep -qw overlay /proc/filesystems; then
    drivers=(overlay2 vfs)
  else
    drivers=(vfs)
  fi
  for driver in "${drivers[@]}"; do
    if start_dockerd "$dockerd" "$driver"; then
      say "started dockerd $(dk version -f '{{.Server.Version}}') (pid $ENGINE_PID, storage driver $driver, state in $ENGINE_DIR; client $client)"
      return
    fi
  done
  die "dockerd did not start with the storage driver(s) ${drivers[*]}"
}

# start_dockerd DOCKERD DRIVER: starts the engine; fails when it exits during its start (its log
# is shown and its folder removed), dies when it does not answer within 60 s.
start_dockerd() {
  local dockerd=$1 driver=$2 deadline
  # Under /tmp, not $TMPDIR: containerd's socket paths under it must stay short.
  ENGINE_DIR=$(mktemp -d /tmp/tocsin-engine.XXXXXX)
  echo '{}' >"$ENGINE_DIR/daemon.json"
  "$dockerd" --config-file "$ENGINE_DIR/daemon.json" \
    --iptables=false --ip6tables=false --bridge=none --storage-driver="$driver" \
    --data-root "$ENGINE_DIR/data" --exec-root "$ENGINE_DIR/exec" \
    --pidfile "$ENGINE_DIR/dockerd.pid" --host "unix://$ENGINE_DIR/docker.sock" \
    >"$ENGINE_DIR/dockerd.log" 2>&1 &
  ENGINE_PID=$!
  ENGINE_STARTED=1
  export DOCKER_HOST="unix://$ENGINE_DIR/docker.sock"
  deadline=$((SECONDS + 60))
  until engine_answers; do
    if ! kill -0 "$ENGINE_PID" 2>/dev/null; then
      echo "dockerd --storage-driver=$driver exited during start:" >&2
      tail -n 5 "$ENGINE_DIR/dockerd.log" >&2
      wait "$ENGINE_PID" 2>/dev/null || true
      remove_engine_dir "$ENGINE_DIR"
      ENGINE_PID=""
      ENGINE_DIR=""
      return 1
    fi
    if ((SECONDS >= deadline)); then
      tail -n 30 "$ENGINE_DIR/dockerd.log" >&2
      die "dockerd did not answer within 60 s"
    fi
    sleep 0.2
  done
}

# stop_engine: stops the engine that ensure_engine started (none otherwise) and removes its
# state. Waits for dockerd and the containerd it started to exit (30 s, then SIGKILL).
stop_engine() {
  [ -n "$ENGINE_PID" ] || return 0
  local children pid deadline
  children=$(pgrep -P "$ENGINE_PID" || true)
  kill -TERM "$ENGINE_PID" 2>/dev/null || true
  deadline=$((SECONDS + 30))
  while kill -0 "$ENGINE_PID" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
  if kill -0 "$ENGINE_PID" 2>/dev/null; then
    echo "dockerd did not stop within 30 s: killing it" >&2
    kill -KILL "$ENGINE_PID" 2>/dev/null || true
  fi
  wait "$ENGINE_PID" 2>/dev/null || true
  for pid in $children; do
    deadline=$((SECONDS + 10))
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  remove_engine_dir "$ENGINE_DIR"
  say "stopped dockerd (pid $ENGINE_PID) and removed $ENGINE_DIR"
  ENGINE_PID=""
  ENGINE_DIR=""
}

# unmount_under DIR: unmounts everything mounted under DIR, deepest first.
unmount_under() {
  awk -v dir="$1/" 'index($2, dir) == 1 { print $2 }' /proc/self/mounts | sort -r |
    while read -r mount; do umount -l "$mount" 2>/dev/null || true; done
}

# remove_engine_dir DIR: unmounts what a stopped engine left mounted under DIR (its network
# namespace file) and removes DIR, never crossing into another file system.
remove_engine_dir() {
  unmount_under "$1"
  rm -rf --one-file-system "$1"
}

# --- the base image ---------------------------------------------------------------------------

# runtime_base: the image that deploy/Dockerfile's runtime stage starts FROM.
runtime_base() {
  local base
  base=$(awk 'toupper($1) == "FROM" && tolower($3) == "as" && $4 == "runtime" { print $2 }' "$DOCKERFILE")
  [ -n "$base" ] || die "deploy/Dockerfile has no stage named runtime"
  echo "$base"
}

# ensure_base_image: makes the runtime stage's base image (debian:SUITE-slim) from Debian's
# packages when the engine does not have it: debootstrap --variant=minbase SUITE, with the apt
# sources of Debian's own image, imported under the very name deploy/Dockerfile uses. The
# tarball is cached in $IMAGE_CACHE.
ensure_base_image() {
  local base suite tarball
  base=$(runtime_base)
  if dk image inspect "$base" >/dev/null 2>&1; then
    say "$base is present in the engine"
    return
  fi
  if [ -z "$ENGINE_PID" ] && timeout 120 "${DOCKER[@]}" pull "$base" >/dev/null 2>&1; then
    say "$base pulled from the engine's registry"
    return
  fi
  [[ $base =~ ^debian:([a-z]+)(-slim)?$ ]] || die "cannot make $base from Debian's packages"
  suite=${BASH_REMATCH[1]}
  tarball="$IMAGE_CACHE/debian-$suite-minbase.tar"
  mkdir -p "$IMAGE_CACHE"
  DEBOOTSTRAPPED=1  # may run below, in a subshell
  (
    # One run at a time makes the tarball; a second waits and then uses it.
    flock -w 900 9 || die "another run holds $IMAGE_CACHE/.lock"
    if [ -s "$tarball" ] && [ -z "$(find "$tarball" -mtime "+$BASE_MAX_AGE_DAYS")" ] \
      && [ -z "${TOCSIN_IMAGE_REFRESH_BASE:-}" ]; then
      say "cached base file system: $tarball (made $(date -r "$tarball" -u '+%Y-%m-%d %H:%M UTC'))"
    else
      make_base_tarball "$suite" "$tarball"
    fi
  ) 9>"$IMAGE_CACHE/.lock"
  dk import \
    --change 'CMD ["bash"]' \
    --change "LABEL org.tocsin.base=\"debootstrap --variant=minbase $suite, made by deploy/image\"" \
    "$tarball" "$base" >/dev/null
  say "imported $tarball as $base ($(dk image inspect -f '{{.Size}}' "$base" | awk '{ printf "%.0f MB", $1 / 1e6 }'))"
}

make_base_tarball() {
  local suite=$1 tarball=$2 work root
  command -v debootstrap >/dev/null 2>&1 || apt_install --no-install-recommends debootstrap
  work=$(mktemp -d "$IMAGE_CACHE/debootstrap.XXXXXX")
  root="$work/root"
  say "debootstrap --variant=minbase $suite from $DEBIAN_MIRROR"
  if ! debootstrap --variant=minbase "$suite" "$root" "$DEBIAN_MIRROR" >"$work/log" 2>&1; then
    tail -n 30 "$work/log" >&2
    # A failed debootstrap can leave /proc, /sys or the host's /dev mounted in the new root.
    unmount_under "$work"
    rm -rf --one-file-system "$work"
    die "debootstrap failed"
  fi
  unmount_under "$work"
  # The apt sources of Debian's own debian:SUITE-slim: the suite, its updates and security.
  rm -f "$root/etc/apt/sources.list"
  cat >"$root/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $DEBIAN_MIRROR
Suites: $suite $suite-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: $suite-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin "$root"/var/lib/apt/lists/*
  find "$root/var/log" -type f -delete
  tar --numeric-owner --one-file-system -C "$root" -cf "$work/base.tar" .
  mv "$work/base.tar" "$tarball"
  rm -rf --one-file-system "$work"
  say "made $tarball ($(du -m "$tarball" | cut -f1) MB)"
}

# --- the image --------------------------------------------------------------------------------

# runtime_stage: deploy/Dockerfile's runtime stage, verbatim: from its FROM line to the end of
# the file. Fails when the stage no longer takes the binaries from the builder's /out/, which is
# what build_image supplies.
runtime_stage() {
  local stage
  stage=$(awk 'toupper($1) == "FROM" && tolower($3) == "as" && $4 == "runtime" { on = 1 } on' "$DOCKERFILE")
  [ -n "$stage" ] || die "deploy/Dockerfile has no stage named runtime"
  if [ "$(grep -c '^COPY --from=builder /out/ /usr/local/bin/$' <<<"$stage")" != 1 ]; then
    die "deploy/Dockerfile's runtime stage no longer copies the binaries with 'COPY --from=builder /out/ /usr/local/bin/': update deploy/image/lib.sh"
  fi
  if ! grep -q '^FROM .* AS builder$' "$DOCKERFILE" || ! grep -q 'mkdir -p /out' "$DOCKERFILE"; then
    die "deploy/Dockerfile's builder stage no longer fills /out: update deploy/image/lib.sh"
  fi
  printf '%s\n' "$stage"
}

# ensure_binaries: the three debug binaries. `cargo nextest run` builds them; when one is
# missing, they are built here (debug profile, the workspace's lock file).
ensure_binaries() {
  local b missing=0 newest oldest
  for b in "${BINARIES[@]}"; do [ -x "$IMAGE_BINARIES/$b" ] || missing=1; done
  if ((missing)); then
    [ -z "${TOCSIN_IMAGE_BINARIES:-}" ] || die "TOCSIN_IMAGE_BINARIES=$IMAGE_BINARIES lacks one of ${BINARIES[*]}"
    say "building ${BINARIES[*]} (cargo build, debug)"
    (cd "$TOCSIN_ROOT" && cargo build --locked -p tocsin-ingest -p tocsin-dispatcher -p tocsin-admin --bins)
  fi
  oldest=$(cd "$IMAGE_BINARIES" && ls -tr "${BINARIES[@]}" | head -n 1)
  newest=$(find "$TOCSIN_ROOT/crates" "$TOCSIN_ROOT/Cargo.lock" -newer "$IMAGE_BINARIES/$oldest" \
    -type f \( -name '*.rs' -o -name Cargo.toml -o -name Cargo.lock -o -name '*.sql' -o -name '*.html' \) \
    -not -path '*/tests/*' -not -path '*/target/*' 2>/dev/null | head -n 1)
  if [ -n "$newest" ]; then
    echo "warning: $newest is newer than $IMAGE_BINARIES/$oldest: the image gets the binaries as they were last built" >&2
  fi
}

# build_image: builds $IMAGE_TAG from deploy/Dockerfile's runtime stage, its text unchanged,
# after a two-line stage named builder whose /out/ holds the three binaries built on this
# machine (debug symbols stripped). No BuildKit frontend image is named, so none is fetched from
# a registry. BuildKit builds it where the client has it (Docker 20.10's own client, or buildx),
# the classic builder elsewhere. Prints the Dockerfile it builds.
build_image() {
  local context b stage builder log
  stage=$(runtime_stage)
  context=$(mktemp -d)
  log="$context/build.log"
  mkdir "$context/out"
  for b in "${BINARIES[@]}"; do
    strip --strip-debug -o "$context/out/$b" "$IMAGE_BINARIES/$b"
  done
  {
    echo "# Generated by deploy/image/lib.sh: the binaries built on this machine stand in for the"
    echo "# builder stage; the runtime stage below is deploy/Dockerfile's, line for line."
    echo "FROM scratch AS builder"
    echo "COPY out/ /out/"
    echo
    printf '%s\n' "$stage"
  } >"$context/Dockerfile"
  say "the Dockerfile built (its runtime stage: deploy/Dockerfile from line $(grep -n ' AS runtime$' "$DOCKERFILE" | cut -d: -f1) to the end, sha256 $(printf '%s\n' "$stage" | sha256sum | cut -c1-16))"
  sed 's/^/    | /' "$context/Dockerfile" >&2
  if dk buildx version >/dev/null 2>&1 ||
    [ "$(dk version -f '{{.Client.Version}}' 2>/dev/null | cut -d. -f1)" -lt 23 ] 2>/dev/null; then
    builder=BuildKit
    DOCKER_BUILDKIT=1 "${DOCKER[@]}" build --progress plain --network host -t "$IMAGE_TAG" "$context" >"$log" 2>&1 ||
      { tail -n 40 "$log" >&2; rm -rf "$context"; die "docker build failed"; }
    grep -E '^#[0-9]+ (\[|DONE|naming)' "$log" | sed 's/^/    /' >&2
  else
    builder="the classic builder"
    DOCKER_BUILDKIT=0 "${DOCKER[@]}" build --network host -t "$IMAGE_TAG" "$context" >"$log" 2>&1 ||
      { tail -n 40 "$log" >&2; rm -rf "$context"; die "docker build failed"; }
    grep -E '^(Step [0-9]+/[0-9]+ :|Successfully)' "$log" | sed 's/^/    /' >&2
  fi
  rm -rf "$context"
  say "built $IMAGE_TAG with $builder ($(dk image inspect -f '{{.Size}}' "$IMAGE_TAG" | awk '{ printf "%.0f MB", $1 / 1e6 }'))"
}

# check_compose: docker-compose.yml checked by the Compose tool (Compose v2's `docker compose`
# where it is installed, else Debian's docker-compose, installed when missing): the file is
# valid and the three Tocsin services run the image built from deploy/Dockerfile.
check_compose() {
  local out file="$TOCSIN_ROOT/docker-compose.yml" tmp
  tmp=$(mktemp -d)
  out="$tmp/config.yml"
  if docker compose version >/dev/null 2>&1; then
    say "docker compose config ($(docker compose version --short 2>/dev/null))"
    TOCSIN_ADMIN_TOKEN=validate docker compose -f "$file" config >"$out" ||
      { rm -rf "$tmp"; die "docker compose config failed"; }
  else
    command -v docker-compose >/dev/null 2>&1 || apt_install --no-install-recommends docker-compose
    # Compose v1 (Debian's docker-compose 1.29) predates the top-level `name` key: it checks a
    # copy of the file without that one line, with the same name given as -p.
    [ "$(grep -c '^name: tocsin$' "$file")" = 1 ] || { rm -rf "$tmp"; die "docker-compose.yml does not name its project tocsin"; }
    sed '/^name: tocsin$/d' "$file" >"$tmp/docker-compose.yml"
    say "docker-compose config ($(docker-compose version --short 2>/dev/null); the file less its 'name: tocsin' line, with -p tocsin)"
    TOCSIN_ADMIN_TOKEN=validate docker-compose --project-directory "$TOCSIN_ROOT" -p tocsin \
      -f "$tmp/docker-compose.yml" config >"$out" || { rm -rf "$tmp"; die "docker-compose config failed"; }
  fi
  IMAGE_TAG=$IMAGE_TAG TOCSIN_ROOT=$TOCSIN_ROOT python3 - "$out" <<'PY' || { rm -rf "$tmp"; die "docker-compose.yml does not run the image deploy/Dockerfile builds"; }
import os, sys, yaml
config = yaml.safe_load(open(sys.argv[1]))
services = config["services"]
tag, root = os.environ["IMAGE_TAG"], os.path.realpath(os.environ["TOCSIN_ROOT"])
errors = []
for name in ("ingest", "dispatcher", "admin"):
    service = services.get(name) or {}
    if service.get("image") != tag:
        errors.append(f"{name} runs {service.get('image')!r}, not {tag}")
    if service.get("command") != [f"tocsin-{name}"]:
        errors.append(f"{name} runs {service.get('command')!r}, not tocsin-{name}")
build = services["ingest"].get("build") or {}
if os.path.realpath(build.get("context", "")) != root or build.get("dockerfile") != "deploy/Dockerfile":
    errors.append(f"ingest builds {build!r}, not deploy/Dockerfile in {root}")
for name, service in services.items():
    if name != "ingest" and "build" in service:
        errors.append(f"{name} builds an image of its own")
for e in errors:
    print("ERROR docker-compose.yml:", e, file=sys.stderr)
if errors:
    sys.exit(1)
print(f"    compose: {len(services)} services valid; ingest builds deploy/Dockerfile as {tag}, "
      f"dispatcher and admin run {tag}", file=sys.stderr)
PY
  rm -rf "$tmp"
}
