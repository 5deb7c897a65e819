"""Text in, text out: prompts -> schedule -> SkipDecoder -> texts and figures.

This is the layer the CLI and the UI call. It owns prompt encoding (chat template or raw),
stop strings and the choice of schedule; the decoder below it only sees token ids.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Callable, Generator, Sequence

import torch

from model.common.checks import check_int, check_number
from model.loading import LoadedModel
from model.skipdecode.decoder import (
    DecodeResult,
    Prefill,
    SamplingConfig,
    SkipDecoder,
    StepEvent,
    left_padded,
    run_to_end,
    shared_prefix_padded,
)
from model.skipdecode.schedule import (
    RANKED,
    ScheduleConfig,
    SolvedSchedule,
    SpeedupSummary,
    default_warmup,
    evaluate_schedule,
    full_schedule,
    schedule_json,
    solve_schedule,
    speedup_reachable,
    speedup_summary,
)

SCHEDULE_CACHE_SIZE = 256  # solved schedules kept per generator (see TextGenerator.schedule_for)


@dataclass(frozen=True)
class ScheduleRequest:
    """How the user asked for a schedule: a target layer speedup, or explicit min/max layers."""

    target_speedup: float = 2.0
    decay: str = "linear"
    warmup: int | None = None  # None: the adapter's trained placement (or default_warmup(L))
    min_layers: int | None = None
    max_layers: int | None = None
    decay_length: int | None = None  # default: max_new_tokens
    # the least layers a step runs (the solver keeps the target); None: the skip policy's own floor
    min_layers_floor: int | None = None
    # the steps the target speedup averages over; None: the decode steps (max_new_tokens - 1). A task
    # sets its decay length: its speedup holds over a typical output, as its policies were trained
    speedup_steps: int | None = None
    order: str | None = None  # None: the adapter's trained order (ranked ones bring their ranking)
    prompt_at_full_depth: bool = True
    full: bool = False  # the full model (n_k = L) through the same decoder
    skip_policy: bool = True  # False: the untouched model skips layers (no adapter, no bridge)


@dataclass(frozen=True)
class LensReading:
    """What the hidden state after ``layer`` would predict through the final norm and head."""

    layer: int
    token_ids: list[int]  # top-k, most likely first
    tokens: list[str]
    probs: list[float]

    def top1(self) -> dict:
        return {"layer": self.layer, "token_id": self.token_ids[0], "token": self.tokens[0], "prob": self.probs[0]}


@dataclass(frozen=True)
class GenerationRequest:
    prompts: tuple[str, ...]
    schedule: ScheduleRequest = ScheduleRequest()
    max_new_tokens: int = 64
    sampling: SamplingConfig = SamplingConfig()
    raw: bool = False  # True: no chat template
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class PreparedRun:
    """A request as ``TextGenerator.prepare`` returns it: checked (``validate_request``), its prompts
    tokenized and left padded, the prompt plus ``max_new_tokens`` checked against the model's context,
    and its schedule solved over the decode steps. ``TextGenerator.stream`` runs it without checking
    or tokenizing again; ``with_schedule`` gives the same tokens under another schedule. ``schedule``
    is None after ``prepare(solve=False)``, which only checked the schedule (an admission check):
    such a run cannot be streamed."""

    request: GenerationRequest
    ids: torch.Tensor  # (B, P) left padded (after the shared prefix, where there is one)
    mask: torch.Tensor  # (B, P)
    schedule: SolvedSchedule | None
    shared_prefix: int = 0  # the first columns every row shares, read once (``prepare(share_prefix=True)``)

    @property
    def batch(self) -> int:
        return int(self.ids.shape[0])

    @property
    def prompt_width(self) -> int:
        """P: the longest row's prompt tokens (every row is padded to it)."""
        return int(self.ids.shape[1])

    @property
    def longest_prompt(self) -> int:
        return int(self.mask.sum(-1).max())

    @property
    def positions(self) -> int:
        """The KV-cache positions one stream of this run fills: batch x (P + max_new_tokens)."""
        return self.batch * (self.prompt_width + self.request.max_new_tokens)

    def prompt_ids(self, row: int = 0) -> list[int]:
        """Row ``row``'s prompt token ids, padding left out."""
        return self.ids[row][self.mask[row].bool()].tolist()


@dataclass
class GenerationResult:
    model: str
    device: str
    dtype: str
    adapter: str | None  # the skip-policy adapter SkipDecode ran with (None: untouched model)
    weights: str  # "float", "int8" or "int4" (model/lowbit/quantization.py)
    num_layers: int
    prompts: list[str]
    outputs: list[str]
    schedule: SolvedSchedule
    decode: DecodeResult
    speedups: SpeedupSummary  # planned and achieved (early EOS shortens the steps that ran)

    @property
    def layers_per_step(self) -> list[int]:
        return self.decode.layers_per_step

    def to_json(self) -> dict:
        return {
            "model": self.model,
            "device": self.device,
            "dtype": self.dtype,
            "weights": self.weights,
            "adapter": self.adapter,
            "num_layers": self.num_layers,
            "prompts": self.prompts,
            "outputs": self.outputs,
            "finish_reasons": self.decode.finish_reasons,
            "generated_tokens": [len(row) for row in self.decode.tokens],
            "prefill_layers": list(self.decode.prefill_layers),
            "layers_per_step": self.layers_per_step,
            **self.speedups.to_json(),
            "target_speedup": self.schedule.target_speedup,
            "schedule": schedule_json(self.schedule.config),
            "tokens_per_second": round(self.decode.tokens_per_second, 3),
            "seconds": round(self.decode.total_seconds, 4),
            "prefill_seconds": round(self.decode.prefill_seconds, 4),
        }


class TextGenerator:
    """SkipDecode over a LoadedModel, speaking text."""

    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded
        # The full model is always the ORIGINAL weights; SkipDecode runs the skip policy.
        self.full_decoder = loaded.full_decoder()
        self.skip_decoder = loaded.skip_decoder()
        self.cost = loaded.cost_model()
        # The solver scores every (max, min) pair in pure Python (~0.25 s for 30 layers); the
        # page asks again on every control change, so answers for the same inputs are kept.
        self._schedules: dict[tuple[ScheduleRequest, int], SolvedSchedule] = {}

    @property
    def num_layers(self) -> int:
        return self.full_decoder.num_layers

    @property
    def default_warmup(self) -> int:
        """The warmup the skip policy was trained with (the study's placement), else a default."""
        return int(self.loaded.skip_policy.get("warmup", default_warmup(self.num_layers)))

    @property
    def default_order(self) -> str:
        """The layer order the skip policy was trained with, else warmup_top."""
        return str(self.loaded.skip_policy.get("order", "warmup_top"))

    def default_floor(self, target_speedup: float, decay: str, warmup: int | None = None) -> int | None:
        """The least layers per step the skip policy's measured default shape keeps at this
        speedup (``schedule_floor`` in its training_info.json, set by ``export-adapter
        --schedule-floor``), or None: the solver's own shape. Only for the linear decay and up to
        the speedup the floor was measured at, and only where the floor can still reach it (with
        ``warmup``, default the policy's)."""
        rule = self.loaded.skip_policy.get("schedule_floor")
        if not rule or decay != "linear" or target_speedup > float(rule["up_to_speedup"]) + 1e-9:
            return None
        layers = int(rule["layers"])
        reachable = layers <= self.num_layers and speedup_reachable(self.num_layers, target_speedup,
                                                                     self.default_warmup if warmup is None else warmup,
                                                                     layers)
        return layers if reachable else None

    def ranking_for(self, order: str) -> tuple[int, ...]:
        """The adapter's layer ranking for order "ranked" (measured importance, most important
        first); () for the other orders. A ranked order with no trained ranking is refused."""
        if order != RANKED:
            return ()
        ranking = tuple(int(i) for i in self.loaded.skip_policy.get("ranking", ()))
        if not ranking:
            raise ValueError("order 'ranked' needs a layer ranking: use an adapter trained with --order ranked")
        return ranking

    @property
    def max_context(self) -> int:
        return self.full_decoder.adapter.max_context

    def decoder_for(self, request: ScheduleRequest) -> SkipDecoder:
        """The original weights for the full model and for skipping without the skip policy;
        the skip policy's weights (merged adapter, bridge) for SkipDecode."""
        return self.full_decoder if request.full or not request.skip_policy else self.skip_decoder

    # --- schedule -------------------------------------------------------------------------
    def schedule_for(self, request: ScheduleRequest, max_new_tokens: int) -> SolvedSchedule:
        """The SolvedSchedule a request asks for, evaluated over the decode steps that will run
        (kept per (request, max_new_tokens): the inputs are frozen, the answer is pure)."""
        key = (request, max_new_tokens)
        solved = self._schedules.get(key)  # one lookup: request threads share the dict
        if solved is None:
            solved = self._solve(request, max_new_tokens)
            if len(self._schedules) >= SCHEDULE_CACHE_SIZE:
                self._schedules.clear()
            self._schedules[key] = solved
        return solved

    def _solve(self, request: ScheduleRequest, max_new_tokens: int) -> SolvedSchedule:
        num_layers = self.num_layers
        decode_steps = max(1, max_new_tokens - 1)  # the prefill produces the first token
        decay_length = request.decay_length if request.decay_length is not None else max_new_tokens
        if request.full:
            return evaluate_schedule(full_schedule(num_layers, decay_length), decode_steps, self.cost, 1.0)
        warmup = request.warmup if request.warmup is not None else self.default_warmup
        order = request.order or self.default_order
        common = dict(
            decay=request.decay,
            warmup=warmup,
            decay_length=decay_length,
            order=order,
            ranking=self.ranking_for(order),
            prompt_at_full_depth=request.prompt_at_full_depth,
        )
        if request.min_layers is not None or request.max_layers is not None:
            config = ScheduleConfig(
                num_layers=num_layers,
                max_layers=request.max_layers if request.max_layers is not None else num_layers,
                min_layers=request.min_layers if request.min_layers is not None else warmup + 1,
                **common,
            )
            return evaluate_schedule(config, decode_steps, self.cost)
        floor = request.min_layers_floor
        if floor is None and request.skip_policy:
            floor = self.default_floor(request.target_speedup, request.decay, warmup)
        steps = request.speedup_steps if request.speedup_steps is not None else decode_steps
        return solve_schedule(num_layers, request.target_speedup, num_steps=steps, cost=self.cost,
                              min_layers_floor=floor, **common)

    # --- prompts --------------------------------------------------------------------------
    def format_prompt(self, prompt: str, raw: bool = False) -> str:
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
        return self._encoded(prompts, raw)

    def _encoded(self, prompts: Sequence[str], raw: bool) -> tuple[torch.Tensor, torch.Tensor]:
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
        special = getattr(self, "_special_strings", None)
        if special is None:
            tokenizer = self.loaded.tokenizer
            decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
            special = self._special_strings = tuple(
                {str(getattr(t, "content", t)) for t in decoder.values()} | set(tokenizer.all_special_tokens))
        return any(token and token in text for token in special)

    # --- generation -----------------------------------------------------------------------
    def prepare(self, request: GenerationRequest, solve: bool = True,
                limits: Callable[[PreparedRun], None] | None = None, share_prefix: bool = False) -> PreparedRun:
        """Check the request, solve its schedule, tokenize and check the context, once (ValueError
        names what is wrong). ``solve=False`` (an admission check, in milliseconds): the schedule
        is only checked (``check_schedule``), not solved for the run, and the PreparedRun has none.
        ``limits``: a caller's own limits on the tokenized run (a server's sizes), checked before
        the model's context, so a prompt over both is refused by the caller's limit.
        ``share_prefix``: the tokens every prompt begins with (the chat template's system turn, for a
        class's prompts) are laid out once and read once (``shared_prefix_padded``); a row's text is
        the same up to the float rounding of a differently shaped prefill."""
        validate_request(request)
        if solve:
            schedule: SolvedSchedule | None = self.schedule_for(request.schedule, request.max_new_tokens)
        else:
            self.check_schedule(request.schedule, request.max_new_tokens)
            schedule = None
        return self.sized(request, limits, schedule, share_prefix)

    def sized(self, request: GenerationRequest, limits: Callable[[PreparedRun], None] | None = None,
              schedule: SolvedSchedule | None = None, share_prefix: bool = False) -> PreparedRun:
        """The request tokenized and checked against ``limits`` and the model's context, its schedule
        not looked at: what a server needs to know of a job's size, from any model that shares this
        one's tokenizer (a task's model that is not loaded yet: ``shares_tokenizer``)."""
        if share_prefix:
            ids, mask, prefix = shared_prefix_padded(self.token_rows(request.prompts, request.raw), self.loaded.pad_token_id)
        else:
            (ids, mask), prefix = self._encoded(request.prompts, request.raw), 0
        run = PreparedRun(request=request, ids=ids, mask=mask, schedule=schedule, shared_prefix=prefix)
        if limits is not None:
            limits(run)
        if ids.shape[1] + request.max_new_tokens > self.max_context:
            raise ValueError(
                f"the prompt is {ids.shape[1]} tokens; with max_new_tokens {request.max_new_tokens} that exceeds "
                f"the model's context of {self.max_context} tokens"
            )
        return run

    def shares_tokenizer(self, tokenizer: object) -> bool:
        """Whether ``tokenizer`` turns every prompt into the ids this model's does (the same
        vocabulary, special tokens and chat template): a task model fine-tuned from this one's does."""
        return same_tokenizer(self.loaded.tokenizer, tokenizer)

    def check_schedule(self, request: ScheduleRequest, max_new_tokens: int) -> None:
        """The solver's verdict on a schedule request in milliseconds: the same request (its decay
        length fixed to what the run's would be) solved over one decode step, which refuses exactly
        what the run's solve would (ValueError)."""
        decay_length = request.decay_length or max_new_tokens
        self.schedule_for(replace(request, decay_length=decay_length), 2)

    def with_schedule(self, run: PreparedRun, schedule: ScheduleRequest) -> PreparedRun:
        """The same prompts (no second tokenization) under another schedule: the full model beside SkipDecode."""
        request = replace(run.request, schedule=schedule)
        return replace(run, request=request, schedule=self.schedule_for(schedule, request.max_new_tokens))

    def stream(
        self, request: GenerationRequest | PreparedRun, should_cancel: Callable[[], bool] | None = None,
        trace_row: int | None = None, prefilled: Prefill | None = None,
    ) -> Generator[StepEvent, None, GenerationResult]:
        """One StepEvent per step (with ``trace_row``: that row's hidden states after each layer
        that ran, for ``lens``); returns the GenerationResult. A PreparedRun is not checked again.
        ``prefilled``: its prompts already read (``shared_prefill``; this stream's own copy)."""
        run = request if isinstance(request, PreparedRun) else self.prepare(request)
        request, schedule = run.request, run.schedule
        if schedule is None:
            raise ValueError("this PreparedRun was only checked (prepare(solve=False)): prepare it to run it")
        decode = yield from self.decoder_for(request.schedule).stream(
            run.ids,
            run.mask,
            schedule.config,
            max_new_tokens=request.max_new_tokens,
            sampling=request.sampling,
            stop_check=self._stop_check(request.stop),
            should_cancel=should_cancel,
            trace_row=trace_row,
            prefilled=prefilled,
            shared_prefix=run.shared_prefix,
        )
        loaded = self.loaded
        return GenerationResult(
            model=loaded.name,
            device=str(loaded.device),
            dtype=str(loaded.dtype).replace("torch.", ""),
            weights=loaded.weights,
            adapter=loaded.adapter_path if not request.schedule.full and request.schedule.skip_policy else None,
            num_layers=self.num_layers,
            prompts=list(request.prompts),
            outputs=[self.decode_text(row, request.stop) for row in decode.tokens],
            schedule=schedule,
            decode=decode,
            speedups=speedup_summary(schedule, decode.layers_per_step, self.cost),
        )

    def generate(self, request: GenerationRequest) -> GenerationResult:
        return run_to_end(self.stream(request))

    def shared_prefill(self, first: PreparedRun, second: PreparedRun,
                       should_cancel: Callable[[], bool] | None = None) -> Prefill | None:
        """The prompts of two runs of the same tokens (``with_schedule``: SkipDecode and the full model)
        read ONCE, where both read them alike: at full depth (the default: the prompt at full depth)
        with the same original weights. None where they read them differently (the prompt at the
        first step's budget, a static decoder's own buffers). Raises Cancelled as a prefill does."""
        if first.schedule is None or second.schedule is None or first.ids is not second.ids:
            return None
        layers = first.schedule.config.prefill_layers()
        if layers != second.schedule.config.prefill_layers() or len(layers) != self.num_layers:
            return None
        decoder = self.decoder_for(first.request.schedule)
        if not decoder.reads_prompts_as(self.decoder_for(second.request.schedule)):
            return None
        return decoder.read_prompt(first.ids, first.mask, first.schedule.config, first.request.max_new_tokens,
                                   should_cancel, first.shared_prefix)

    @torch.inference_mode()
    def lens(self, trace: Sequence[tuple[int, torch.Tensor]], request: ScheduleRequest, top_k: int = 5) -> list[LensReading]:
        """A logit lens over the layers one position ran: each traced hidden state through the
        final norm and the LM head of the weights that ran it -> its top-k next tokens."""
        if not trace:
            return []
        top = self._lens_log_probs(trace, request).exp().topk(top_k, dim=-1)
        readings = []
        for (layer, _), values, ids in zip(trace, top.values.tolist(), top.indices.tolist()):
            readings.append(LensReading(layer=layer, token_ids=ids, tokens=[self.token_text(i) for i in ids],
                                        probs=[round(v, 4) for v in values]))
        return readings

    @torch.inference_mode()
    def full_model_log_probs(self, run: PreparedRun, token_ids: Sequence[int], row: int = 0) -> torch.Tensor:
        """(len(token_ids), V) next-token log-probabilities of the ORIGINAL model at each position
        that produced one of ``token_ids`` (SkipDecode's own output for ``row`` of ``run``), from ONE
        full-depth forward over that row's prompt (the run's ids) and those tokens: the full model
        judged on SkipDecode's prefix."""
        if not token_ids:
            return torch.empty(0)
        prompt = run.prompt_ids(row)
        sequence = torch.tensor([*prompt, *token_ids[:-1]], dtype=torch.long)[None]
        logits = self.loaded.model(sequence.to(self.loaded.device)).logits[0, len(prompt) - 1:]
        return logits.float().log_softmax(-1)

    JUDGED_ROWS = 8  # rows of one judging forward: (8, positions, vocabulary) float logits stay ~100 MB

    @torch.inference_mode()
    def full_model_choices_of(self, rows: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[list[int]]:
        """For each (prompt ids, generated ids): the ORIGINAL model's top next token at each position
        that produced one of the generated ids (``full_model_choices`` of ``full_model_log_probs``, for
        many rows): a few full-depth forwards of JUDGED_ROWS rows, right padded (causal attention: what
        follows a row's end changes nothing before it), the head only over the generated positions."""
        choices: list[list[int]] = []
        for start in range(0, len(rows), self.JUDGED_ROWS):
            choices += self._judged_chunk(rows[start:start + self.JUDGED_ROWS])
        return choices

    @torch.inference_mode()
    def full_model_choices_after(self, prefill: Prefill, rows: Sequence[tuple[int, Sequence[int]]]) -> list[list[int]]:
        """``full_model_choices_of`` for rows of one batch whose prompts were read at full depth
        (``prefill``, left as it was): for each (row, generated ids), the ORIGINAL model's top next token
        at each position that produced one of the ids. The first comes from the prompt's own logits;
        the rest from ONE full-depth forward over the ids (but the last) that continues the prompt's
        cache (``SkipDecoder.extend``), so no prompt is read a second time. Rows are right padded
        (causal attention: what follows a row's end changes nothing before it)."""
        rows = [(row, list(ids)) for row, ids in rows]
        choices = prefill.logits.argmax(-1).tolist()  # (B,): what the full model reads the prompt to
        judged = [row for row, ids in rows if len(ids) > 1]  # the rows with positions after the first token
        best: dict[int, list[int]] = {}
        if judged:
            width = max(len(ids) - 1 for _, ids in rows)
            continued = torch.full((len(judged), width), self.loaded.tokenizer.pad_token_id or 0, dtype=torch.long)
            by_row = dict(rows)
            for index, row in enumerate(judged):
                tokens = by_row[row][:-1]
                continued[index, :len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            decoder = self.full_decoder
            hidden = decoder.extend(prefill, continued.to(decoder.device), rows=judged)  # (J, width, C)
            for start in range(0, len(judged), self.JUDGED_ROWS):  # the head a few rows at a time (J x width x V)
                logits = decoder.adapter.logits(hidden[start:start + self.JUDGED_ROWS])
                best.update(zip(judged[start:start + self.JUDGED_ROWS], logits.argmax(-1).tolist()))
        return [[choices[row], *best.get(row, [])[:len(ids) - 1]] if ids else [] for row, ids in rows]

    def _judged_chunk(self, rows: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[list[int]]:
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

    def prompt_tokens(self, run: PreparedRun, row: int = 0) -> tuple[list[str], int]:
        """Row ``row``'s prompt tokens as text (the run's ids), and how many lead the user's text: the
        chat template's system turn and user header, or without a template the leading special
        tokens (BOS). A view of the prompt shows the rest."""
        ids = run.prompt_ids(row)
        if self.loaded.has_chat_template and not run.request.raw:
            head = len(self.template_around_user[0])
        else:
            special = set(self.loaded.tokenizer.all_special_ids)
            head = next((i for i, token in enumerate(ids) if token not in special), len(ids))
        return [self.token_text(t) for t in ids], min(head, len(ids))

    def full_model_choices(self, full_log_probs: torch.Tensor) -> list[int]:
        """The full model's top next token at each judged position (its greedy choice there)."""
        return full_log_probs.argmax(-1).tolist() if full_log_probs.numel() else []

    def lens_kl(self, traces: Sequence[Sequence[tuple[int, torch.Tensor]]], full_log_probs: torch.Tensor,
                request: ScheduleRequest) -> list[dict[int, float]]:
        """Per generated token t (of one row): {layer: KL(full model || lens after that layer)} at
        the position that produced t; ``full_log_probs`` from full_model_log_probs over the same
        tokens, so both sides see the same prefix."""
        result = []
        for t in range(min(len(traces), full_log_probs.shape[0] if full_log_probs.numel() else 0)):
            full = full_log_probs[t]
            with torch.no_grad():  # a reading, not training: no autograd graph kept
                lens = self._lens_log_probs(traces[t], request)  # (layers run, V)
                kl = (full.exp() * (full - lens)).sum(-1).clamp(min=0.0)
            result.append({layer: round(float(value), 4) for (layer, _), value in zip(traces[t], kl)})
        return result

    def _lens_log_probs(self, trace: Sequence[tuple[int, torch.Tensor]], request: ScheduleRequest) -> torch.Tensor:
        """(layers run, V) log-probabilities of each traced hidden state through the final norm
        and the LM head of the weights that ran it."""
        hidden = torch.stack([h for _, h in trace])[:, None].to(self.loaded.device)  # (layers run, 1, C)
        return self.decoder_for(request).adapter.logits(hidden)[:, -1].float().log_softmax(-1)

    def token_text(self, token_id: int) -> str:
        return self.loaded.tokenizer.decode([token_id])

    def decode_text(self, token_ids: Sequence[int], stop: Sequence[str] = ()) -> str:
        text = self.loaded.tokenizer.decode(list(token_ids), skip_special_tokens=True)
        return truncate_at_stop(text, stop)

    def _stop_check(self, stop: Sequence[str]):
        if not stop:
            return None
        tail = max(len(s) for s in stop) + 16  # tokens: enough to contain any stop string

        def check(row: int, ids: list[int]) -> bool:
            text = self.loaded.tokenizer.decode(ids[-tail:], skip_special_tokens=True)
            return any(s in text for s in stop)

        return check


def shared_part(request: GenerationRequest) -> GenerationRequest:
    """What requests must have in common to run as one batch (``merged_request``): everything but
    their prompts and their sampling seed. Two requests with equal shared parts decode under one
    schedule, with one token budget, sampler and stop strings: SkipDecode's one exit for the batch."""
    return replace(request, prompts=(), sampling=replace(request.sampling, seed=None, row_seeds=()))


def merged_request(requests: Sequence[GenerationRequest]) -> GenerationRequest:
    """Several requests of one shared part as one batch: their prompts in order, each request's rows
    sampled from its own seed (SamplingConfig.row_seeds), so a sampled row draws what it would alone."""
    first = requests[0]
    if any(shared_part(request) != shared_part(first) for request in requests[1:]):
        raise ValueError("only requests with the same schedule, token budget, sampler and stop strings share a batch")
    prompts = tuple(prompt for request in requests for prompt in request.prompts)
    seeds = tuple((len(request.prompts), request.sampling.seed) for request in requests)
    return replace(first, prompts=prompts, sampling=replace(first.sampling, row_seeds=seeds))


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


def validate_request(request: GenerationRequest) -> None:
    """A request's own values (its prompts, max_new_tokens, target_speedup), before any model work;
    the schedule's other settings are checked where they are solved."""
    validate_prompts(request.prompts)
    check_int("max_new_tokens", request.max_new_tokens, low=1)
    check_number("target_speedup", request.schedule.target_speedup)


def same_tokenizer(first, second) -> bool:
    """Two tokenizers that give every prompt the same ids: the same vocabulary, special tokens and
    chat template (compared by content: a copy saved to another folder is the same)."""
    if first is second:
        return True
    return (first.get_vocab() == second.get_vocab() and first.all_special_tokens == second.all_special_tokens
            and getattr(first, "chat_template", None) == getattr(second, "chat_template", None))
