"""The tiny model's character tokenizer round-trips every character, whitespace included."""

import pytest


def test_tokenizer_keeps_spaces_and_newlines(tiny_model_dir):
    from transformers import AutoTokenizer

    from specrl_openrlhf.miniature.tiny_model import CHARACTERS, EOS_ID

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    text = "7+5=12\n12+9=21\n\\boxed{21} with spaces\tand tabs"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text) and tokenizer.decode(ids) == text
    assert tokenizer.decode(tokenizer("".join(CHARACTERS), add_special_tokens=False)["input_ids"]) == "".join(
        CHARACTERS
    )
    assert tokenizer.eos_token_id == EOS_ID


@pytest.mark.engine
def test_vllm_detokenizes_whitespace(async_engine):
    tokenizer = async_engine[0].tokenizer
    ids = tokenizer("a\nb c", add_special_tokens=False)["input_ids"]
    assert len(ids) == 5 and tokenizer.decode(ids) == "a\nb c"
