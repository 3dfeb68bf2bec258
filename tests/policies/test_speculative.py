"""vLLM's own speculation as rules (`vllm`, `suffix`, `ngram`): their configs, checked before any engine starts."""

import pytest

import specrl_openrlhf as sr
from specrl_openrlhf.config import ReuseConfig
from specrl_openrlhf.policies.speculative import SpeculativeConfigError


def test_the_short_names_fill_in_vllms_settings():
    suffix, ngram = sr.make("suffix"), sr.make("ngram")
    assert suffix.engine_arguments()["speculative_config"] == {"method": "suffix", "num_speculative_tokens": 24}
    assert ngram.engine_arguments()["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 8}
    assert suffix.verifies_in_engine and suffix.draft_age == 0 and not suffix.needs_scores
    config = {"method": "suffix", "suffix_decoding_max_cached_requests": 308}
    assert sr.make("suffix", speculative_config=config).params.speculative_config["num_speculative_tokens"] == 24
    eagle = {"method": "eagle", "model": "some/draft", "num_speculative_tokens": 3}
    assert sr.make("vllm", speculative_config=eagle).engine_arguments()["speculative_config"] == eagle


@pytest.mark.parametrize(
    "rule, config, message",
    [
        ("suffix", {"method": "suffix", "suffix_decoding_max_tree_dept": 8}, "suffix_decoding_max_tree_dept"),
        ("suffix", {"method": "ngram"}, "use --rollout_reuse vllm"),
        ("suffix", {"method": "suffix", "suffix_decoding_min_token_prob": 2.0}, "suffix_decoding_min_token_prob"),
        ("ngram", {"method": "ngram", "prompt_lookup_min": 5, "prompt_lookup_max": 2}, "prompt_lookup_min"),
        ("ngram", {"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
        ("ngram", {"method": "ngram", "prompt_lookup_max": "5"}, "prompt_lookup_max must be an integer"),
        ("vllm", {"num_speculative_tokens": 3}, 'a "method"'),
        ("vllm", "suffix", 'a "method"'),
    ],
)
def test_a_bad_config_names_its_key(rule, config, message):
    with pytest.raises(SpeculativeConfigError, match=message):
        sr.make(rule, speculative_config=config)


def test_the_command_line_refuses_a_bad_config_before_anything_starts():
    config = ReuseConfig(policy="suffix", params={"speculative_config": {"suffix_decoding_max_cached_request": 1}})
    with pytest.raises(ValueError, match="suffix_decoding_max_cached_request"):
        config.build_policy()  # where OpenRLHF's command and the quickstart check our flags, before Ray starts
    assert ReuseConfig(policy="suffix").build_policy().describe().startswith("suffix(")


def test_keys_vllm_does_not_know_are_named_where_vllm_can_tell():
    pytest.importorskip("vllm")
    from specrl_openrlhf.integration.vllm.engine_args import engine_kwargs

    with pytest.raises(SpeculativeConfigError, match="draft_modle"):
        engine_kwargs(sr.make("vllm", speculative_config={"method": "eagle", "draft_modle": "x"}))


def test_suffix_decoding_without_its_suffix_tree_names_the_install(monkeypatch):
    pytest.importorskip("vllm")
    import importlib.util

    from specrl_openrlhf.integration.vllm import engine_args

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "arctic_inference" else real(name)
    )
    with pytest.raises(SpeculativeConfigError, match="build_suffix_tree.sh"):
        engine_args.engine_kwargs(sr.make("suffix"))
    assert engine_args.engine_kwargs(sr.make("ngram"))["speculative_config"]["method"] == "ngram"


def test_suffix_names_which_of_vllms_two_suffix_decodings_it_means():
    """`engine=v1`: vLLM <= 0.33's (arctic-inference's trees, k = depth); `engine=v2`: vLLM 0.34's GPU speculator
    (k = min(8, depth), its corpus's size a key of its own, adaptive verification on request); `auto`: the installed
    vLLM's, and the engines get today's config; adaptive verification auto by default (where the engine can)."""
    from specrl_openrlhf.config import parse_rule
    from specrl_openrlhf.policies.base import EngineTarget
    from specrl_openrlhf.policies.speculative import installed_vllm, resolve_engine

    today = parse_rule("suffix")
    assert today.params.engine == "auto" and today.params.adaptive == "auto"
    assert today.engine_arguments()["speculative_config"] == {"method": "suffix", "num_speculative_tokens": 24}
    assert today.params.runs_on == resolve_engine("auto", installed_vllm())
    v2 = parse_rule("suffix,engine=v2,adaptive=on")
    eager_v2 = EngineTarget(runner="v2")  # adaptive=on asks for it even where the engine can't: refused at start-up
    assert v2.params.runs_on == "v2" and v2.engine_arguments(eager_v2)["speculative_config"] == {
        "method": "suffix",
        "num_speculative_tokens": 8,
        "enable_adaptive_verification": True,
    }
    deep = {"method": "suffix", "suffix_decoding_max_tree_depth": 4, "suffix_decoding_corpus_tokens": 4096}
    assert sr.make("suffix", engine="v2", speculative_config=deep).params.speculative_config == {
        **deep,
        "num_speculative_tokens": 4,
    }
    assert parse_rule("suffix,engine=v1").params.speculative_config["num_speculative_tokens"] == 24
    assert (resolve_engine("auto", (0, 33)), resolve_engine("auto", (0, 34)), resolve_engine("auto", (1, 0))) == (
        "v1",
        "v2",
        "v2",
    )
    assert resolve_engine("v1", (0, 34)) == "v1"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"engine": "v3"}, "engine must be one of 'auto', 'v1', 'v2'"),
        ({"engine": "v1", "adaptive": "on"}, "adaptive=on is vLLM 0.34's"),
        ({"engine": "v2", "adaptive": "yes"}, "adaptive must be one of 'auto', 'on', 'off'"),
        (
            {"engine": "v1", "speculative_config": {"method": "suffix", "suffix_decoding_corpus_tokens": 5}},
            "suffix_decoding_corpus_tokens' is vLLM 0.34's .*engine=v2",
        ),
    ],
)
def test_a_suffix_engine_that_cannot_be_is_named(kwargs, message):
    with pytest.raises((SpeculativeConfigError, ValueError), match=message):
        sr.make("suffix", **kwargs)


def test_doctests():
    import doctest

    from specrl_openrlhf.policies import speculative

    assert doctest.testmod(speculative).failed == 0
