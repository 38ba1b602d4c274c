"""Developer tool, not a user command: checks deploy/kuberay/rayservice.yaml against the CRD.

It validates the manifest against KubeRay's RayService CRD.

    python -m ops.dev.check_rayservice_crd path/to/ray.io_rayservices.yaml

The CRD ships with KubeRay (``helm-chart/kuberay-operator/crds/``), not with any
Python package, so this is a maintainer's check rather than a unit test. Unknown
fields are rejected, as ``kubectl apply --validate=strict`` does.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import jsonschema
import yaml

MANIFEST = Path(__file__).parents[2] / "deploy" / "kuberay" / "rayservice.yaml"


def _strict(schema: Any) -> Any:
    """The CRD schema with unknown fields rejected."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def check(crd_path: Path, manifest: Path = MANIFEST) -> None:
    crd = next(d for d in yaml.safe_load_all(crd_path.read_text())
               if d and d.get("kind") == "CustomResourceDefinition")
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema = _strict(version["schema"]["openAPIV3Schema"])
    rs = next(d for d in yaml.safe_load_all(manifest.read_text())
              if d and d.get("kind") == "RayService")
    rs = copy.deepcopy(rs)
    rs["metadata"] = {}  # ObjectMeta is validated by the API server, not the CRD
    jsonschema.validate(rs, schema)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    check(Path(args[0]))
    print(f"{MANIFEST} matches {args[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
