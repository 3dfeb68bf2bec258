"""The warm start (`warm_start`): the shipped model is the quickstart's default one, used without a build; other
settings are built into the cache."""

import dataclasses
import json

import pytest

from specrl_openrlhf.miniature import quickstart_args, warm_start
from specrl_openrlhf.miniature.task import TaskConfig
from specrl_openrlhf.miniature.warm_start import COMPLETE, DEFAULT_TASK, SHIPPED, WarmStartConfig, cache_key


def test_the_shipped_model_is_the_quickstarts_default_one():
    """Its folder is named by the cache key of the quickstart's default settings, and it is the only one shipped: a
    change to the settings, the task or `FORMAT` changes the key, and this fails until the model is built again
    (`python -m specrl_openrlhf.miniature.warm_start`, after removing the old folder)."""
    args = quickstart_args.parse_args([])
    config = WarmStartConfig(steps=args.warm_start_steps, seed=args.seeds[0])
    task = TaskConfig(train_size=args.groups[0].regime.train_size, held_out_size=args.held_out_size, seed=0)
    key = cache_key(config, task)
    assert key == cache_key(WarmStartConfig(), DEFAULT_TASK)
    assert [path.name for path in SHIPPED.iterdir()] == [key], (
        "rebuild: python -m specrl_openrlhf.miniature.warm_start"
    )
    recorded = json.loads((SHIPPED / key / COMPLETE).read_text())
    assert recorded["model"] == dataclasses.asdict(config)
    assert cache_key(WarmStartConfig(**recorded["model"]), TaskConfig(**recorded["task"])) == key
    model = json.loads((SHIPPED / key / "config.json").read_text())
    assert (model["hidden_size"], model["num_hidden_layers"]) == (config.hidden_size, config.num_layers)


def test_the_default_settings_take_the_shipped_model_and_others_are_built(tmp_path, monkeypatch):
    def build(path, config, task, progress):
        (path / "built").write_text(str(config.seed))

    monkeypatch.setattr(warm_start, "_build", build)
    monkeypatch.setattr(warm_start, "default_cache_root", lambda: tmp_path / "cache")
    assert warm_start.warm_start(WarmStartConfig(), DEFAULT_TASK) == SHIPPED / cache_key(
        WarmStartConfig(), DEFAULT_TASK
    )
    assert not (tmp_path / "cache").exists()  # nothing built
    other = warm_start.warm_start(WarmStartConfig(seed=1), TaskConfig(seed=1))
    assert other.parent == tmp_path / "cache" and (other / "built").read_text() == "1" and (other / COMPLETE).is_file()
    # a cache named by the caller is that cache: the shipped model is not taken from it
    named = warm_start.warm_start(WarmStartConfig(), DEFAULT_TASK, cache_root=tmp_path / "named")
    assert named == tmp_path / "named" / cache_key(WarmStartConfig(), DEFAULT_TASK) and (named / "built").is_file()


def test_the_shipped_model_loads_with_its_tokenizer():
    transformers = pytest.importorskip("transformers")
    folder = SHIPPED / cache_key(WarmStartConfig(), DEFAULT_TASK)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder))
    assert tokenizer.decode(tokenizer("3+4=7")["input_ids"]) == "3+4=7"
    assert sum(p.numel() for p in model.parameters()) > 0
