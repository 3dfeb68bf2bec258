"""What a corpus is recorded from (`miniature.corpus_sources`): the policies by name and a temperature folded in."""

import dataclasses

import pytest
import torch

from specrl_openrlhf.miniature import corpus_sources


def test_an_unknown_policy_is_one_error_naming_the_known_ones():
    @dataclasses.dataclass
    class Settings:
        policy: str = "gpt"

    with pytest.raises(ValueError, match=r"corpus policy must be one of \('smollm2', 'tiny'\), got 'gpt'"):
        corpus_sources.source(Settings())


def test_a_temperature_is_folded_into_the_final_norm_and_1_leaves_the_model_as_it_is(
    tiny_model_dir, monkeypatch, tmp_path
):
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert corpus_sources.sharpened(tiny_model_dir, 1.0) == tiny_model_dir
    with pytest.raises(ValueError, match=r"temperature must be in \(0, 1\]"):
        corpus_sources.sharpened(tiny_model_dir, 1.5)
    folded = corpus_sources.sharpened(tiny_model_dir, 0.5)
    assert folded.parent == tmp_path / "specrl_openrlhf" / "sharpened" and (folded / "tokenizer.json").is_file()
    before, after = (AutoModelForCausalLM.from_pretrained(str(d)) for d in (tiny_model_dir, folded))
    torch.testing.assert_close(after.model.norm.weight, before.model.norm.weight / 0.5)
