"""The full model's judgement of SkipDecode's own text (docs/DESIGN.md, "Judging SkipDecode's own
text"): the ORIGINAL model run once, at full depth, over a prompt and the tokens SkipDecode wrote,
and its top next token at each position that produced one of them.

Exact token match by position stops meaning anything once two free-running texts part, so the
page's headline asks instead whether the full model, given SkipDecode's own prefix, would have
written the same token. These forwards run outside the timed steps (the race calls them once
SkipDecode has finished).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from model.loading import LoadedModel
from model.skipdecode.decoder import Prefill, SkipDecoder

JudgedRow = tuple[Sequence[int], Sequence[int]]  # (prompt ids, generated ids)


class FullModelJudge:
    """The original weights: ``loaded.model`` for a forward of its own, and ``full_decoder()`` (the
    generator's full-model decoder, asked at each use: ``generate --static-cache`` swaps it after
    the generator is built) to continue a prompt it read."""

    JUDGED_ROWS = 8  # rows of one judging forward: (8, positions, vocabulary) float logits stay ~100 MB

    def __init__(self, loaded: LoadedModel, full_decoder: Callable[[], SkipDecoder]) -> None:
        self.loaded = loaded
        self.full_decoder = full_decoder

    @torch.inference_mode()
    def log_probs(self, prompt_ids: Sequence[int], token_ids: Sequence[int]) -> torch.Tensor:
        """(len(token_ids), V) next-token log-probabilities of the ORIGINAL model at each position
        that produced one of ``token_ids`` (SkipDecode's own output after ``prompt_ids``), from ONE
        full-depth forward over the prompt and those tokens: the full model judged on SkipDecode's
        prefix (the lens's KL reads the same pass)."""
        if not token_ids:
            return torch.empty(0)
        prompt = list(prompt_ids)
        sequence = torch.tensor([*prompt, *token_ids[:-1]], dtype=torch.long)[None]
        logits = self.loaded.model(sequence.to(self.loaded.device)).logits[0, len(prompt) - 1:]
        return logits.float().log_softmax(-1)

    @staticmethod
    def choices(full_log_probs: torch.Tensor) -> list[int]:
        """The full model's top next token at each judged position (its greedy choice there)."""
        return full_log_probs.argmax(-1).tolist() if full_log_probs.numel() else []

    @torch.inference_mode()
    def choices_of(self, rows: Sequence[JudgedRow]) -> list[list[int]]:
        """For each (prompt ids, generated ids): the ORIGINAL model's top next token at each position
        that produced one of the generated ids (``choices`` of ``log_probs``, for many rows): a few
        full-depth forwards of JUDGED_ROWS rows, right padded (causal attention: what follows a row's
        end changes nothing before it), the head only over the generated positions."""
        choices: list[list[int]] = []
        for start in range(0, len(rows), self.JUDGED_ROWS):
            choices += self._judged_chunk(rows[start:start + self.JUDGED_ROWS])
        return choices

    @torch.inference_mode()
    def choices_after(self, prefill: Prefill, rows: Sequence[tuple[int, Sequence[int]]]) -> list[list[int]]:
        """``choices_of`` for rows of one batch whose prompts were read at full depth (``prefill``, left
        as it was): for each (row, generated ids), the ORIGINAL model's top next token at each position
        that produced one of the ids. The first comes from the prompt's own logits; the rest from ONE
        full-depth forward over the ids (but the last) that continues the prompt's cache
        (``SkipDecoder.extend``), so no prompt is read a second time. Rows are right padded (causal
        attention: what follows a row's end changes nothing before it)."""
        rows = [(row, list(ids)) for row, ids in rows]
        choices = prefill.logits.argmax(-1).tolist()  # (B,): what the full model reads the prompt to
        judged = [row for row, ids in rows if len(ids) > 1]  # the rows with positions after the first token
        best = self._continued_choices(prefill, dict(rows), judged) if judged else {}
        return [[choices[row], *best.get(row, [])[:len(ids) - 1]] if ids else [] for row, ids in rows]

    def _continued_choices(self, prefill: Prefill, by_row: dict[int, Sequence[int]], judged: list[int]
                           ) -> dict[int, list[int]]:
        """{row: the full model's top token after each of its ids but the last} for the ``judged`` rows,
        from one forward that continues ``prefill``'s cache, the head a few rows at a time."""
        width = max(len(ids) - 1 for ids in by_row.values())
        continued = torch.full((len(judged), width), self.loaded.tokenizer.pad_token_id or 0, dtype=torch.long)
        for index, row in enumerate(judged):
            tokens = by_row[row][:-1]
            continued[index, :len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        decoder = self.full_decoder()
        hidden = decoder.extend(prefill, continued.to(decoder.device), rows=judged)  # (J, width, C)
        best: dict[int, list[int]] = {}
        for start in range(0, len(judged), self.JUDGED_ROWS):  # the head a few rows at a time (J x width x V)
            logits = decoder.adapter.logits(hidden[start:start + self.JUDGED_ROWS])
            best.update(zip(judged[start:start + self.JUDGED_ROWS], logits.argmax(-1).tolist()))
        return best

    def _judged_chunk(self, rows: Sequence[JudgedRow]) -> list[list[int]]:
        sequences = [[*prompt, *tokens[:-1]] for prompt, tokens in rows]
        width = max(len(sequence) for sequence in sequences)
        ids = torch.full((len(rows), width), self.loaded.tokenizer.pad_token_id or 0, dtype=torch.long)
        for index, sequence in enumerate(sequences):
            ids[index, :len(sequence)] = torch.tensor(sequence, dtype=torch.long)
        first = min(len(prompt) for prompt, _ in rows) - 1  # the earliest position any row is judged at
        keep = torch.arange(first, width)
        try:  # the head over the judged positions only (transformers' logits_to_keep)
            logits = self.loaded.model(ids.to(self.loaded.device), logits_to_keep=keep.to(self.loaded.device)).logits
        except TypeError:  # a family without logits_to_keep: every position's logits
            logits = self.loaded.model(ids.to(self.loaded.device)).logits[:, first:]
        best = logits.argmax(-1).tolist()  # (B, width - first)
        return [best[index][len(prompt) - 1 - first:len(prompt) - 1 - first + len(tokens)]
                for index, (prompt, tokens) in enumerate(rows)]
