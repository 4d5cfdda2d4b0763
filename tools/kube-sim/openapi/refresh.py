#!/usr/bin/env python3
"""Regenerates kube-sim's OpenAPI documents from a real kube-apiserver.

The simulator serves the OpenAPI v3 documents (and the v2 document) that kubectl reads
before `kubectl apply`: it checks there that the server validates fields itself
(`fieldValidation` on PATCH), and kube-sim checks request bodies against the same
schemas. This script keeps those documents true to kube-apiserver: it downloads them
from a running server (the shared tool's, see crates/testenv or
../shared/tools/kube-apiserver/README.md), keeps the paths of the resources kube-sim
serves and every schema they reach, drops the prose (`description`), and writes
compact JSON next to itself.

    set -a; . /tmp/cp/env; set +a     # APISERVER, ADMIN_TOKEN, CA
    python3 crates/kube-sim/openapi/refresh.py
"""
import json
import os
import re
import ssl
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))

# Group-versions kube-sim serves, and which of their paths to keep (None: all).
V3 = {
    "api/v1": re.compile(r"^/api/v1/(watch/)?(namespaces(/\{name\}(/status)?)?|secrets|services|namespaces/\{namespace\}/(secrets|services)(/\{name\}(/status)?)?)$"),
    "apis/discovery.k8s.io/v1": None,
    "apis/route.openshift.io/v1": None,
    "apis/rbac.authorization.k8s.io/v1": None,
    "apis/authorization.k8s.io/v1": re.compile(r"(subjectaccessreviews|selfsubjectaccessreviews|selfsubjectrulesreviews|localsubjectaccessreviews)$"),
}
V2_PATHS = re.compile(
    r"^/api/v1/(watch/)?(namespaces(/\{name\}(/status)?)?|secrets|services|namespaces/\{namespace\}/(secrets|services)(/\{name\}(/status)?)?)$"
    r"|^/apis/discovery\.k8s\.io/v1/"
    r"|^/apis/route\.openshift\.io/v1/"
    r"|^/apis/rbac\.authorization\.k8s\.io/v1/"
    r"|^/apis/authorization\.k8s\.io/v1/.*(subjectaccessreviews|selfsubjectaccessreviews|selfsubjectrulesreviews)$"
)


def fetch(path):
    context = ssl.create_default_context(cafile=os.environ["CA"])
    request = urllib.request.Request(
        os.environ["APISERVER"] + path,
        headers={"Authorization": "Bearer " + os.environ["ADMIN_TOKEN"], "Accept": "application/json"},
    )
    with urllib.request.urlopen(request, context=context) as response:
        return json.load(response)


def without_prose(value):
    """The document without `description` texts (a property named description stays)."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key == "description" and isinstance(item, str):
                continue
            out[key] = without_prose(item)
        return out
    if isinstance(value, list):
        return [without_prose(item) for item in value]
    return value


def refs(value, prefix):
    found = set()
    if isinstance(value, dict):
        ref = value.get("$ref")
        if isinstance(ref, str) and ref.startswith(prefix):
            found.add(ref[len(prefix):])
        for item in value.values():
            found |= refs(item, prefix)
    elif isinstance(value, list):
        for item in value:
            found |= refs(item, prefix)
    return found


def closure(schemas, start, prefix):
    keep, todo = set(), list(start)
    while todo:
        name = todo.pop()
        if name in keep or name not in schemas:
            continue
        keep.add(name)
        todo.extend(refs(schemas[name], prefix))
    return {name: schemas[name] for name in sorted(keep)}


def trim_v3(doc, keep_path):
    paths = {p: v for p, v in doc["paths"].items() if keep_path is None or keep_path.search(p)}
    prefix = "#/components/schemas/"
    schemas = closure(doc["components"]["schemas"], refs(paths, prefix), prefix)
    out = dict(doc)
    out["paths"] = paths
    out["components"] = dict(doc["components"], schemas=schemas)
    return without_prose(out)


def main():
    for gv, keep in V3.items():
        doc = trim_v3(fetch("/openapi/v3/" + gv), keep)
        name = "v3-" + gv.replace("/", "-").replace(".", "-") + ".json"
        with open(os.path.join(HERE, name), "w") as f:
            json.dump(doc, f, separators=(",", ":"), sort_keys=True)
        print(name, len(doc["paths"]), "paths", len(doc["components"]["schemas"]), "schemas")
    v2 = fetch("/openapi/v2")
    paths = {p: v for p, v in v2["paths"].items() if V2_PATHS.search(p)}
    prefix = "#/definitions/"
    definitions = closure(v2["definitions"], refs(paths, prefix), prefix)
    parameters = {
        name: value
        for name, value in v2.get("parameters", {}).items()
        if name in refs(paths, "#/parameters/")
    }
    definitions = closure(
        v2["definitions"], refs(paths, prefix) | refs(parameters, prefix), prefix
    )
    doc = without_prose(dict(v2, paths=paths, definitions=definitions, parameters=parameters))
    doc.pop("securityDefinitions", None)
    doc.pop("security", None)
    with open(os.path.join(HERE, "v2.json"), "w") as f:
        json.dump(doc, f, separators=(",", ":"), sort_keys=True)
    print("v2.json", len(paths), "paths", len(definitions), "definitions")


if __name__ == "__main__":
    main()
