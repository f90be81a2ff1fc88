"""Renders every kustomize overlay and validates every object strictly.

Kubernetes kinds are checked by kubernetes-validate against the API schemas of
KUBERNETES_VERSION with unknown fields rejected; the ServiceMonitor (a CRD, not
in those schemas) against schemas/servicemonitor.schema.json. Any object whose
kind has no schema fails: nothing is waved through. With --server_bin, every
`--flag` the Deployments pass to the server must be a flag that binary knows.
Exit status 0 only when every overlay renders and every object passes.

    python deploy/k8s/validate_manifests.py [--server_bin=build/bin/flashsampler-server]
"""
import argparse
import json
import pathlib
import re
import shutil
import subprocess
import sys

import jsonschema
import kubernetes_validate
import yaml

KUBERNETES_VERSION = "1.32.0"
HERE = pathlib.Path(__file__).resolve().parent
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): HERE / "schemas" / "servicemonitor.schema.json",
}


def render(overlay: pathlib.Path) -> list:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        sys.exit("validate_manifests: kubectl is not installed (it renders the kustomize overlays)")
    out = subprocess.run([kubectl, "kustomize", str(overlay)], check=True, capture_output=True,
                         text=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def validate(doc: dict) -> None:
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in CRD_SCHEMAS:
        jsonschema.validate(doc, json.loads(CRD_SCHEMAS[key].read_text()))
    else:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def server_flags(server_bin: str) -> set:
    """The flag names flashsampler-server accepts, read from its --helpfull."""
    out = subprocess.run([server_bin, "--helpfull"], capture_output=True, text=True)
    return set(re.findall(r"^\s+--([a-z0-9_]+)", out.stdout + out.stderr, re.MULTILINE))


def check_server_args(doc: dict, known: set) -> list:
    unknown = []
    if doc.get("kind") != "Deployment":
        return unknown
    for container in doc["spec"]["template"]["spec"]["containers"]:
        for arg in container.get("args", []):
            name = arg[2:].split("=", 1)[0] if arg.startswith("--") else None
            if name is not None and name not in known:
                unknown.append(arg)
    return unknown


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--server_bin", default=None)
    args = parser.parse_args()
    known = server_flags(args.server_bin) if args.server_bin else None
    if known is not None and "address" not in known:
        print("validate_manifests: could not read the server's flags", file=sys.stderr)
        return 1
    overlays = sorted(p.parent for p in (HERE / "overlays").glob("*/kustomization.yaml"))
    if not overlays:
        print("validate_manifests: no overlays found", file=sys.stderr)
        return 1
    failures = 0
    for overlay in overlays:
        docs = render(overlay)
        kinds = sorted(d["kind"] for d in docs)
        for doc in docs:
            name = f"{overlay.name}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
            try:
                validate(doc)
                unknown = check_server_args(doc, known) if known is not None else []
                if unknown:
                    raise jsonschema.ValidationError(f"server flags it does not know: {unknown}")
                print(f"ok   {name}")
            except (kubernetes_validate.ValidationError, kubernetes_validate.SchemaNotFoundError,
                    kubernetes_validate.InvalidSchemaError, jsonschema.ValidationError) as error:
                failures += 1
                print(f"FAIL {name}: {getattr(error, 'message', error)}")
        required = {"Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler",
                    "ServiceMonitor"}
        if not required <= set(kinds):
            failures += 1
            print(f"FAIL {overlay.name}: missing kinds {sorted(required - set(kinds))}")
    print(f"{len(overlays)} overlays, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
