"""Tocsin's own checks of its deployment files: what no schema or linter can see, because it is
about how the files fit each other and the source code.

    python3 deploy/ci/cross_checks.py RENDERED.yaml...

RENDERED.yaml are the rendered Kustomize targets (`kubectl kustomize` output, one file each,
named after the target); deploy/ci/validate-manifests.sh renders them and runs this last, after
the schema validators and promtool. Run from the repository's root. Prints one ERROR line per
problem on stderr and exits 1 when there is any, 0 otherwise.

Rendered Kubernetes objects, per target:
  check_rendered            the file parses and holds objects, each with apiVersion, kind and
                            a name; a KEDA object's name is a DNS-1123 subdomain
  check_empty_settings      no ConfigMap value or container env value is the empty string
  check_autoscalers         each ScaledObject and HPA scales a rendered Deployment, and no
                            Deployment is scaled by both; minReplicaCount <= maxReplicaCount; a
                            trigger's authenticationRef is rendered; a rabbitmq trigger watches
                            a work queue of TOCSIN_AMQP_PREFIX, with mode QueueLength or
                            MessageRate (the latter over http), a positive value and a host or
                            an authenticationRef; TriggerAuthentication secret keys exist; an
                            autoscaled Deployment sets no spec.replicas
  check_pod_security        pods run as non-root uid 10001; containers have a read-only root
                            filesystem, no privilege escalation and drop ALL capabilities
  check_env_references      envFrom ConfigMaps are rendered, no secretRef in envFrom, every
                            secretKeyRef and configMapKeyRef names an existing key (a Secret
                            may be one created out of band: tocsin-secrets)
  check_probes_and_addresses  each Deployment container runs a Tocsin service, has startup,
                            liveness and readiness probes over HTTP on named ports (liveness
                            /healthz, readiness /readyz), and listens on 0.0.0.0 on a declared
                            container port
  check_grace_periods       terminationGracePeriodSeconds covers the drain bound that
                            TOCSIN_SHUTDOWN_TIMEOUT (and the preStop pause) sets
  check_selectors           each Service selects exactly one Deployment and targets one of its
                            ports; each PodDisruptionBudget selects a Deployment; each
                            Deployment's selector matches its pod template

Metrics, alerts and dashboard:
  registered_metrics        the metrics the services register in crates/*/src
  check_metrics_documented  docs/operations/observe.md documents each of them
  check_alert_rules         deploy/prometheus/alerts.yml has rule groups; alert names are unique;
                            each alert has labels.severity critical, warning or info, an
                            annotations.summary, and a runbook (a file of the repository and an
                            anchor that is one of its headings); every metric used is registered (or Prometheus's `up`)
  check_dashboard           deploy/grafana/tocsin-dashboard.json parses, panel ids are unique, no
                            query keeps a template variable, every metric used is registered

Other files:
  check_rabbitmq_definitions  deploy/rabbitmq/definitions.json: permissions name known users and
                            vhosts, the tocsin user may use every Tocsin queue and exchange and
                            the default exchange, policies are on known vhosts, without x-
                            keys, and match a Tocsin queue; no queue is pre-declared
  check_compose             docker-compose.yml: postgres, rabbitmq and the three services; only
                            ingest builds deploy/Dockerfile, the others run its image
                            tocsin:local; each runs its binary, listens on its port, has
                            DATABASE_URL and AMQP_URL, depends on known services; ports bound to
                            loopback; the Dockerfile installs the three binaries, each built by
                            a crate

What the tools check (Kubernetes and KEDA schemas, PromQL syntax, rule file structure, the
Compose schema) is not repeated here.
"""

import json
import pathlib
import re
import sys
import traceback

import promql_parser
import yaml

from tool_inputs import DASHBOARD, all_panels, dashboard_queries

ALERTS = pathlib.Path("deploy/prometheus/alerts.yml")
OPERATIONS = pathlib.Path("docs/operations/observe.md")
RABBITMQ_DEFINITIONS = pathlib.Path("deploy/rabbitmq/definitions.json")
COMPOSE = pathlib.Path("docker-compose.yml")
DOCKERFILE = pathlib.Path("deploy/Dockerfile")

SECRETS_FROM_OUTSIDE = {"tocsin-secrets"}  # created out of band; the base carries none
SERVICE_ADDRESS_VARIABLES = {
    "tocsin-ingest": "TOCSIN_INGEST_ADDR",
    "tocsin-dispatcher": "TOCSIN_DISPATCHER_ADDR",
    "tocsin-admin": "TOCSIN_ADMIN_ADDR",
}
TOCSIN_QUEUES = ["tocsin.events.fanout", "tocsin.deliveries", "tocsin.parking",
                 "tocsin.retry.1m", "tocsin.retry.5m", "tocsin.retry.30m", "tocsin.retry.2h"]
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

errors = []


def error(where, message):
    errors.append(f"{where}: {message}")


# ------------------------------------------------------------------------------ helpers

def where_of(target, doc):
    meta = doc.get("metadata") or {}
    return f"{target}: {doc.get('kind', '?')}/{meta.get('name', '?')}"


def index(docs):
    """{kind: {name: object}}"""
    by_kind = {}
    for doc in docs:
        by_kind.setdefault(doc.get("kind"), {})[doc["metadata"]["name"]] = doc
    return by_kind


def pod_spec(doc):
    return doc.get("spec", {}).get("template", {}).get("spec", {})


def workload_containers(target, objects, kinds=("Deployment", "Job")):
    """(object, container, where) for each container of the given workload kinds."""
    for kind in kinds:
        for doc in objects.get(kind, {}).values():
            for container in pod_spec(doc).get("containers", []):
                yield doc, container, f"{where_of(target, doc)} container {container.get('name')}"


def effective_env(container, objects):
    """The container's environment as Kubernetes builds it: envFrom in order, then env."""
    env = {}
    for source in container.get("envFrom", []):
        ref = source.get("configMapRef")
        if ref and ref.get("name") in objects.get("ConfigMap", {}):
            env.update(objects["ConfigMap"][ref["name"]].get("data", {}))
    for var in container.get("env", []):
        env[var["name"]] = var.get("value")  # None: from a Secret or a field, not known here
    return env


def duration_seconds(text):
    match = re.fullmatch(r"(\d+)(ms|s|m|h|d)", text or "")
    if not match:
        return None
    return int(match.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]


def selects(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


def template_labels(deployment):
    return deployment["spec"]["template"]["metadata"].get("labels", {})


def secret_key_ok(objects, where, name, key):
    secret = objects.get("Secret", {}).get(name)
    if secret is None:
        if name not in SECRETS_FROM_OUTSIDE:
            error(where, f"Secret {name} is neither rendered nor one created out of band")
        return
    if key not in set(secret.get("data", {})) | set(secret.get("stringData", {})):
        error(where, f"Secret {name} has no key {key}")


def load(path, parse, failures):
    """The file at path as parse reads it, or None once error() has said why it could not be read."""
    try:
        return parse(pathlib.Path(path).read_text())
    except failures as problem:
        error(str(path), str(problem))
        return None


def check_metrics_exported(where, expr, allowed):
    """Reports each metric of the PromQL expression that Tocsin does not export."""
    try:
        ast = promql_parser.parse(expr)
    except ValueError as problem:
        # promtool reports the syntax; this says that the metric check could not run.
        error(where, f"PromQL does not parse, its metrics are unchecked: {problem}: {expr}")
        return
    used = []
    promql_parser.walk(ast, lambda node: used.append(node.name)
                       if isinstance(node, promql_parser.VectorSelector) else None)
    for name in used:
        if name not in allowed:
            error(where, f"metric {name!r} is not exported by Tocsin: {expr}")


# ------------------------------------------------------------------------------ rendered objects

def check_rendered(target, path):
    """The target's objects, or None when there are none to check."""
    try:
        docs = [d for d in yaml.safe_load_all(pathlib.Path(path).read_text()) if d]
    except (OSError, yaml.YAMLError) as problem:
        error(target, f"YAML: {problem}")
        return None
    if not docs:
        error(target, "rendered no object")
        return None
    objects = []
    for doc in docs:
        if not isinstance(doc, dict) or "kind" not in doc or "apiVersion" not in doc:
            error(target, f"not a Kubernetes object: {str(doc)[:80]}")
            continue
        name = (doc.get("metadata") or {}).get("name")
        if not isinstance(name, str) or not name:
            error(where_of(target, doc), "has no metadata.name")
            continue
        # The API server requires this of a custom resource's name; no schema here says so.
        if str(doc["apiVersion"]).startswith("keda.sh/") and \
                not (len(name) <= 253 and DNS1123_SUBDOMAIN.match(name)):
            error(where_of(target, doc), "metadata.name must be a DNS-1123 subdomain")
        objects.append(doc)
    return objects


def check_empty_settings(target, objects):
    """An empty variable counts as set, and most settings refuse it."""
    for name, cm in objects.get("ConfigMap", {}).items():
        for key, value in (cm.get("data") or {}).items():
            if value == "":
                error(where_of(target, cm), f"{key} is the empty string; leave it out instead")
    for _, container, where in workload_containers(target, objects):
        for var in container.get("env", []):
            if var.get("value") == "":
                error(where, f"{var['name']} is the empty string; leave it out instead")


def check_autoscalers(target, objects):
    deployments = objects.get("Deployment", {})
    prefix = "tocsin"
    for name, cm in objects.get("ConfigMap", {}).items():
        if name.startswith("tocsin-common"):
            prefix = cm.get("data", {}).get("TOCSIN_AMQP_PREFIX", prefix)

    autoscaled = set()
    scaled_objects = objects.get("ScaledObject", {}).values()
    for so in scaled_objects:
        where = where_of(target, so)
        spec = so["spec"]
        ref = spec["scaleTargetRef"]
        if ref.get("kind", "Deployment") != "Deployment" or ref["name"] not in deployments:
            error(where, f"scaleTargetRef names no rendered Deployment: {ref}")
        autoscaled.add(ref["name"])
        low, high = spec.get("minReplicaCount", 0), spec.get("maxReplicaCount", 100)
        if isinstance(low, int) and isinstance(high, int) and low > high:
            error(where, "minReplicaCount is above maxReplicaCount")
        for trigger in spec["triggers"]:
            auth = (trigger.get("authenticationRef") or {}).get("name")
            if auth and auth not in objects.get("TriggerAuthentication", {}):
                error(where, f"authenticationRef {auth} is not rendered")
            if trigger["type"] != "rabbitmq":
                continue
            meta = trigger["metadata"]
            queue = meta.get("queueName")
            if queue not in (f"{prefix}.deliveries", f"{prefix}.events.fanout"):
                error(where, f"rabbitmq trigger on {queue!r}: not a work queue of prefix {prefix!r}")
            if meta.get("mode") not in ("QueueLength", "MessageRate"):
                error(where, f"rabbitmq trigger mode {meta.get('mode')!r}")
            if meta.get("mode") == "MessageRate" and meta.get("protocol") != "http":
                error(where, "mode MessageRate needs protocol http")
            try:
                positive = float(meta.get("value", "")) > 0
            except ValueError:
                positive = False
            if not positive:
                error(where, f"rabbitmq trigger value {meta.get('value')!r} is not a positive number")
            if not auth and not any(k in meta for k in ("host", "hostFromEnv")):
                error(where, "rabbitmq trigger has no host and no authenticationRef")

    for ta in objects.get("TriggerAuthentication", {}).values():
        for ref in ta["spec"].get("secretTargetRef", []):
            secret_key_ok(objects, where_of(target, ta), ref["name"], ref["key"])

    by_scaled_object = {so["spec"]["scaleTargetRef"]["name"] for so in scaled_objects}
    for hpa in objects.get("HorizontalPodAutoscaler", {}).values():
        ref = hpa["spec"]["scaleTargetRef"]
        if ref["kind"] != "Deployment" or ref["name"] not in deployments:
            error(where_of(target, hpa), f"scaleTargetRef names no rendered Deployment: {ref}")
        autoscaled.add(ref["name"])
        if ref["name"] in by_scaled_object:
            error(where_of(target, hpa), f"{ref['name']} is scaled by both an HPA and a ScaledObject")

    for name, doc in deployments.items():
        if name in autoscaled and "replicas" in doc["spec"]:
            error(where_of(target, doc), "sets spec.replicas although an autoscaler owns the count")


def check_pod_security(target, objects):
    for kind in ("Deployment", "Job"):
        for doc in objects.get(kind, {}).values():
            pod_security = pod_spec(doc).get("securityContext", {})
            if pod_security.get("runAsNonRoot") is not True or pod_security.get("runAsUser") != 10001:
                error(where_of(target, doc), "pod must run as non-root uid 10001 (the image's user)")
    for _, container, where in workload_containers(target, objects):
        security = container.get("securityContext", {})
        if security.get("readOnlyRootFilesystem") is not True:
            error(where, "readOnlyRootFilesystem must be true")
        if security.get("allowPrivilegeEscalation") is not False:
            error(where, "allowPrivilegeEscalation must be false")
        if "ALL" not in security.get("capabilities", {}).get("drop", []):
            error(where, "capabilities must drop ALL")


def check_env_references(target, objects):
    config_maps = objects.get("ConfigMap", {})
    for _, container, where in workload_containers(target, objects):
        for source in container.get("envFrom", []):
            if "configMapRef" in source and source["configMapRef"]["name"] not in config_maps:
                error(where, f"envFrom ConfigMap {source['configMapRef']['name']} is not rendered")
            if "secretRef" in source:
                error(where, "secretRef in envFrom: reference each secret key explicitly")
        for var in container.get("env", []):
            value_from = var.get("valueFrom") or {}
            ref = value_from.get("secretKeyRef")
            if ref:
                secret_key_ok(objects, where, ref["name"], ref["key"])
            ref = value_from.get("configMapKeyRef")
            if ref and ref["key"] not in config_maps.get(ref["name"], {}).get("data", {}):
                error(where, f"ConfigMap {ref['name']} has no key {ref['key']}")


def check_probes_and_addresses(target, objects):
    for _, container, where in workload_containers(target, objects, ("Deployment",)):
        ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            port = container.get(probe, {}).get("httpGet", {}).get("port")
            if port is None:
                error(where, f"has no {probe} over HTTP")
            elif isinstance(port, str) and port not in ports:
                error(where, f"{probe} port {port!r} is not a named container port")
        paths = {probe: container.get(probe, {}).get("httpGet", {}).get("path")
                 for probe in ("livenessProbe", "readinessProbe")}
        if paths != {"livenessProbe": "/healthz", "readinessProbe": "/readyz"}:
            error(where, f"probes must be liveness /healthz and readiness /readyz, not {paths}")
        binary = (container.get("command") or [""])[0]
        addr_var = SERVICE_ADDRESS_VARIABLES.get(binary)
        if addr_var is None:
            error(where, f"command {container.get('command')} runs no Tocsin service")
            continue
        addr = effective_env(container, objects).get(addr_var) or ""
        host, _, port = addr.rpartition(":")
        if host != "0.0.0.0" or not port.isdigit() or int(port) not in ports.values():
            error(where, f"{addr_var}={addr!r} must listen on 0.0.0.0 and a declared container port")


def check_grace_periods(target, objects):
    """The drain bound; see docs/operations/deploy.md "Graceful termination" and the comments in the base's
    Deployments. dispatcher: health server stop (2 s) + consumer drain (timeout) + slack (2 s)
    + margin; ingest and admin: preStop + in-flight requests (timeout) + the outbox relay's last
    pass (timeout + 2 s) + margin."""
    for doc, container, where in workload_containers(target, objects, ("Deployment",)):
        binary = (container.get("command") or [""])[0]
        if binary not in SERVICE_ADDRESS_VARIABLES:
            continue  # check_probes_and_addresses reports it
        setting = effective_env(container, objects).get("TOCSIN_SHUTDOWN_TIMEOUT")
        timeout = duration_seconds(setting or "20s")
        if timeout is None:
            error(where, f"TOCSIN_SHUTDOWN_TIMEOUT={setting!r} is not a duration")
            continue
        pre_stop = 0
        command = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
        if command[:1] == ["sleep"] and len(command) == 2:
            pre_stop = float(command[1])
        grace = pod_spec(doc).get("terminationGracePeriodSeconds", 30)
        need = timeout + 5 if binary == "tocsin-dispatcher" else pre_stop + 2 * timeout + 3
        if grace < need:
            error(where, f"terminationGracePeriodSeconds {grace} < {need:g} needed for "
                         f"TOCSIN_SHUTDOWN_TIMEOUT={timeout:g}s (preStop {pre_stop:g}s)")


def check_selectors(target, objects):
    deployments = objects.get("Deployment", {})
    for svc in objects.get("Service", {}).values():
        where = where_of(target, svc)
        selector = svc["spec"].get("selector", {})
        matched = [d for d in deployments.values() if selects(selector, template_labels(d))]
        if len(matched) != 1:
            error(where, f"selector {selector} matches {len(matched)} Deployments, not 1")
            continue
        containers = pod_spec(matched[0]).get("containers", [])
        names = {p.get("name") for c in containers for p in c.get("ports", [])}
        numbers = {p["containerPort"] for c in containers for p in c.get("ports", [])}
        for port in svc["spec"].get("ports", []):
            target_port = port.get("targetPort", port["port"])
            if target_port not in names and target_port not in numbers:
                error(where, f"targetPort {target_port!r} is no port of Deployment "
                             f"{matched[0]['metadata']['name']}")
    for pdb in objects.get("PodDisruptionBudget", {}).values():
        selector = pdb["spec"].get("selector", {}).get("matchLabels", {})
        if not any(selects(selector, template_labels(d)) for d in deployments.values()):
            error(where_of(target, pdb), f"selector {selector} matches no Deployment")
    for doc in deployments.values():
        if not selects(doc["spec"]["selector"].get("matchLabels", {}), template_labels(doc)):
            error(where_of(target, doc), "selector does not match the pod template's labels")


OBJECT_CHECKS = [check_empty_settings, check_autoscalers, check_pod_security, check_env_references,
                 check_probes_and_addresses, check_grace_periods, check_selectors]


# ------------------------------------------------------------------------------ metrics

def registered_metrics():
    """The names Prometheus may see: each metric registered in crates/*/src (a histogram's
    _bucket, _sum and _count series), and Prometheus's own `up`."""
    registered = {}  # name -> is it a histogram
    for source in sorted(pathlib.Path("crates").glob("*/src/**/*.rs")):
        for match in re.finditer(r"\b(HistogramOpts|Opts|IntCounter|IntGauge|Counter|Gauge)::new\(\s*\"(tocsin_[a-z0-9_]+)\"",
                                 source.read_text()):
            registered[match.group(2)] = match.group(1) == "HistogramOpts"
    if not registered:
        error("crates", "found no metric registered in crates/*/src (the scan is broken)")
    allowed = {"up", *registered}
    for name, histogram in registered.items():
        if histogram:
            allowed.update(f"{name}_{suffix}" for suffix in ("bucket", "sum", "count"))
    return registered, allowed


def check_metrics_documented(registered, documented):
    for name in sorted(registered):
        if f"`{name}`" not in documented:
            error(str(OPERATIONS), f"metric {name} (registered in crates/) is not documented")


def heading_anchors(markdown):
    """The anchors of a page's headings, as GitHub makes them (duplicates are not needed here)."""
    return {re.sub(r"[^a-z0-9 _-]", "", h.lower()).strip().replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", markdown, re.M)}


def check_alert_rules(allowed, documented):
    rules_doc = load(ALERTS, yaml.safe_load, (OSError, yaml.YAMLError))
    if rules_doc is None:
        return
    if not isinstance(rules_doc, dict) or set(rules_doc) != {"groups"} or not rules_doc["groups"]:
        error(ALERTS.name, "must hold exactly one key, groups, with at least one group")
    groups = (rules_doc.get("groups") if isinstance(rules_doc, dict) else None) or []
    seen = set()
    rules = 0
    for group in groups:
        for rule in group.get("rules") or []:
            name = rule.get("alert") or rule.get("record")
            where = f"{ALERTS.name}: {group.get('name')}/{name}"
            rules += 1
            if "alert" in rule:
                if name in seen:
                    error(where, "duplicate alert name")
                seen.add(name)
                if (rule.get("labels") or {}).get("severity") not in ("critical", "warning", "info"):
                    error(where, "labels.severity must be critical, warning or info")
                annotations = rule.get("annotations") or {}
                if not annotations.get("summary"):
                    error(where, "annotations.summary is missing")
                path, _, anchor = annotations.get("runbook", "").partition("#")
                runbook = pathlib.Path(path)
                if not path or not runbook.is_file():
                    error(where, f"runbook {path!r} is no file of the repository")
                elif anchor and anchor not in heading_anchors(runbook.read_text()):
                    error(where, f"runbook anchor #{anchor} is no heading of {runbook}")
            if isinstance(rule.get("expr"), str):
                check_metrics_exported(where, rule["expr"], allowed)
    print(f"{ALERTS}: {rules} rules")


def check_dashboard(allowed):
    dashboard = load(DASHBOARD, json.loads, (OSError, ValueError))
    if dashboard is None:
        return
    ids = {}
    queries = 0
    for panel, expr in dashboard_queries(dashboard):
        where = f"dashboard: panel {panel.get('id')} {panel.get('title')!r}"
        if "$" in expr:
            error(where, f"unresolved template variable in {expr}")
            continue
        queries += 1
        check_metrics_exported(where, expr, allowed)
    for panel in all_panels(dashboard.get("panels", [])):
        if panel.get("id") in ids:
            error(f"dashboard: panel {panel.get('id')} {panel.get('title')!r}", "duplicate panel id")
        ids[panel.get("id")] = panel
    print(f"{DASHBOARD}: {len(ids)} panels, {queries} queries")


# ------------------------------------------------------------------------------ other files

def check_rabbitmq_definitions():
    defs = load(RABBITMQ_DEFINITIONS, json.loads, (OSError, ValueError))
    if defs is None:
        return
    where = RABBITMQ_DEFINITIONS.name
    users = {u["name"] for u in defs.get("users", [])}
    vhosts = {v["name"] for v in defs.get("vhosts", [])}
    for perm in defs.get("permissions", []):
        if perm["user"] not in users or perm["vhost"] not in vhosts:
            error(where, f"permission for unknown user or vhost: {perm}")
    app = next((p for p in defs.get("permissions", []) if p["user"] == "tocsin"), None)
    if app is None:
        error(where, "no permissions for the tocsin user")
    else:
        for resource in TOCSIN_QUEUES + ["tocsin.events", "tocsin.deliveries", "tocsin.parking"]:
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
            if not any(re.search(policy["pattern"], q) for q in TOCSIN_QUEUES):
                error(where, f"{key} {policy['name']} matches no Tocsin queue")
    for queue in defs.get("queues", []):
        error(where, f"declares queue {queue.get('name')}: the services declare their own queues, with "
                     "arguments that a pre-declared queue would contradict (PRECONDITION_FAILED)")
    print(f"{RABBITMQ_DEFINITIONS}: {len(users)} users, {len(defs.get('policies', []))} policies")


def check_compose():
    compose = load(COMPOSE, yaml.safe_load, (OSError, yaml.YAMLError))
    dockerfile = load(DOCKERFILE, str, OSError)
    if compose is None or dockerfile is None:
        return
    where = COMPOSE.name
    services = compose.get("services", {})
    expected = {"ingest": "8080", "dispatcher": "8082", "admin": "8081"}
    for name in ["postgres", "rabbitmq", *expected]:
        if name not in services:
            error(where, f"service {name} is missing")
    built = [n for n, s in services.items() if "build" in s]
    if built != ["ingest"] or services["ingest"]["build"].get("dockerfile") != str(DOCKERFILE):
        error(where, f"exactly one service (ingest) builds {DOCKERFILE}; found {built}")
    for name, port in expected.items():
        service = services.get(name, {})
        if service.get("image") != "tocsin:local":
            error(where, f"{name}: image must be tocsin:local (the image ingest builds)")
        if service.get("command") != [f"tocsin-{name}"]:
            error(where, f"{name}: command must be tocsin-{name}")
        if f"tocsin-{name}" not in dockerfile:
            error(where, f"{DOCKERFILE} does not install tocsin-{name}")
        env = service.get("environment", {})
        if not env.get(f"TOCSIN_{name.upper()}_ADDR", "").endswith(f":{port}"):
            error(where, f"{name}: TOCSIN_{name.upper()}_ADDR must listen on {port}")
        for key in ("DATABASE_URL", "AMQP_URL"):
            if not env.get(key):
                error(where, f"{name}: {key} is not set")
        for dep in service.get("depends_on", {}):
            if dep not in services:
                error(where, f"{name}: depends on unknown service {dep}")
    for name, service in services.items():
        for port in service.get("ports", []):
            if not str(port).startswith("127.0.0.1:"):
                error(where, f"{name}: port {port} is not bound to loopback")
    for binary in set(re.findall(r"tocsin-[a-z]+", dockerfile)) & set(SERVICE_ADDRESS_VARIABLES):
        if not pathlib.Path(f"crates/{binary.removeprefix('tocsin-')}/Cargo.toml").is_file():
            error(str(DOCKERFILE), f"copies {binary}, which no crate builds")
    print(f"{COMPOSE}: {len(services)} services consistent with {DOCKERFILE}")


# ------------------------------------------------------------------------------ main

def run(check, *args):
    """Runs one check; a file too broken for it to read is an error, not a crash."""
    try:
        return check(*args)
    except (KeyError, TypeError, ValueError, AttributeError) as problem:
        frame = traceback.extract_tb(problem.__traceback__)[-1]
        error(check.__name__, f"could not run: {problem!r} (cross_checks.py line {frame.lineno})")
        return None


def main():
    objects_checked = 0
    for path in sys.argv[1:]:
        target = pathlib.Path(path).stem
        docs = run(check_rendered, target, path)
        if not docs:
            continue
        objects = run(index, docs) or {}
        for check in OBJECT_CHECKS:
            run(check, target, objects)
        objects_checked += len(docs)
        print(f"{target}: {len(docs)} objects ({', '.join(sorted({d['kind'] for d in docs}))})")

    documented = OPERATIONS.read_text() if OPERATIONS.exists() else ""
    registered, allowed = run(registered_metrics) or ({}, {"up"})
    run(check_metrics_documented, registered, documented)
    run(check_alert_rules, allowed, documented)
    run(check_dashboard, allowed)
    run(check_rabbitmq_definitions)
    run(check_compose)

    if errors:
        for line in errors:
            print(f"ERROR {line}", file=sys.stderr)
        print(f"cross checks FAILED: {len(errors)} error(s)", file=sys.stderr)
        sys.exit(1)
    print(f"cross checks OK: {objects_checked} Kubernetes objects, metrics, alerts, dashboard, "
          "RabbitMQ definitions and docker-compose.yml")


if __name__ == "__main__":
    main()
