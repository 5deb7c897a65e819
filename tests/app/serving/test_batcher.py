"""The batcher on a tiny random model: jobs that share a schedule run as one batch, each job reads
only its own rows, rows leave and end early without touching the others, a batch of one is the
job's own race bit for bit, and each sampled row keeps its own seed."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Callable, Sequence

import pytest
import torch

from app.serving.batcher import Batcher, BatchLimits, Ticket, prompt_parts
from model.generation.generator import TextGenerator
from model.generation.runs import GenerationRequest, merged_request
from model.generation.schedules import ScheduleRequest
from model.race import race
from model.skipdecode.decoder import SamplingConfig, sample_next
from tests.support import wait_until

PROMPTS = ("Name three colours.", "What is the capital of France?", "Tell me about the sea.", "Why is the sky blue?")
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def generator(tiny_folder):
    from model.loading import load_model

    return TextGenerator(load_model(str(tiny_folder), device="cpu", adapter=None))


def _request(prompt: str, **changes) -> GenerationRequest:
    schedule = ScheduleRequest(target_speedup=2.0, warmup=1, skip_policy=False)
    return dataclasses.replace(GenerationRequest(prompts=(prompt,), schedule=schedule, max_new_tokens=NEW_TOKENS),
                               **changes)


def _ticket(generator: TextGenerator, request: GenerationRequest, **options) -> Ticket:
    run = generator.prepare(request)
    full = dataclasses.replace(request.schedule, full=True)

    def alone(**race_options):
        return race(generator, run, generator.with_schedule(run, full), **race_options)
    return Ticket(generator, run, full, alone, **options)


def _alone(generator: TextGenerator, request: GenerationRequest):
    """The last update of the job raced by itself, as the playground ran every job before the batcher."""
    return list(_ticket(generator, request).alone())[-1]


def _race_together(batcher: Batcher, tickets: list[Ticket], arrivals: Sequence[float] = (),
                   on_arrival: Callable[[int], None] = lambda index: None) -> list[list]:
    """Every ticket's updates, each ticket read by its own thread (as each visitor's handler reads), the
    i-th arriving ``arrivals[i]`` seconds after the start (all at once without them), ``on_arrival(i)``
    first (its push, say)."""
    updates: list[list] = [[] for _ in tickets]

    def read(index: int) -> None:
        time.sleep(arrivals[index] if arrivals else 0.0)
        on_arrival(index)
        updates[index].extend(batcher.race(tickets[index]))
    threads = [threading.Thread(target=read, args=(i,)) for i in range(len(tickets))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return updates


def _texts(update) -> tuple[list[list[int]], list[list[int]]]:
    rows = range(update.skip.rows)
    return [update.skip.ids(r) for r in rows], [update.full.ids(r) for r in rows]


def test_a_batch_of_one_is_the_jobs_own_race_bit_for_bit(generator):
    batcher = Batcher(BatchLimits(gather_s=0.0, gather_max_s=0.0))
    request = _request(PROMPTS[0])
    together = list(batcher.race(_ticket(generator, request)))
    alone = list(_ticket(generator, request).alone())
    # (which stream moves next follows measured time: the order of the moves is the clock's, not the job's)
    assert len(together) == len(alone) and _texts(together[-1]) == _texts(alone[-1])
    assert together[-1].skip.step_layers == alone[-1].skip.step_layers
    assert together[-1].batch is None and together[-1].done  # it ran alone: no batch share


def test_a_job_after_the_batches_in_flight_waits_and_is_counted_apart_from_them(generator):
    """With one batch at a time, a job that comes while a batch runs waits for the next: ``running_count``
    says a batch has formed (its job no longer in ``waiting_count``), so a caller can tell a batch still
    gathering its head from a job waiting behind it."""
    compute = threading.Lock()
    batcher = Batcher(BatchLimits(batches=1, gather_s=0.0, gather_max_s=0.0), compute_lock=compute)
    assert batcher.running_count() == 0
    first, second = (_ticket(generator, _request(prompt)) for prompt in PROMPTS[:2])
    with compute:  # the first batch formed, its model steps wait for the lock
        readers = [threading.Thread(target=lambda t=first: list(batcher.race(t)))]
        readers[0].start()
        assert wait_until(lambda: batcher.running_count() == 1 and batcher.waiting_count() == 0, 30)
        readers.append(threading.Thread(target=lambda t=second: list(batcher.race(t))))
        readers[1].start()
        assert wait_until(lambda: batcher.waiting_count() == 1, 30)
        time.sleep(0.2)
        assert batcher.running_count() == 1 and batcher.waiting_count() == 1  # it waits: not in the running batch
    for thread in readers:
        thread.join(60)
    assert wait_until(lambda: batcher.running_count() == 0 and batcher.waiting_count() == 0, 30)
    assert next(batcher.batches) == 2 and batcher.largest == 1  # two batches of one


def test_jobs_that_share_a_schedule_run_as_one_batch_each_reading_its_own_rows(generator):
    batcher = Batcher(BatchLimits(gather_s=0.3, gather_max_s=1.0))
    requests = [_request(prompt) for prompt in PROMPTS] + [_request(PROMPTS[0])]  # two rows of one prompt
    updates = _race_together(batcher, [_ticket(generator, request) for request in requests])
    assert batcher.largest == len(requests)  # one batch held them all
    for request, own in zip(requests, updates):
        last = own[-1]
        assert last.done and last.batch is not None and last.batch.requests == len(requests)
        assert last.prompts == request.prompts and last.skip.rows == 1  # its own row, never another's
        assert _texts(last) == _texts(_alone(generator, request))  # the text it gets alone
        assert last.judged == _alone(generator, request).judged  # its row judged as it is alone (batched forwards)
    assert _texts(updates[0][-1]) == _texts(updates[-1][-1])  # the same prompt twice: the same text
    assert len({tuple(map(tuple, u.skip.step_layers)) for u in (own[-1] for own in updates)}) == 1  # one schedule


def test_a_job_that_leaves_loses_only_its_rows_and_a_batch_everyone_left_ends(generator):
    batcher = Batcher(BatchLimits(gather_s=0.3, gather_max_s=1.0))
    tickets = [_ticket(generator, _request(prompt)) for prompt in PROMPTS[:3]]
    results: dict[int, list] = {}

    def read(index: int, keep: int | None) -> None:
        stream = batcher.race(tickets[index])
        got = []
        for update in stream:
            got.append(update)
            if keep is not None and len(got) >= keep:
                stream.close()  # the visitor left (a closed tab, Stop): its handler stops reading
                break
        results[index] = got
    threads = [threading.Thread(target=read, args=(i, 2 if i == 1 else None)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert tickets[1].left and len(results[1]) == 2
    for index in (0, 2):
        assert results[index][-1].done
        assert _texts(results[index][-1]) == _texts(_alone(generator, _request(PROMPTS[index])))
    # every job leaves: the batch ends within a step, and the next job runs at once
    stopped = threading.Event()
    gone = [_ticket(generator, _request(prompt, max_new_tokens=200), should_cancel=stopped.is_set)
            for prompt in PROMPTS[:2]]
    readers = [threading.Thread(target=lambda t=t: list(batcher.race(t))) for t in gone]
    for thread in readers:
        thread.start()
    stopped.set()
    for thread in readers:
        thread.join(30)
        assert not thread.is_alive()
    after = list(batcher.race(_ticket(generator, _request(PROMPTS[3]))))
    assert after[-1].done


def test_a_row_that_ends_early_stops_streaming_while_the_batch_goes_on(generator):
    long_alone = _alone(generator, _request(PROMPTS[1]))
    short_alone = _alone(generator, _request(PROMPTS[0]))
    short_text = generator.text.decode_text(short_alone.skip.ids(0))
    long_text = generator.text.decode_text(long_alone.skip.ids(0))
    # a stop string in the first row's early text that the second row never writes
    stop = next((short_text[i:i + 3] for i in range(len(short_text) - 3)
                 if short_text[i:i + 3].strip() and short_text[i:i + 3] not in long_text
                 and generator.text.decode_text(generator.loaded.tokenizer.encode(short_text[:i + 3],
                                                                            add_special_tokens=False))), None)
    if stop is None:
        pytest.skip("the tiny model wrote no text one row stops on and the other does not")
    batcher = Batcher(BatchLimits(gather_s=0.3, gather_max_s=1.0))
    requests = [_request(PROMPTS[0], stop=(stop,)), _request(PROMPTS[1], stop=(stop,))]
    short, long_ = _race_together(batcher, [_ticket(generator, request) for request in requests])
    assert short[-1].done and short[-1].skip.record.finish_reasons == ["stop"]
    ended = next(update for update in short if update.skip.done)  # its SkipDecode row ended here
    assert len(ended.skip.step_layers) < len(long_[-1].skip.step_layers)  # and the batch went on
    assert len(ended.skip.ids(0)) < NEW_TOKENS
    assert _texts(short[-1])[0] == _texts(_alone(generator, requests[0]))[0]


def test_each_sampled_row_draws_from_its_own_seed_as_it_would_alone():
    logits = torch.randn(5, 40, generator=torch.Generator().manual_seed(3))
    sampling = SamplingConfig(temperature=1.0, row_seeds=((2, 11), (1, 12), (2, None)))
    generators = [(rows, torch.Generator().manual_seed(seed)) for rows, seed in ((2, 11), (1, 12))]
    together = sample_next(logits[:3], sampling, generators)
    alone = [sample_next(logits[:2], SamplingConfig(temperature=1.0), torch.Generator().manual_seed(11)),
             sample_next(logits[2:3], SamplingConfig(temperature=1.0), torch.Generator().manual_seed(12))]
    assert together.tolist() == torch.cat(alone).tolist()
    merged = merged_request([_request("a", sampling=SamplingConfig(temperature=1.0, seed=5)),
                             _request("b", sampling=SamplingConfig(temperature=1.0, seed=6))])
    assert merged.prompts == ("a", "b") and merged.sampling.row_seeds == ((1, 5), (1, 6))
    with pytest.raises(ValueError, match="same schedule"):
        merged_request([_request("a"), _request("b", max_new_tokens=3)])


def test_a_race_reads_its_prompt_once_for_both_streams_and_the_lens_reads_its_own(generator, monkeypatch):
    from model.skipdecode.decoder import SkipDecoder

    reads = []
    prefill = SkipDecoder.prefill
    monkeypatch.setattr(SkipDecoder, "prefill", lambda self, *a, **k: reads.append(1) or prefill(self, *a, **k))
    request = _request(PROMPTS[1])
    run = generator.prepare(request)
    full = generator.with_schedule(run, dataclasses.replace(request.schedule, full=True))
    last = list(race(generator, run, full))[-1]
    assert len(reads) == 1 and last.skip.prefill_seconds == last.full.prefill_seconds > 0
    separately = [generator.generate(request).decode.tokens, generator.generate(full.request).decode.tokens]
    assert [last.skip.record.tokens, last.full.record.tokens] == separately
    reads.clear()
    list(race(generator, run, full, lens=True))
    assert len(reads) == 2  # the lens traces SkipDecode's own read of the prompt


def test_the_full_models_choices_continuing_a_batchs_read_are_its_choices_reading_each_prompt_again(generator):
    request = merged_request([_request(prompt) for prompt in PROMPTS])
    run = generator.prepare(request, share_prefix=True)
    full = generator.with_schedule(run, dataclasses.replace(request.schedule, full=True))
    read = generator.shared_prefill(run, full)
    assert read is not None and run.shared_prefix > 0  # the chat template's system turn, read once
    texts = [generator.generate(_request(prompt)).decode.tokens[0] for prompt in PROMPTS]
    rows = [(3, texts[3]), (1, texts[1][:5]), (2, texts[2][:1])]  # some rows, in any order, of any length
    expected = generator.judge.choices_of([(run.prompt_ids(row), ids) for row, ids in rows])
    assert generator.judge.choices_after(read, rows) == expected


def test_a_class_read_in_parts_sees_its_first_tokens_as_each_part_is_read(generator, monkeypatch):
    """A shared greedy batch's prompts read in parts of whole jobs: the first part's jobs get SkipDecode's
    first token before the last part is read, that token is their row's first, the full pane is still
    empty then, and every job's text is still the text it gets alone."""
    from app.serving import batcher as batcher_module
    from model.skipdecode.decoder import SkipDecoder

    events: list[tuple] = []
    layers, announce = SkipDecoder._prompt_layers, batcher_module._Reader.announce
    monkeypatch.setattr(SkipDecoder, "_prompt_layers", lambda self, hidden, *a, **k:
                        events.append(("read", len(hidden))) or layers(self, hidden, *a, **k))
    monkeypatch.setattr(batcher_module._Reader, "announce", lambda self, update: events.append(("first", self.rows))
                        or announce(self, update))
    batcher = Batcher(BatchLimits(gather_s=0.3, gather_max_s=1.0, prompt_parts=3, part_tokens=1))
    requests = [_request(prompt) for prompt in PROMPTS] + [_request(PROMPTS[2])]
    updates = _race_together(batcher, [_ticket(generator, request) for request in requests])
    assert batcher.largest == len(requests)
    reads = [index for index, event in enumerate(events) if event[0] == "read"][1:]  # after the common start's
    assert events[0] == ("read", 1) and [events[index][1] for index in reads] == [2, 1, 2]  # 5 jobs, 3 parts
    announced = [event[1] for event in events[reads[0]:reads[1]] if event[0] == "first"]
    assert announced == [range(0, 1), range(1, 2)]  # the first part's jobs, before the second part is read
    assert len([event for event in events if event[0] == "first"]) == len(requests)
    for request, own in zip(requests, updates):
        first, last = own[0], own[-1]
        assert first.full.record is None and first.skip.ids(0) == last.skip.ids(0)[:1] and not first.done
        assert first.batch is not None and first.batch.requests == len(requests) and first.prompts == request.prompts
        assert _texts(last) == _texts(_alone(generator, request))


def test_prompts_are_read_in_parts_of_whole_jobs_only_where_that_shows_first_tokens_sooner(generator):
    run = generator.prepare(merged_request([_request(prompt) for prompt in PROMPTS * 3]), share_prefix=True)
    jobs = [range(row, row + 1) for row in range(run.batch)]
    own = int(run.mask[:, run.shared_prefix:].sum())
    limits = BatchLimits(prompt_parts=4, part_tokens=max(1, own // 4))
    parts = prompt_parts(run, jobs, "cpu", limits)
    assert [len(part) for part in parts] == [3, 3, 3, 3] and parts[0].start == 0 and parts[-1].stop == run.batch
    assert prompt_parts(run, [range(0, 5), range(5, 12)], "cpu", limits) == [range(0, 5), range(5, 12)]  # whole jobs
    assert prompt_parts(run, jobs, "cpu", BatchLimits(part_tokens=own)) == []  # too little to read for a part
    assert prompt_parts(run, jobs, "cuda", limits) == []  # a GPU reads a class's prompts in milliseconds
    assert prompt_parts(run, [range(0, run.batch)], "cpu", limits) == []  # one job: nothing to show sooner
    sampled = generator.prepare(merged_request([_request(prompt, sampling=SamplingConfig(temperature=1.0, seed=1))
                                                for prompt in PROMPTS * 3]), share_prefix=True)
    assert prompt_parts(sampled, jobs, "cpu", limits) == []  # a sampled row's first draw is its stream's


def test_a_class_whose_pushed_jobs_come_late_still_shares_one_batch(generator):
    """A class's jobs reach the batcher after their pushes (each client opens its stream, each run is
    prepared): on a loaded server the last came 0.8 s after the last push. Pushed jobs are waited for
    up to ``gather_max_s``, so a burst is one batch; a pushed job that never comes holds the batch no
    longer than the head's deadline."""
    batcher = Batcher(BatchLimits(gather_s=0.05, gather_max_s=2.0))
    tickets = [_ticket(generator, _request(prompt)) for prompt in PROMPTS[:3]]
    for _ in tickets:
        batcher.expect()
    results = _race_together(batcher, tickets, arrivals=[0.0, 0.9, 1.0])
    assert batcher.largest == 3 and next(batcher.batches) == 1  # one batch of the three
    assert all(own[-1].done and own[-1].batch.requests == 3 for own in results)
    for _ in range(2):  # two pushed, one comes: it starts by its deadline, without the other
        batcher.expect()
    started = time.monotonic()
    alone = list(batcher.race(_ticket(generator, _request(PROMPTS[3]))))
    waited = time.monotonic() - started
    assert alone[-1].done and alone[-1].batch is None and 1.9 <= waited < 4.0  # waited for them to its deadline only


def test_a_class_whose_clicks_come_in_clumps_still_shares_one_batch(generator):
    """A class's clicks reach the batcher in clumps (30 API clients on a 2-core server: 22 within 0.2 s,
    none for 0.15 s, then 8). A pause shorter than the time the gathered jobs took to arrive does not
    end the gather; a pause longer than ``gather_s`` did, and the late clump's batch shared the cores
    with the first."""
    batcher = Batcher(BatchLimits(gather_s=0.3, gather_max_s=3.0))
    arrivals = [0.0, 0.15, 0.3, 0.45, 0.6, 1.05]  # a clump over 0.6 s, then 0.45 s without a click
    tickets = [_ticket(generator, _request(PROMPTS[i % len(PROMPTS)])) for i in range(len(arrivals))]
    results = _race_together(batcher, tickets, arrivals)
    assert batcher.largest == len(tickets) and next(batcher.batches) == 1  # one batch of all
    assert all(own[-1].done and own[-1].batch.requests == len(tickets) for own in results)
    started = time.monotonic()
    alone = list(batcher.race(_ticket(generator, _request(PROMPTS[0]))))
    assert alone[-1].batch is None and time.monotonic() - started < 0.3 + 2.0  # alone: gather_s, then its run


def test_a_page_click_is_waited_for_from_its_checks_and_counted_once(generator):
    """A page's click passes its checks ~0.3 s before its job is pushed: four pages clicking together
    pushed over 0.7 s and the first ran alone. Announced at its checks, its job is waited for; its push
    (the same session) and a double click do not count it again, so a visitor alone is not held."""
    batcher = Batcher(BatchLimits(gather_s=0.05, gather_max_s=2.0))
    tickets = [_ticket(generator, _request(prompt)) for prompt in PROMPTS[:2]]
    batcher.announce("page-a")
    batcher.announce("page-b")
    batcher.announce("page-b")  # a double click
    batcher.expect("page-a")  # page a's push: counted at its click
    results = _race_together(batcher, tickets, arrivals=[0.0, 0.5],
                             on_arrival=lambda index: batcher.expect("page-b") if index else None)  # b's push, then its job
    assert batcher.largest == 2 and next(batcher.batches) == 1  # one batch: the first waited for the second
    assert all(own[-1].done and own[-1].batch.requests == 2 for own in results)
    batcher.announce("page-c")  # a visitor alone who double-clicked: one job coming, not two
    batcher.announce("page-c")
    batcher.expect("page-c")
    started = time.monotonic()
    alone = list(batcher.race(_ticket(generator, _request(PROMPTS[2]))))
    assert alone[-1].batch is None and time.monotonic() - started < 1.5  # no wait for a job that never comes


def test_announcements_are_capped_at_a_batchs_rows():
    """A script calling the page's checks with made-up sessions announces no more than a batch holds."""
    batcher = Batcher(BatchLimits(rows=4, gather_s=0.05, gather_max_s=1.0))
    for index in range(50):
        batcher.announce(f"made-up-{index}")
    assert len(batcher._announced) == 4 and batcher._coming == 4
    batcher.expect("made-up-49")  # an unannounced session's push counts as a push
    assert batcher._coming == 5


def test_a_counted_job_that_never_comes_is_given_up_by_its_handler(generator):
    """A restart with nothing running, a run stopped while it waited, settings refused at the run: the
    handler was counted (its click or push) and hands the batcher nothing. It says so, and a visitor
    alone is not held to the gather's deadline for it."""
    batcher = Batcher(BatchLimits(gather_s=0.05, gather_max_s=3.0))
    batcher.expect("page-slider")  # a slider's restart pushed: nothing was running
    batcher.expect("page-visitor")  # the visitor's own push
    batcher.came_without_job()  # the restart's handler
    started = time.monotonic()
    alone = list(batcher.race(_ticket(generator, _request(PROMPTS[0]))))
    assert alone[-1].batch is None and time.monotonic() - started < 2.0  # not the 3 s deadline
