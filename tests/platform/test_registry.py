import pytest

from troupe.platform.errors import RegistryError
from troupe.platform.registry import ADVANTAGES, ALGORITHMS, REWARDS, Registry, resolve_import_path


def test_register_and_get():
    reg = Registry("thing")
    reg.register("a", 1)

    @reg.register("b")
    def b():
        return 2

    assert reg.get("a") == 1 and reg.get("b")() == 2 and reg.names() == ["a", "b"]


def test_unknown_name_lists_registered():
    reg = Registry("thing")
    reg.register("alpha", 1)
    with pytest.raises(RegistryError, match="unknown thing 'beta'; registered: alpha"):
        reg.get("beta")


def test_double_registration_is_refused():
    reg = Registry("thing")
    reg.register("a", 1)
    with pytest.raises(RegistryError, match="already registered"):
        reg.register("a", 2)


def test_import_path_resolves_and_bad_paths_say_which():
    assert resolve_import_path("os.path:join") is __import__("os").path.join
    with pytest.raises(RegistryError, match="cannot import module 'no_such_mod'"):
        REWARDS.get("no_such_mod:fn")
    with pytest.raises(RegistryError, match="has no attribute 'nope'"):
        REWARDS.get("os.path:nope")


def test_builtins_are_registered_lazily():
    assert "grpo" in ALGORITHMS.names()
    assert {"grpo", "dr_grpo", "rloo"} <= set(ADVANTAGES.names())
    assert "arithmetic_exact" in REWARDS.names()
