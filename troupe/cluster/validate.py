"""Offline checks for cluster configs: Ray cluster-launcher YAMLs, KubeRay manifests, and
whether the bundles a graph asks for fit any node type.

Nothing here needs a network or a cloud account. Launcher YAMLs are checked against the JSON
schema shipped inside the Ray wheel (``ray/autoscaler/ray-schema.json``) and then by Ray's
own offline preparation and check (``prepare_config`` and ``validate_config``). KubeRay
manifests are checked against the CRD ``openAPIV3Schema`` files (one per kind, e.g.
``RayJob.v1.schema.json``) with unknown fields made errors: Kubernetes drops them silently,
so a typo such as ``maxReplica`` would otherwise only show as a cluster that never scales.

    python -m troupe.cluster.validate troupe/cluster/configs/*.yaml
    python -m troupe.cluster.validate --kuberay-schemas tests/cluster/schemas troupe/cluster/kuberay/*.yaml
    python -m troupe.cluster.validate troupe/cluster/configs/aws.yaml --bundles '[{"CPU": 2, "GPU": 1}]'
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import difflib
import functools
import importlib.util
import io
import json
import logging
import math
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from troupe.platform.errors import ConfigError
from troupe.platform.placement import bundle_misfit as _no_fit_reason  # the same fit rule as at run time

CONFIGS_DIR = Path(__file__).parent / "configs"
KUBERAY_DIR = Path(__file__).parent / "kuberay"
KUBERAY_API_VERSION = "ray.io/v1"
KUBERAY_KINDS = ("RayCluster", "RayJob", "RayService")
KUBERAY_SCHEMAS_ENV = "TROUPE_KUBERAY_SCHEMAS"

# Provider fields that Ray's own providers read but ray-schema.json does not list (the
# schema lets any provider field through, so a typo such as `regoin` would go unnoticed).
_PROVIDER_FIELDS_READ_BY_RAY = frozenset({
    "aws_credentials", "cache_stopped_nodes", "cloudwatch", "coordinator_address", "external_head_ip",
    "gcp_credentials", "key_pair", "launch_multiple", "list_of_node_ips", "use_external_head_ip",
    "use_node_id_as_ip", "disable_launch_config_check", "foreground_node_launch",
    "worker_liveness_check", "worker_rpc_drain", "_config_cache_path",
})
_PROVIDERS_WITH_KNOWN_FIELDS = frozenset({"aws", "gcp", "azure", "local"})
_LOCAL_NODE_TYPE = "local.cluster.node"
_MAX_MESSAGE = 240


@dataclasses.dataclass
class ConfigReport:
    """What the checks found in one config: errors make it unusable, warnings deserve a look."""

    source: str
    kind: str
    errors: list[str] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no check found an error."""
        return not self.errors

    def raise_for_errors(self) -> None:
        """Raise `ConfigError` listing every error, if there is any."""
        if self.errors:
            raise ConfigError(f"{self.source} ({self.kind}) is not valid:\n  - " + "\n  - ".join(self.errors))

    def __str__(self) -> str:
        head = f"{self.source} ({self.kind}): " + ("ok" if self.ok else f"{len(self.errors)} error(s)")
        lines = [head] + [f"  error: {e}" for e in self.errors] + [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class InfeasibleBundle:
    """A bundle that no node type can hold; ``index`` is None for a STRICT_PACK group's sum."""

    index: int | None
    bundle: dict[str, float]
    reason: str

    def __str__(self) -> str:
        what = "the whole STRICT_PACK group" if self.index is None else f"bundle {self.index}"
        return f"{what} {_fmt_resources(self.bundle)}: {self.reason}"


# ---------------------------------------------------------------------------------------------
# Loading and schema errors


def load_config(source: str | Path | Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """A config as a dict plus a name for messages; ``source`` is a YAML path or a mapping."""
    if isinstance(source, Mapping):
        return copy.deepcopy(dict(source)), "<config>"
    path = Path(source)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping at its top level, not {type(data).__name__}")
    return data, str(path)


def schema_errors(instance: Any, schema: Mapping[str, Any]) -> list[str]:
    """Every way ``instance`` breaks ``schema``, one readable line each; unknown fields by name."""
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    errors = sorted(cls(schema).iter_errors(instance), key=lambda e: [str(p) for p in e.absolute_path])
    lines: list[str] = []
    for err in errors:
        lines.extend(_describe_schema_error(err))
    return lines


def _describe_schema_error(err: Any) -> list[str]:
    where = _path_str(err.absolute_path)
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        allowed = set(err.schema.get("properties", {}))
        patterns = list(err.schema.get("patternProperties", {}))
        extras = [k for k in err.instance if k not in allowed and not any(re.search(p, k) for p in patterns)]
        if extras:
            return [_unknown_field(where, key, allowed) for key in extras]
    message = err.message if len(err.message) <= _MAX_MESSAGE else err.message[:_MAX_MESSAGE] + "..."
    if err.validator == "type" and ".rayStartParams." in f".{where}":
        message += ' (KubeRay rayStartParams values are strings: write num-gpus: "1", not num-gpus: 1)'
    return [f"{where or '<top level>'}: {message}"]


def _unknown_field(where: str, key: str, allowed: Iterable[str]) -> str:
    full = f"{where}.{key}" if where else key
    close = difflib.get_close_matches(key, sorted(allowed), n=1, cutoff=0.7)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown field {full!r}{hint}"


def _path_str(parts: Iterable[Any]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _one_line(exc: BaseException) -> str:
    text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    text = " ".join(str(text).split())
    return text if len(text) <= _MAX_MESSAGE * 2 else text[: _MAX_MESSAGE * 2] + "..."


# ---------------------------------------------------------------------------------------------
# Cluster-launcher YAMLs


def launcher_schema_path() -> Path:
    """Path of the cluster-launcher JSON schema inside the installed Ray wheel."""
    # find_spec locates the wheel without importing ray (about a second) just to read a file.
    spec = importlib.util.find_spec("ray")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("ray is not installed: pip install 'ray[default]'")
    path = Path(next(iter(spec.submodule_search_locations))) / "autoscaler" / "ray-schema.json"
    if not path.is_file():
        raise ConfigError(f"the Ray wheel lacks {path}: reinstall 'ray[default]'")
    return path


@functools.lru_cache(maxsize=1)
def _launcher_schema() -> dict[str, Any]:
    return json.loads(launcher_schema_path().read_text())


def check_launcher_config(source: str | Path | Mapping[str, Any]) -> ConfigReport:
    """Check a cluster-launcher YAML (for ``ray up``) offline.

    Errors: anything ``ray-schema.json`` rejects (unknown top-level, auth, docker and
    node-type fields among them), unknown provider fields of Ray's built-in providers,
    ``min_workers`` above ``max_workers``, and whatever Ray's own ``prepare_config`` plus
    ``validate_config`` reject. Warnings: settings that validate but will not work as meant.
    """
    config, name = load_config(source)
    report = ConfigReport(name, "launcher")
    schema = _launcher_schema()
    report.errors += schema_errors(config, schema)
    report.errors += _unknown_provider_fields(config, schema)
    report.errors += _node_type_errors(config)
    if not report.errors:
        # Ray's preparation indexes into the config freely; it only makes sense on a config
        # that already passed the schema.
        report.errors += _ray_config_check(config)
    report.warnings += _launcher_warnings(config)
    return report


def _unknown_provider_fields(config: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    provider = config.get("provider")
    if not isinstance(provider, dict) or provider.get("type") not in _PROVIDERS_WITH_KNOWN_FIELDS:
        return []  # external providers define their own fields
    known = set(schema["properties"]["provider"].get("properties", {})) | _PROVIDER_FIELDS_READ_BY_RAY
    return [_unknown_field("provider", key, known) for key in provider if key not in known]


def _node_type_errors(config: Mapping[str, Any]) -> list[str]:
    errors = []
    types = config.get("available_node_types")
    if not isinstance(types, dict):
        return errors
    for name, spec in types.items():
        if not isinstance(spec, dict):
            continue
        lo, hi = spec.get("min_workers"), spec.get("max_workers")
        if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
            errors.append(f"available_node_types.{name}: min_workers ({lo}) is above max_workers ({hi})")
    return errors


def _ray_config_check(config: Mapping[str, Any]) -> list[str]:
    from troupe.platform.ray_internal import cluster_config_check

    check = cluster_config_check()
    if check is None:
        return []
    out = io.StringIO()
    ray_log = logging.getLogger("ray.autoscaler")
    level = ray_log.level
    try:
        # Ray's cli_logger and logger print their own copy of each problem (and INFO lines
        # about filled-in defaults); the report carries the problems.
        ray_log.setLevel(logging.ERROR)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            check(copy.deepcopy(dict(config)))
    except Exception as e:  # ValueError, RuntimeError, jsonschema or click errors: all config problems
        return [f"Ray's config check: {_one_line(e)}"]
    finally:
        ray_log.setLevel(level)
    return []


def _launcher_warnings(config: Mapping[str, Any]) -> list[str]:
    warnings = []
    provider = config.get("provider") if isinstance(config.get("provider"), dict) else {}
    if provider.get("type") == "gcp" and not provider.get("project_id"):
        warnings.append("provider.project_id is not set: fill in your GCP project id before `ray up`")
    types = config.get("available_node_types")
    if isinstance(types, dict) and provider.get("type") != "local":
        bare = [n for n, t in types.items() if isinstance(t, dict) and not t.get("resources")]
        if bare:
            warnings.append(
                f"node types {bare} declare no resources: Ray detects them at `ray up`, so whether a "
                "graph's bundles fit cannot be checked offline"
            )
    mounts = config.get("file_mounts") if isinstance(config.get("file_mounts"), dict) else {}
    commands = " ".join(str(c) for key in ("head_start_ray_commands", "worker_start_ray_commands")
                        for c in (config.get(key) or []))
    token_shipped = any("auth_token" in str(k) for k in mounts) or "RAY_AUTH_TOKEN" in commands
    if not token_shipped:
        warnings.append(
            "no authentication token is shipped to the nodes (file_mounts of ~/.ray/auth_token or "
            "RAY_AUTH_TOKEN_PATH in the start commands): the job API would be open to anyone who reaches it"
        )
    return warnings


# ---------------------------------------------------------------------------------------------
# KubeRay manifests


def strict_crd_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a CRD ``openAPIV3Schema`` in which unknown fields are errors.

    Every object schema that lists ``properties`` and says nothing of
    ``additionalProperties`` gets ``additionalProperties: false``, except where it is marked
    ``x-kubernetes-preserve-unknown-fields`` (Kubernetes keeps unknown fields there).
    """

    def strict(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        out = dict(node)
        if isinstance(node.get("properties"), dict):
            out["properties"] = {k: strict(v) for k, v in node["properties"].items()}
            if "additionalProperties" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
                out["additionalProperties"] = False
        for key in ("items", "additionalProperties", "not"):
            if isinstance(node.get(key), dict):
                out[key] = strict(node[key])
        for key in ("anyOf", "allOf", "oneOf"):
            if isinstance(node.get(key), list):
                out[key] = [strict(s) for s in node[key]]
        return out

    return strict(schema)


def kuberay_schema_dir(schema_dir: str | Path | None = None) -> Path:
    """The folder holding the KubeRay CRD schema files: the argument, else $TROUPE_KUBERAY_SCHEMAS."""
    chosen = schema_dir if schema_dir is not None else os.environ.get(KUBERAY_SCHEMAS_ENV)
    if not chosen:
        raise ConfigError(
            "no KubeRay CRD schemas given: pass the folder that holds RayCluster.v1.schema.json and "
            f"RayJob.v1.schema.json (--kuberay-schemas DIR, or ${KUBERAY_SCHEMAS_ENV}); the tests keep "
            "copies in tests/cluster/schemas"
        )
    return Path(chosen)


@functools.lru_cache(maxsize=8)
def _crd_schema(kind: str, schema_dir: str) -> dict[str, Any]:
    path = Path(schema_dir) / f"{kind}.v1.schema.json"
    if not path.is_file():
        raise ConfigError(
            f"no CRD schema for {kind} at {path}: copy {kind}.v1.schema.json (the openAPIV3Schema of "
            f"KubeRay's {kind} CRD) into {schema_dir}"
        )
    data = json.loads(path.read_text())
    # The files wrap the schema with its provenance; a bare openAPIV3Schema works as well.
    return strict_crd_schema(data.get("schema", data))


def check_kuberay_manifest(
    source: str | Path | Mapping[str, Any], schema_dir: str | Path | None = None
) -> ConfigReport:
    """Check a KubeRay ``RayCluster``, ``RayJob`` or ``RayService`` manifest offline.

    Errors: whatever the CRD's strict schema rejects (unknown fields, non-string
    ``rayStartParams`` values, bad enums), a wrong ``apiVersion``, replica counts out of
    order, duplicate group names and a ``runtimeEnvYAML`` that is not a YAML mapping.
    """
    manifest, name = load_config(source)
    kind = manifest.get("kind")
    report = ConfigReport(name, str(kind))
    if kind not in KUBERAY_KINDS:
        report.errors.append(f"kind: {kind!r} is not a KubeRay kind (one of {', '.join(KUBERAY_KINDS)})")
        return report
    if manifest.get("apiVersion") != KUBERAY_API_VERSION:
        report.errors.append(f"apiVersion: {manifest.get('apiVersion')!r}, expected {KUBERAY_API_VERSION!r}")
    schema = _crd_schema(kind, str(kuberay_schema_dir(schema_dir)))
    report.errors += schema_errors(manifest, schema)
    report.errors += _kuberay_errors(manifest)
    report.warnings += _kuberay_warnings(manifest)
    return report


def _cluster_spec(manifest: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    spec = manifest.get("spec") if isinstance(manifest.get("spec"), dict) else {}
    key = {"RayJob": "rayClusterSpec", "RayService": "rayClusterConfig"}.get(str(manifest.get("kind")))
    if key is None:
        return "spec", spec
    inner = spec.get(key)
    return f"spec.{key}", inner if isinstance(inner, dict) else {}


def _kuberay_errors(manifest: Mapping[str, Any]) -> list[str]:
    errors = []
    where, spec = _cluster_spec(manifest)
    groups = spec.get("workerGroupSpecs") if isinstance(spec.get("workerGroupSpecs"), list) else []
    seen: set[str] = set()
    for i, group in enumerate(groups):
        if not isinstance(group, dict):
            continue
        at = f"{where}.workerGroupSpecs[{i}]"
        name = group.get("groupName")
        if name in seen:
            errors.append(f"{at}.groupName: {name!r} is used by another worker group")
        seen.add(name)
        lo, n, hi = group.get("minReplicas"), group.get("replicas"), group.get("maxReplicas")
        if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
            errors.append(f"{at}: minReplicas ({lo}) is above maxReplicas ({hi})")
        if isinstance(n, int) and isinstance(hi, int) and n > hi:
            errors.append(f"{at}: replicas ({n}) is above maxReplicas ({hi})")
        if isinstance(n, int) and isinstance(lo, int) and n < lo:
            errors.append(f"{at}: replicas ({n}) is below minReplicas ({lo})")
    job = manifest.get("spec") if manifest.get("kind") == "RayJob" and isinstance(manifest.get("spec"), dict) else {}
    if isinstance(job.get("runtimeEnvYAML"), str):
        try:
            env = yaml.safe_load(job["runtimeEnvYAML"])
        except yaml.YAMLError as e:
            errors.append(f"spec.runtimeEnvYAML is not valid YAML: {_one_line(e)}")
        else:
            if env is not None and not isinstance(env, dict):
                errors.append("spec.runtimeEnvYAML must be a YAML mapping (a runtime_env such as env_vars: {...})")
    return errors


def _kuberay_warnings(manifest: Mapping[str, Any]) -> list[str]:
    warnings = []
    where, spec = _cluster_spec(manifest)
    if not spec:
        return warnings
    if spec.get("workerGroupSpecs") and spec.get("enableInTreeAutoscaling") is not True:
        warnings.append(f"{where}.enableInTreeAutoscaling is not true: worker groups keep their replica count")
    auth = spec.get("authOptions") if isinstance(spec.get("authOptions"), dict) else {}
    if auth.get("mode") != "token":
        warnings.append(f"{where}.authOptions.mode is not 'token': the job API is open to anyone who reaches it")
    if manifest.get("kind") == "RayJob":
        job = manifest.get("spec") or {}
        if not job.get("entrypoint"):
            warnings.append("spec.entrypoint is empty: the RayJob submits nothing")
        if job.get("shutdownAfterJobFinishes") is not True:
            warnings.append("spec.shutdownAfterJobFinishes is not true: the cluster outlives the job")
    return warnings


# ---------------------------------------------------------------------------------------------
# Node types and bundle fit


def node_types(config: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Resources each launchable node type offers, from a launcher YAML or a KubeRay manifest.

    A node type maps to ``{}`` when Ray detects its resources at start (a local provider, or
    a cloud node type without ``resources``). Worker types that can never start
    (``max_workers``/``maxReplicas`` of 0) are left out.
    """
    if config.get("kind") in KUBERAY_KINDS:
        return _kuberay_node_types(config)
    provider = config.get("provider") if isinstance(config.get("provider"), dict) else {}
    if provider.get("type") == "local":
        return {_LOCAL_NODE_TYPE: {}}
    head = config.get("head_node_type")
    out: dict[str, dict[str, float]] = {}
    for name, spec in (config.get("available_node_types") or {}).items():
        if name != head and spec.get("max_workers", config.get("max_workers", 1)) == 0:
            continue
        out[name] = {k: float(v) for k, v in (spec.get("resources") or {}).items()}
    return out


def _kuberay_node_types(manifest: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    _, spec = _cluster_spec(manifest)
    out = {}
    if isinstance(spec.get("headGroupSpec"), dict):
        out["head"] = _group_resources(spec["headGroupSpec"])
    for group in spec.get("workerGroupSpecs") or []:
        if isinstance(group, dict) and group.get("maxReplicas", 1) != 0:
            out[str(group.get("groupName"))] = _group_resources(group)
    return out


def _group_resources(group: Mapping[str, Any]) -> dict[str, float]:
    """What Ray on a pod of this group advertises: rayStartParams first, then container limits."""
    params = group.get("rayStartParams") or {}
    containers = (((group.get("template") or {}).get("spec") or {}).get("containers")) or [{}]
    # KubeRay treats the first container as the Ray container.
    limits = dict(((containers[0].get("resources") or {}).get("requests")) or {})
    limits.update(((containers[0].get("resources") or {}).get("limits")) or {})
    res: dict[str, float] = {}
    cpu = params.get("num-cpus", limits.get("cpu"))
    if cpu is not None:
        res["CPU"] = parse_quantity(cpu)
    gpu = params.get("num-gpus")
    if gpu is None:
        gpus = [v for k, v in limits.items() if str(k).endswith("/gpu")]
        gpu = sum(parse_quantity(v) for v in gpus) if gpus else None
    if gpu is not None:
        res["GPU"] = parse_quantity(gpu)
    memory = params.get("memory", limits.get("memory"))
    if memory is not None:
        res["memory"] = parse_quantity(memory)
    if params.get("resources"):
        try:
            res.update({k: float(v) for k, v in json.loads(params["resources"]).items()})
        except (ValueError, AttributeError):
            raise ConfigError(f"rayStartParams.resources must be a JSON object, got {params['resources']!r}") from None
    # The group-level `resources` map overrides what Ray would detect.
    res.update({k: parse_quantity(v) for k, v in (group.get("resources") or {}).items()})
    return {k: v for k, v in res.items() if v > 0}


_QUANTITY_SUFFIXES = {
    "m": 1e-3, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}


def parse_quantity(value: str | float | int) -> float:
    """A Kubernetes quantity ("500m", "48Gi", "8", 1) as a number."""
    if isinstance(value, (int, float)):
        return float(value)
    m = re.fullmatch(r"\s*([0-9.]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2) not in _QUANTITY_SUFFIXES:
        raise ConfigError(f"{value!r} is not a Kubernetes quantity (e.g. 500m, 8, 48Gi)")
    return float(m.group(1)) * _QUANTITY_SUFFIXES[m.group(2)]


def infeasible_bundles(
    bundles: Sequence[Mapping[str, float]],
    types: Mapping[str, Mapping[str, float]],
    strategy: str = "PACK",
) -> list[InfeasibleBundle]:
    """The bundles that no node type can hold, each with the reason.

    ``bundles`` are placement-group bundles such as ``{"CPU": 2, "GPU": 1}``; ``types`` maps a
    node type to the resources one node of it offers (`node_types` reads them from a config).
    Under STRICT_PACK every bundle must share one node, so their sum is checked as well. Such
    a bundle would leave a placement group pending forever: an autoscaler adds only nodes
    that can hold it.
    """
    undecided = sorted(name for name, res in types.items() if not res)
    if not types or undecided:
        raise ConfigError(
            f"cannot decide offline whether the bundles fit: node types {undecided or '(none)'} do not "
            "declare their resources (Ray detects them when the nodes start); declare `resources` for "
            "each node type to check offline"
        )
    found = []
    for i, raw in enumerate(bundles):
        bundle = {k: float(v) for k, v in raw.items() if float(v) > 0}
        reason = _no_fit_reason(bundle, types)
        if reason:
            found.append(InfeasibleBundle(i, bundle, reason))
    if strategy.upper() == "STRICT_PACK" and len(bundles) > 1 and not found:
        total: dict[str, float] = {}
        for raw in bundles:
            for k, v in raw.items():
                total[k] = total.get(k, 0.0) + float(v)
        total = {k: v for k, v in total.items() if v > 0}
        reason = _no_fit_reason(total, types)
        if reason:
            found.append(InfeasibleBundle(None, total, reason))
    return found


def check_bundles(
    source: str | Path | Mapping[str, Any],
    bundles: Sequence[Mapping[str, float]],
    strategy: str = "PACK",
) -> list[InfeasibleBundle]:
    """`infeasible_bundles` against the node types of a launcher YAML or KubeRay manifest."""
    config, _ = load_config(source)
    return infeasible_bundles(bundles, node_types(config), strategy)


def _fmt_amount(v: float) -> str:
    return str(int(v)) if math.isclose(v, round(v)) else f"{v:g}"


def _fmt_resources(res: Mapping[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {_fmt_amount(float(v))}" for k, v in res.items()) + "}"


# ---------------------------------------------------------------------------------------------
# Entry points


def check_config_file(path: str | Path, schema_dir: str | Path | None = None) -> ConfigReport:
    """Check one file, as a KubeRay manifest when it names a KubeRay ``kind``, else as a launcher YAML."""
    config, _ = load_config(path)
    if "kind" in config or "apiVersion" in config:
        report = check_kuberay_manifest(path, schema_dir)
    else:
        report = check_launcher_config(path)
    report.source = str(path)
    return report


def shipped_configs() -> list[Path]:
    """Every config troupe ships: launcher YAMLs and KubeRay manifests."""
    return sorted(CONFIGS_DIR.glob("*.yaml")) + sorted(KUBERAY_DIR.glob("*.yaml"))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m troupe.cluster.validate``: check config files; exit 1 on any error or misfit."""
    parser = argparse.ArgumentParser(prog="python -m troupe.cluster.validate", description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", help="configs to check (default: every config troupe ships)")
    parser.add_argument("--kuberay-schemas", default=None, help="folder holding the KubeRay CRD schema files")
    parser.add_argument("--bundles", default=None, help='JSON list of bundles, e.g. \'[{"CPU": 2, "GPU": 1}]\'')
    parser.add_argument("--strategy", default="PACK", help="placement strategy of the bundles (PACK, STRICT_PACK...)")
    args = parser.parse_args(argv)
    bundles = json.loads(args.bundles) if args.bundles else None
    failed = False
    for path in args.files or shipped_configs():
        try:
            report = check_config_file(path, args.kuberay_schemas)
            print(report)
            failed |= not report.ok
            if bundles is not None and report.ok:
                for item in check_bundles(path, bundles, args.strategy):
                    print(f"  infeasible: {item}")
                    failed = True
        except ConfigError as e:
            print(f"{path}: {e}")
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
