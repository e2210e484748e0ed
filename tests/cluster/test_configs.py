"""The shipped cluster configs validate offline; broken ones fail naming the field; misfit bundles are reported."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from troupe.cluster import validate
from troupe.cluster.validate import (
    check_bundles,
    check_config_file,
    check_kuberay_manifest,
    check_launcher_config,
    infeasible_bundles,
    node_types,
    shipped_configs,
    strict_crd_schema,
)
from troupe.platform.errors import ConfigError

SCHEMAS = Path(__file__).parent / "schemas"
CONFIGS = validate.CONFIGS_DIR
KUBERAY = validate.KUBERAY_DIR
SHARED_KUBERAY = Path(__file__).resolve().parents[2].parent / "shared" / "kuberay"


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_troupe_ships_three_launcher_configs_and_two_kuberay_manifests():
    names = sorted(p.name for p in shipped_configs())
    assert names == ["aws.yaml", "gcp.yaml", "local.yaml", "raycluster.yaml", "rayjob.yaml"]


@pytest.mark.parametrize("path", shipped_configs(), ids=lambda p: p.name)
def test_every_shipped_config_validates(path: Path):
    report = check_config_file(path, SCHEMAS)
    assert report.ok, str(report)


@pytest.mark.parametrize("name", ["aws.yaml", "gcp.yaml"])
def test_cloud_configs_have_a_cpu_head_and_autoscaling_gpu_workers(name: str):
    config = load(CONFIGS / name)
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0
    gpu_types = [t for n, t in types.items() if n != config["head_node_type"] and t["resources"].get("GPU", 0) > 0]
    assert gpu_types and all(t["min_workers"] == 0 and t["max_workers"] > 0 for t in gpu_types)
    assert config["idle_timeout_minutes"] > 0
    # GPU workers get the CUDA torch before troupe, the head the CPU one.
    workers = " ".join(config["worker_setup_commands"])
    assert workers.index("torch") < workers.index("~/troupe") and "/whl/cu" in workers
    assert "/whl/cpu" in " ".join(config["head_setup_commands"])


@pytest.mark.parametrize("name", ["aws.yaml", "gcp.yaml", "local.yaml"])
def test_launcher_configs_keep_token_authentication_on(name: str):
    bare = load(CONFIGS / name)
    del bare["file_mounts"]["~/.ray/auth_token"]
    bare["head_start_ray_commands"] = bare["worker_start_ray_commands"] = ["ray start"]
    assert any("token" in w for w in check_launcher_config(bare).warnings)

    config = load(CONFIGS / name)
    assert "~/.ray/auth_token" in config["file_mounts"]
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        assert "RAY_AUTH_MODE=token" in " ".join(config[key])
    assert not [w for w in check_launcher_config(config).warnings if "token" in w]


def test_local_config_uses_the_local_provider():
    config = load(CONFIGS / "local.yaml")
    assert config["provider"]["type"] == "local"
    assert "available_node_types" not in config  # the local provider refuses it


def test_unknown_top_level_field_fails_naming_it():
    config = load(CONFIGS / "aws.yaml")
    config["idle_timeout_minute"] = 5
    report = check_launcher_config(config)
    assert not report.ok
    assert any("'idle_timeout_minute'" in e and "idle_timeout_minutes" in e for e in report.errors), report.errors


def test_unknown_node_type_field_fails_naming_it():
    config = load(CONFIGS / "gcp.yaml")
    config["available_node_types"]["gpu_l4"]["max_worker"] = 3
    report = check_launcher_config(config)
    assert report.errors == ["unknown field 'available_node_types.gpu_l4.max_worker' (did you mean 'max_workers'?)"]


def test_misspelt_provider_field_fails_although_the_schema_allows_any():
    config = load(CONFIGS / "aws.yaml")
    config["provider"]["regoin"] = "eu-west-1"
    report = check_launcher_config(config)
    assert any("provider.regoin" in e and "'region'" in e for e in report.errors), report.errors


def test_ray_own_check_rejects_a_head_type_that_does_not_exist():
    config = load(CONFIGS / "aws.yaml")
    config["head_node_type"] = "head_gpu"
    report = check_launcher_config(config)
    assert any("Ray's config check" in e and "head_node_type" in e for e in report.errors), report.errors


def test_min_workers_above_max_workers_fails():
    config = load(CONFIGS / "aws.yaml")
    config["available_node_types"]["gpu_4x"]["min_workers"] = 3
    report = check_launcher_config(config)
    assert any("gpu_4x" in e and "min_workers (3)" in e for e in report.errors), report.errors


def test_yaml_file_with_unknown_field_fails_naming_it(tmp_path: Path):
    config = load(CONFIGS / "local.yaml")
    config["setup_comands"] = []
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    report = check_config_file(path)
    assert not report.ok and "setup_comands" in str(report)
    with pytest.raises(ConfigError, match="setup_comands"):
        report.raise_for_errors()


def test_rayjob_runs_troupe_grpo_and_deletes_its_cluster():
    job = load(KUBERAY / "rayjob.yaml")["spec"]
    assert job["entrypoint"].startswith("troupe run grpo")
    assert job["shutdownAfterJobFinishes"] is True
    assert isinstance(yaml.safe_load(job["runtimeEnvYAML"]), dict)
    assert job["rayClusterSpec"]["enableInTreeAutoscaling"] is True


@pytest.mark.parametrize("name", ["raycluster.yaml", "rayjob.yaml"])
def test_kuberay_clusters_autoscale_gpu_workers_with_token_auth(name: str):
    manifest = load(KUBERAY / name)
    spec = manifest["spec"].get("rayClusterSpec", manifest["spec"])
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["authOptions"]["mode"] == "token"
    group = spec["workerGroupSpecs"][0]
    assert group["minReplicas"] == 0 < group["maxReplicas"]
    assert all(isinstance(v, str) for v in group["rayStartParams"].values())
    assert node_types(manifest)[group["groupName"]]["GPU"] == 1


def test_kuberay_unknown_field_fails_naming_it():
    manifest = load(KUBERAY / "raycluster.yaml")
    group = manifest["spec"]["workerGroupSpecs"][0]
    group["maxReplica"] = group.pop("maxReplicas")
    report = check_kuberay_manifest(manifest, SCHEMAS)
    assert "unknown field 'spec.workerGroupSpecs[0].maxReplica' (did you mean 'maxReplicas'?)" in report.errors
    assert any("maxReplicas" in e and "required" in e for e in report.errors), report.errors


def test_kuberay_unknown_field_deep_in_the_pod_template_fails():
    manifest = load(KUBERAY / "rayjob.yaml")
    container = manifest["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    container["resource"] = container.pop("resources")
    report = check_kuberay_manifest(manifest, SCHEMAS)
    assert any("containers[0].resource'" in e for e in report.errors), report.errors


def test_kuberay_ray_start_param_must_be_a_string():
    manifest = load(KUBERAY / "raycluster.yaml")
    manifest["spec"]["workerGroupSpecs"][0]["rayStartParams"]["num-gpus"] = 1
    report = check_kuberay_manifest(manifest, SCHEMAS)
    assert len(report.errors) == 1 and "rayStartParams.num-gpus" in report.errors[0]
    assert "strings" in report.errors[0]


def test_kuberay_replicas_out_of_order_fail():
    manifest = load(KUBERAY / "raycluster.yaml")
    manifest["spec"]["workerGroupSpecs"][0].update(minReplicas=3, maxReplicas=2)
    report = check_kuberay_manifest(manifest, SCHEMAS)
    assert any("minReplicas (3) is above maxReplicas (2)" in e for e in report.errors), report.errors


def test_kuberay_check_needs_the_schema_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(validate.KUBERAY_SCHEMAS_ENV, raising=False)
    with pytest.raises(ConfigError, match="tests/cluster/schemas"):
        check_kuberay_manifest(KUBERAY / "rayjob.yaml")
    with pytest.raises(ConfigError, match="RayJob.v1.schema.json"):
        check_kuberay_manifest(KUBERAY / "rayjob.yaml", tmp_path)


def test_strict_schema_forbids_unknown_fields_except_where_kubernetes_keeps_them():
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "object", "properties": {"x": {"type": "string"}}},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                     "properties": {"y": {"type": "string"}}},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "items": {"type": "array", "items": {"type": "object", "properties": {"z": {"type": "integer"}}}},
        },
    }
    strict = strict_crd_schema(schema)
    assert strict["additionalProperties"] is False
    assert strict["properties"]["a"]["additionalProperties"] is False
    assert "additionalProperties" not in strict["properties"]["free"]
    assert strict["properties"]["labels"]["additionalProperties"] == {"type": "string"}
    assert strict["properties"]["items"]["items"]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # the input is left alone


def test_schema_fixtures_are_the_kuberay_release_files():
    for kind in ("RayCluster", "RayJob"):
        data = json.loads((SCHEMAS / f"{kind}.v1.schema.json").read_text())
        assert data["kind"] == kind and data["apiVersion"] == "ray.io/v1" and "v1.7.0" in data["source"]
        shared = SHARED_KUBERAY / f"{kind}.v1.schema.json"
        if shared.is_file():  # beside a checkout; absent in some CI layouts
            assert json.loads(shared.read_text()) == data


def test_infeasible_bundle_is_reported():
    found = check_bundles(CONFIGS / "aws.yaml", [{"CPU": 2, "GPU": 1}, {"CPU": 4, "GPU": 16}, {"CPU": 48, "GPU": 4}])
    assert [f.index for f in found] == [1]
    assert found[0].bundle == {"CPU": 4.0, "GPU": 16.0}
    assert "GPU: 16 needed" in found[0].reason and "8 (gpu_8x)" in found[0].reason
    assert str(found[0]).startswith("bundle 1 {CPU: 4, GPU: 16}")


def test_bundle_that_fits_no_single_node_is_reported_even_if_each_resource_exists():
    types = {"head": {"CPU": 8}, "gpu": {"CPU": 2, "GPU": 1}}
    found = infeasible_bundles([{"CPU": 4, "GPU": 1}, {"CPU": 2, "GPU": 1}], types)
    assert [f.index for f in found] == [0]
    assert "no single node type" in found[0].reason


def test_strict_pack_checks_the_sum_of_the_group():
    types = {"gpu": {"CPU": 8, "GPU": 1}}
    bundles = [{"CPU": 1, "GPU": 0.5}, {"CPU": 1, "GPU": 0.5}, {"CPU": 1, "GPU": 0.25}]
    assert infeasible_bundles(bundles, types, "PACK") == []
    found = infeasible_bundles(bundles, types, "STRICT_PACK")
    assert len(found) == 1 and found[0].index is None and found[0].bundle["GPU"] == 1.25


def test_zero_amounts_and_fractional_shares_fit():
    types = {"gpu": {"CPU": 1, "GPU": 1}}
    assert infeasible_bundles([{"CPU": 0.1 + 0.2 + 0.7, "GPU": 0.0, "TPU": 0}], types) == []


def test_kuberay_node_types_read_string_params_and_container_limits():
    types = node_types(load(KUBERAY / "raycluster.yaml"))
    assert types["head"]["CPU"] == 6 and "GPU" not in types["head"]
    assert types["gpu-1x"]["CPU"] == 8 and types["gpu-1x"]["GPU"] == 1
    assert types["gpu-1x"]["memory"] == 48 * 2**30
    found = check_bundles(KUBERAY / "rayjob.yaml", [{"CPU": 1, "GPU": 2}])
    assert len(found) == 1 and "1 (gpu-1x)" in found[0].reason


def test_bundles_cannot_be_judged_where_ray_detects_resources():
    with pytest.raises(ConfigError, match="local.cluster.node"):
        check_bundles(CONFIGS / "local.yaml", [{"CPU": 1}])


def test_kubernetes_quantities_parse():
    assert validate.parse_quantity("500m") == 0.5
    assert validate.parse_quantity("48Gi") == 48 * 2**30
    assert validate.parse_quantity("2") == 2 and validate.parse_quantity(3) == 3
    with pytest.raises(ConfigError):
        validate.parse_quantity("lots")


def test_validate_command_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert validate.main(["--kuberay-schemas", str(SCHEMAS), str(KUBERAY / "rayjob.yaml"),
                          str(CONFIGS / "aws.yaml")]) == 0
    bad = copy.deepcopy(load(CONFIGS / "aws.yaml"))
    bad["max_worker"] = 1
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    assert validate.main([str(path)]) == 1
    assert validate.main([str(CONFIGS / "aws.yaml"), "--bundles", '[{"GPU": 9}]']) == 1
    out = capsys.readouterr().out
    assert "max_worker" in out and "infeasible: bundle 0" in out
