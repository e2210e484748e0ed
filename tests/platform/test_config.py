import dataclasses

import pytest

from troupe.platform.config import ConfigError, from_dict, parse_override, resolve, to_dict


@dataclasses.dataclass
class Inner:
    lr: float = 1e-3
    name: str = "a"
    flag: bool = False
    layers: list[int] = dataclasses.field(default_factory=lambda: [1, 2])


@dataclasses.dataclass
class Outer:
    steps: int = 10
    inner: Inner = dataclasses.field(default_factory=Inner)
    opt: str | None = None


def test_defaults_come_from_the_dataclass():
    cfg = from_dict(Outer, {})
    assert cfg.steps == 10 and cfg.inner.lr == 1e-3


def test_dotted_override_parses_yaml_values():
    assert resolve(Outer, None, None, ["inner.lr=1e-4"]).inner.lr == 1e-4
    assert parse_override("inner.layers=[3, 4]") == {"inner": {"layers": [3, 4]}}
    cfg = resolve(Outer, None, None, ["inner.lr=0.5", "steps=3", "inner.flag=true"])
    assert (cfg.inner.lr, cfg.steps, cfg.inner.flag) == (0.5, 3, True)


def test_unknown_key_names_the_key_and_the_allowed_ones():
    with pytest.raises(ConfigError, match=r"'inner.lrr'.*inner.lr"):
        resolve(Outer, None, None, ["inner.lrr=1"])


def test_wrong_type_names_the_key():
    with pytest.raises(ConfigError, match=r"'steps'.*integer"):
        resolve(Outer, None, None, ["steps=abc"])
    with pytest.raises(ConfigError, match=r"'inner.flag'.*true or false"):
        resolve(Outer, None, None, ["inner.flag=3"])
    # an optional key says null, as YAML and the command line spell None
    with pytest.raises(ConfigError, match=r"'opt' = \[1\]: expected str or null$"):
        resolve(Outer, None, None, ["opt=[1]"])


def test_section_given_a_scalar_is_an_error():
    with pytest.raises(ConfigError, match="section"):
        from_dict(Outer, {"inner": 3})


def test_malformed_override():
    with pytest.raises(ConfigError, match="section.key=value"):
        parse_override("no_equals_sign")


def test_unknown_preset_lists_available(tmp_path):
    (tmp_path / "fast.yaml").write_text("steps: 2\n")
    assert resolve(Outer, tmp_path, "fast").steps == 2
    with pytest.raises(ConfigError, match="available: default, fast"):
        resolve(Outer, tmp_path, "nope")


def test_round_trip_through_dict():
    cfg = resolve(Outer, None, None, ["opt=x"])
    assert from_dict(Outer, to_dict(cfg)) == cfg


def test_bad_value_in_real_config_names_key():
    from troupe.algorithms.grpo.config import GRPOConfig

    with pytest.raises(ConfigError, match="grpo.group_size"):
        resolve(GRPOConfig, None, None, ["grpo.group_size=1"])
    with pytest.raises(ConfigError, match="learner.aggregation"):
        resolve(GRPOConfig, None, None, ["learner.aggregation=sum"])


@dataclasses.dataclass
class WithOwnDefaults:
    inner: Inner = dataclasses.field(default_factory=lambda: Inner(lr=0.5, name="own"))


def test_partial_section_keeps_the_parents_own_defaults():
    cfg = resolve(WithOwnDefaults, None, None, ["inner.flag=true"])
    assert (cfg.inner.lr, cfg.inner.name, cfg.inner.flag) == (0.5, "own", True)


def test_a_selected_section_renamed_inside_a_parents_default_keeps_none_of_its_default_keys():
    from troupe.algorithms.grpo.config import GRPOConfig
    from troupe.envs.persona_prompts import PersonaPromptsTask

    @dataclasses.dataclass
    class Parent:
        policy: GRPOConfig = dataclasses.field(default_factory=lambda: GRPOConfig(task=PersonaPromptsTask.Config()))

    renamed = resolve(Parent, None, None, ["policy.task.name=arithmetic", "policy.task.digits=3"])
    assert renamed.policy.task.name == "arithmetic" and renamed.policy.task.digits == 3
    assert from_dict(Parent, to_dict(renamed)) == renamed  # a run's config.yaml reads back
    kept = resolve(Parent, None, None, ["policy.task.demos=3"])  # the same name: the default's other keys stay
    assert kept.policy.task.name == "persona_prompts" and kept.policy.task.demos == 3
