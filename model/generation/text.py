"""The model's text in and out: prompts through the chat template to token ids, ids back to text.

The decoder below only sees token ids; everything that needs the tokenizer lives here, so the
rules of turning a visitor's text into what the model reads are found in one place: the chat
template (or raw text), special-token strings a user types kept as plain text (a prompt cannot
forge system or assistant turns), left padding, detokenizing and stop strings.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import torch

from model.loading import LoadedModel
from model.skipdecode.decoder import left_padded


class TextCodec:
    """One model's tokenizer and chat template, speaking text both ways."""

    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded
        self._special_strings: tuple[str, ...] | None = None  # found on first use (see _mentions_special_token)

    # --- prompts in -----------------------------------------------------------------------
    def format_prompt(self, prompt: str, raw: bool = False) -> str:
        """The prompt as the model reads it: inside the chat template as the user's turn, unless
        ``raw`` or the model has no template."""
        if raw or not self.loaded.has_chat_template:
            return prompt
        messages = [{"role": "user", "content": prompt}]
        return self.loaded.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    @functools.cached_property
    def template_around_user(self) -> tuple[list[int], list[int]]:
        """The chat template's token ids before the user's text (system turn, user header) and
        after it (end of turn, assistant header): found by formatting a marker message, so they
        hold for any model's template; ([], []) without one."""
        if not self.loaded.has_chat_template:
            return [], []
        marker = "\ue000"
        before, after = self.format_prompt(marker).split(marker, 1)
        tokenize = self.loaded.tokenizer
        return tokenize(before, add_special_tokens=False)["input_ids"], tokenize(after, add_special_tokens=False)["input_ids"]

    @property
    def template_tail_tokens(self) -> int:
        """How many tokens the chat template puts after the user's text."""
        return len(self.template_around_user[1])

    def encode(self, prompts: Sequence[str], raw: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded (B, P) ids and mask. Special-token strings a user types (``<|im_start|>``)
        stay plain text: a prompt cannot forge system or assistant turns."""
        validate_prompts(prompts)
        return self.padded(prompts, raw)

    def padded(self, prompts: Sequence[str], raw: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """``encode`` of prompts already checked (``validate_request``): left-padded (B, P) ids and mask."""
        return left_padded(self.token_rows(prompts, raw), self.loaded.pad_token_id)

    def token_rows(self, prompts: Sequence[str], raw: bool = False) -> list[list[int]]:
        """Each prompt's token ids as the model reads it (the chat template around it, unless ``raw``)."""
        rows = [self._encode_one(p, raw) for p in prompts]
        if any(not row for row in rows):
            raise ValueError("a prompt encodes to zero tokens")
        return rows

    def _encode_one(self, prompt: str, raw: bool) -> list[int]:
        tokenizer = self.loaded.tokenizer
        # Chat templates already carry the special tokens; raw text gets the tokenizer's default.
        add_special = raw or not self.loaded.has_chat_template
        if not self._mentions_special_token(prompt):
            return tokenizer(self.format_prompt(prompt, raw), add_special_tokens=add_special)["input_ids"]
        # The template's own parts keep their special tokens; the user's text is split plainly.
        plain = tokenizer(prompt, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        if add_special:
            return tokenizer.build_inputs_with_special_tokens(plain)
        before, after = self.template_around_user
        return before + plain + after

    def _mentions_special_token(self, text: str) -> bool:
        special = self._special_strings
        if special is None:  # once per model: the tokenizer's added and special tokens as text
            tokenizer = self.loaded.tokenizer
            decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
            special = self._special_strings = tuple(
                {str(getattr(t, "content", t)) for t in decoder.values()} | set(tokenizer.all_special_tokens))
        return any(token and token in text for token in special)

    def prompt_tokens(self, ids: Sequence[int], raw: bool = False) -> tuple[list[str], int]:
        """A prompt's token ids as text, and how many lead the user's text: the chat template's system
        turn and user header, or (``raw``, or no template) the leading special tokens (BOS). A view of
        the prompt shows the rest."""
        ids = list(ids)
        if self.loaded.has_chat_template and not raw:
            head = len(self.template_around_user[0])
        else:
            special = set(self.loaded.tokenizer.all_special_ids)
            head = next((i for i, token in enumerate(ids) if token not in special), len(ids))
        return [self.token_text(t) for t in ids], min(head, len(ids))

    def shares_tokenizer(self, tokenizer: object) -> bool:
        """Whether ``tokenizer`` turns every prompt into the ids this model's does (the same
        vocabulary, special tokens and chat template): a task model fine-tuned from this one's does."""
        return same_tokenizer(self.loaded.tokenizer, tokenizer)

    # --- text out -------------------------------------------------------------------------
    def token_text(self, token_id: int) -> str:
        return self.loaded.tokenizer.decode([token_id])

    def decode_text(self, token_ids: Sequence[int], stop: Sequence[str] = ()) -> str:
        """Generated ids as text, special tokens left out, cut before the first stop string."""
        text = self.loaded.tokenizer.decode(list(token_ids), skip_special_tokens=True)
        return truncate_at_stop(text, stop)

    def stop_check(self, stop: Sequence[str]) -> Callable[[int, list[int]], bool] | None:
        """The decoder's per-row test for a stop string in the text so far (None: no stop strings);
        it decodes only the row's last tokens, enough to hold any of them."""
        if not stop:
            return None
        tail = max(len(s) for s in stop) + 16  # tokens: enough to contain any stop string

        def check(row: int, ids: list[int]) -> bool:
            text = self.loaded.tokenizer.decode(ids[-tail:], skip_special_tokens=True)
            return any(s in text for s in stop)

        return check


def truncate_at_stop(text: str, stop: Sequence[str]) -> str:
    cut = min((text.find(s) for s in stop if s and s in text), default=-1)
    return text[:cut] if cut >= 0 else text


def validate_prompts(prompts: Sequence[str]) -> None:
    if isinstance(prompts, str) or not prompts:
        raise ValueError("give at least one prompt")
    for index, prompt in enumerate(prompts):
        if not isinstance(prompt, str):
            raise ValueError(f"prompt {index + 1} must be text; got {type(prompt).__name__}")
        if not prompt.strip():
            raise ValueError(f"prompt {index + 1} is empty: type something to continue")


def same_tokenizer(first: Any, second: Any) -> bool:
    """Two tokenizers that give every prompt the same ids: the same vocabulary, special tokens and
    chat template (compared by content: a copy saved to another folder is the same)."""
    if first is second:
        return True
    return (first.get_vocab() == second.get_vocab() and first.all_special_tokens == second.all_special_tokens
            and getattr(first, "chat_template", None) == getattr(second, "chat_template", None))
