"""A tiny random Llama with a word-level tokenizer, saved as a model folder (no download): what
`scripts/gpu_check.sh --dry-run` runs every stage on.    python scripts/tiny_model_folder.py FOLDER"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import torch
import transformers as tf
from tokenizers import Tokenizer, models, pre_tokenizers

from model.evaluation.bench import BENCH_PROMPTS

SPECIAL = ["[PAD]", "[UNK]", "[EOS]"]


def tiny_model_folder(folder: Path, layers: int = 6, seed: int = 0) -> Path:
    """Write the model and its tokenizer (the bench prompts' words, and a few more) to ``folder``."""
    words = sorted({w for p in BENCH_PROMPTS for w in re.findall(r"\w+|[^\w\s]", p)} | {"Hello", "\n"})
    vocab = {token: index for index, token in enumerate(SPECIAL + words)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = tf.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]",
                                      eos_token="[EOS]")
    torch.manual_seed(seed)
    config = tf.LlamaConfig(vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                            pad_token_id=0, eos_token_id=2, bos_token_id=2, attn_implementation="sdpa")
    model = tf.LlamaForCausalLM(config).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("folder", type=Path)
    print(tiny_model_folder(parser.parse_args().folder))


if __name__ == "__main__":
    main()
