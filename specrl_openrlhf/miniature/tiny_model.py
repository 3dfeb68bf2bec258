"""Builds a tiny Qwen3 model and a character-level tokenizer on local disk.

Tests, the quickstart and the benchmark use it because no model hub is reachable. The shape respects what
vLLM's CPU backend accepts: head_dim 64 (16 is refused: "Unsupported CPU attention configuration").
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import torch

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
# Printable ASCII without the three rare whitespace characters: 3 specials + 97 characters = 100 ids.
CHARACTERS = [c for c in string.printable if c not in "\r\x0b\x0c"]
# The embedding table is larger than the tokenizer, as in Qwen models: ids 100..127 exist only in the model.
MODEL_VOCAB_SIZE = 128


def build_tiny_model(
    path: str | Path,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    intermediate_size: int = 256,
    embedding_scale: float = 2.0,
    eos_logit: float = 1.0,
    seed: int = 0,
) -> Path:
    """Write a random tiny Qwen3 model and its tokenizer to ``path`` and return the path.

    ``embedding_scale`` sets how peaked next-token distributions are (2.0 gives about 2 nats of entropy);
    ``eos_logit`` raises the EOS logit on typical hidden states so samples end at varied lengths.
    Existing models are left as they are, so repeated calls are cheap.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    path = Path(path)
    if (path / "config.json").exists() and (path / "model.safetensors").exists():
        return path
    path.mkdir(parents=True, exist_ok=True)

    vocab = {token: i for i, token in enumerate(list(SPECIAL_TOKENS) + CHARACTERS)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIAL_TOKENS[PAD_ID]))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    pad, bos, eos = SPECIAL_TOKENS
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token=pad, bos_token=bos, eos_token=eos).save_pretrained(
        path
    )
    # Name the class: otherwise transformers 5 may pick the model type's own tokenizer class, whose byte-level
    # pre-tokenizer drops every space and newline. (For Qwen2 it does so even then; hence a Qwen3 model.)
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_file.write_text(json.dumps(config, indent=2))

    num_heads = hidden_size // 64  # vLLM's CPU attention needs head_dim 64
    config = Qwen3Config(
        vocab_size=MODEL_VOCAB_SIZE,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(embedding_scale)
        # Point the EOS row along the mean final hidden state so its logit is about `eos_logit` on typical inputs.
        probe = torch.randint(len(SPECIAL_TOKENS), len(vocab), (32, 64))
        mean_hidden = model(probe, output_hidden_states=True).hidden_states[-1].reshape(-1, hidden_size).mean(0)
        model.model.embed_tokens.weight[EOS_ID] = mean_hidden * eos_logit / mean_hidden.norm() ** 2
    model.save_pretrained(path)
    model.generation_config.eos_token_id = EOS_ID
    model.generation_config.save_pretrained(path)
    return path
