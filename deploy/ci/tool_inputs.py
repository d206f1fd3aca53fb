"""Writes the files that deploy/ci/validate-manifests.sh hands to its tools, where a tool cannot
read the project's files as they are.

    python3 deploy/ci/tool_inputs.py OUT RENDERED.yaml...

RENDERED.yaml are the rendered Kustomize targets (`kubectl kustomize` output, one file each,
named after the target). It writes:

OUT/keda/<kind>-<version>/<target>.<name>.json
    Each KEDA object (apiVersion keda.sh/...) of each target, one object per file, because
    check-jsonschema validates one document per file. The folder names the schema that applies:
    deploy/ci/schemas/keda-<KEDA version>-<kind>-<version>.json.

OUT/dashboard-rules.yml
    Every query of deploy/grafana/tocsin-dashboard.json as a Prometheus recording rule, one rule
    group per panel, so that `promtool check rules` parses each expression: promtool has no
    command that parses a bare expression without a server. Grafana's interval variables are
    replaced as Grafana replaces them; a query with any other variable is left out here and
    reported by cross_checks.py.

What it cannot read (broken YAML or JSON) it leaves out: the tools and cross_checks.py report it.
"""

import json
import pathlib
import re
import sys

import yaml

DASHBOARD = pathlib.Path("deploy/grafana/tocsin-dashboard.json")


def all_panels(panels):
    """The dashboard's panels, those inside rows included."""
    for panel in panels:
        yield panel
        yield from all_panels(panel.get("panels", []))


def dashboard_queries(dashboard):
    """(panel, expression) for each query of the dashboard, with Grafana's interval variables
    ($__rate_interval, $__interval, $__range) replaced by 5m as Grafana substitutes them."""
    for panel in all_panels(dashboard.get("panels", [])):
        for query in panel.get("targets", []):
            expr = re.sub(r"\$__(rate_interval|interval|range)\b", "5m", query.get("expr", ""))
            yield panel, expr


def write_keda_objects(out, rendered):
    for path in rendered:
        target = path.stem
        try:
            docs = [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
        except (OSError, yaml.YAMLError):
            continue
        for doc in docs:
            api = str(doc.get("apiVersion", ""))
            if not api.startswith("keda.sh/"):
                continue
            folder = out / "keda" / f"{str(doc.get('kind')).lower()}-{api.split('/', 1)[1]}"
            folder.mkdir(parents=True, exist_ok=True)
            name = (doc.get("metadata") or {}).get("name", "unnamed")
            (folder / f"{target}.{name}.json").write_text(json.dumps(doc, indent=2))


def write_dashboard_rules(out):
    groups = []
    try:
        dashboard = json.loads(DASHBOARD.read_text())
    except (OSError, ValueError):
        dashboard = {}
    by_panel = {}
    for panel, expr in dashboard_queries(dashboard):
        if "$" in expr:
            continue
        key = id(panel)
        if key not in by_panel:
            name = f"panel {panel.get('id')} {panel.get('title')!r}"
            if any(g["name"] == name for g in groups):
                name += f" (#{len(groups) + 1})"
            by_panel[key] = {"name": name, "rules": []}
            groups.append(by_panel[key])
        rules = by_panel[key]["rules"]
        rules.append({"record": f"dashboard:panel_{panel.get('id')}:query_{len(rules) + 1}", "expr": expr})
    (out / "dashboard-rules.yml").write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))


def main():
    out, *rendered = sys.argv[1:]
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_keda_objects(out, [pathlib.Path(p) for p in rendered])
    write_dashboard_rules(out)


if __name__ == "__main__":
    main()
