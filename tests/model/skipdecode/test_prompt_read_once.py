"""A prompt read once for two streams, and the full model continuing it: SkipDecode and the full model
read a prompt alike at full depth, so the race reads it once and each stream continues its own copy
(``SkipDecoder.read_prompt``, ``stream(prefilled=)``); the full model's verdict on SkipDecode's text
continues that read instead of reading the prompt again (``SkipDecoder.extend``). Both must be exactly
what reading the prompt again gives, for every family, padded or not.

Tests marked ``device`` run on SKIPDECODE_TEST_DEVICE (tests/support.py; default cpu)."""

import pytest
import torch

from model.skipdecode.decoder import SkipDecoder, left_padded, run_to_end, shared_prefix_padded
from model.skipdecode.schedule import ScheduleConfig, full_schedule
from tests.support import FAMILIES, NUM_LAYERS, TEST_DEVICE, VOCAB, left_padded_batch, tiny_model

NEW_TOKENS = 10
SKIP = ScheduleConfig(NUM_LAYERS, 6, 2, decay="linear", warmup=1, decay_length=8)
PADDED, UNPADDED = [7, 4, 9], [6, 6, 6]


@pytest.fixture(scope="module", params=FAMILIES)
def decoder(request):
    return SkipDecoder(tiny_model(request.param, device=TEST_DEVICE), eos_token_ids=(), pad_token_id=0)


def _tokens(decoder, ids, mask, schedule, **options):
    return run_to_end(decoder.stream(ids, mask, schedule, max_new_tokens=NEW_TOKENS, **options))


@pytest.mark.device
@pytest.mark.parametrize("lengths", [PADDED, UNPADDED], ids=["padded", "unpadded"])
def test_two_streams_continuing_one_read_equal_each_reading_its_own(decoder, lengths):
    ids, mask = left_padded_batch(lengths, device=TEST_DEVICE)
    read = decoder.read_prompt(ids, mask, SKIP, NEW_TOKENS)
    for schedule in (SKIP, full_schedule(NUM_LAYERS)):
        alone = _tokens(decoder, ids, mask, schedule)
        continued = _tokens(decoder, ids, mask, schedule, prefilled=read.copy())
        assert continued.tokens == alone.tokens and continued.step_layers == alone.step_layers
        assert continued.prefill_seconds == read.seconds  # the one read's time, recorded by each stream
    assert read.state.cache.lengths == [ids.shape[1]] * NUM_LAYERS  # the read itself was left as it was


@pytest.mark.device
@pytest.mark.parametrize("lengths", [PADDED, UNPADDED], ids=["padded", "unpadded"])
def test_extending_a_read_prompt_gives_the_full_models_logits_over_prompt_and_continuation(decoder, lengths):
    ids, mask = left_padded_batch(lengths, device=TEST_DEVICE)
    continuation = torch.randint(1, VOCAB, (len(lengths), 5), generator=torch.Generator().manual_seed(3)).to(ids.device)
    read = decoder.read_prompt(ids, mask, SKIP, NEW_TOKENS)
    whole = torch.cat([mask, torch.ones_like(continuation)], dim=1)
    with torch.inference_mode():  # transformers over prompt and continuation at once, positions from the mask
        ours = decoder.adapter.logits(decoder.extend(read, continuation))  # (B, 5, V)
        positions = (whole.cumsum(-1) - 1).clamp(min=0)
        reference = decoder.model(torch.cat([ids, continuation], dim=1), attention_mask=whole,
                                  position_ids=positions).logits[:, ids.shape[1]:]
    torch.testing.assert_close(ours, reference, atol=2e-4, rtol=1e-4)
    assert read.state.cache.lengths == [ids.shape[1]] * NUM_LAYERS  # extend wrote into a copy
    # and the prompt's own logits are the full model's at the last prompt position
    with torch.inference_mode():
        prompt_logits = decoder.model(ids, attention_mask=mask, position_ids=positions[:, :ids.shape[1]]).logits[:, -1]
    torch.testing.assert_close(read.logits, prompt_logits, atol=2e-4, rtol=1e-4)


@pytest.mark.device
def test_a_read_is_refused_by_a_stream_that_reads_its_prompt_otherwise():
    decoder = SkipDecoder(tiny_model("llama", device=TEST_DEVICE), eos_token_ids=(), pad_token_id=0)
    ids, mask = left_padded_batch(PADDED, device=TEST_DEVICE)
    at_budget = ScheduleConfig(NUM_LAYERS, 5, 2, decay="linear", warmup=1, decay_length=8, prompt_at_full_depth=False)
    read = decoder.read_prompt(ids, mask, SKIP, NEW_TOKENS)
    with pytest.raises(ValueError, match="not these prompts' read"):
        _tokens(decoder, ids, mask, at_budget, prefilled=read.copy())
    with pytest.raises(ValueError, match="not these prompts' read"):  # other prompts
        _tokens(decoder, ids[:2], mask[:2], SKIP, prefilled=read.copy())
    with pytest.raises(ValueError, match="full depth"):
        decoder.extend(decoder.read_prompt(ids, mask, at_budget, NEW_TOKENS), ids[:, :2])
    with pytest.raises(ValueError, match="exceed"):
        decoder.extend(read, torch.ones(3, NEW_TOKENS + 1, dtype=torch.long, device=ids.device))


def _rows_with_a_common_start(start: int, rests: list[int]) -> list[list[int]]:
    generator = torch.Generator().manual_seed(5)
    common = torch.randint(1, VOCAB, (start,), generator=generator).tolist()
    return [common + torch.randint(1, VOCAB, (rest,), generator=generator).tolist() for rest in rests]


def test_rows_that_begin_alike_are_laid_out_with_their_common_start_once():
    rows = _rows_with_a_common_start(10, [3, 1, 6])
    ids, mask, prefix = shared_prefix_padded(rows, pad_id=0)
    assert prefix == 10 and ids.shape == (3, 16)
    for row, (tokens, valid) in enumerate(zip(ids.tolist(), mask.tolist())):
        assert [t for t, v in zip(tokens, valid) if v] == rows[row]  # each row's own tokens, in order
        assert valid[:10] == [1] * 10 and valid[-1] == 1  # the prefix unpadded, the next token's column last
    assert shared_prefix_padded(rows[:1], 0)[2] == 0  # one row: nothing to share
    assert shared_prefix_padded(_rows_with_a_common_start(5, [3, 4]), 0)[2] == 0  # too short to be worth it
    assert shared_prefix_padded([rows[0], rows[0][:11]], 0)[2] == 10  # every row keeps a token of its own


@pytest.mark.device
def test_a_prefix_read_once_for_the_batch_gives_what_each_row_reads_alone(decoder):
    rows = _rows_with_a_common_start(10, [3, 1, 6])
    ids, mask, prefix = shared_prefix_padded(rows, pad_id=0, device=TEST_DEVICE)
    plain_ids, plain_mask = left_padded(rows, 0, TEST_DEVICE)
    for schedule in (SKIP, full_schedule(NUM_LAYERS)):
        shared = _tokens(decoder, ids, mask, schedule, shared_prefix=prefix)
        plain = _tokens(decoder, plain_ids, plain_mask, schedule)
        assert shared.tokens == plain.tokens and shared.prompt_lengths == plain.prompt_lengths
    state, logits = decoder.prefill(ids, mask, list(range(NUM_LAYERS)), ids.shape[1] + 4, shared_prefix=prefix)
    _, alone = decoder.prefill(plain_ids, plain_mask, list(range(NUM_LAYERS)), ids.shape[1] + 4)
    torch.testing.assert_close(logits, alone, atol=2e-4, rtol=1e-4)
    # and the judge's continuation of such a read is the full model's, too
    continuation = torch.randint(1, VOCAB, (3, 4), generator=torch.Generator().manual_seed(9)).to(ids.device)
    read = decoder.read_prompt(ids, mask, SKIP, NEW_TOKENS, shared_prefix=prefix)
    with torch.inference_mode():
        ours = decoder.adapter.logits(decoder.extend(read, continuation))
        whole = torch.cat([plain_mask, torch.ones_like(continuation)], dim=1)
        reference = decoder.model(torch.cat([plain_ids, continuation], dim=1), attention_mask=whole,
                                  position_ids=(whole.cumsum(-1) - 1).clamp(min=0)).logits[:, ids.shape[1]:]
    torch.testing.assert_close(ours, reference, atol=2e-4, rtol=1e-4)


@pytest.mark.device
def test_a_read_in_parts_is_the_read_of_all_rows_at_once_and_tells_each_part_as_it_is_read(decoder):
    """A class's prompts read in parts of rows (the batcher shows the first visitors' first tokens before
    the last prompt is read): each part is told with its own logits, in order, and the joined read is
    the read of all rows at once, which both streams continue to the same tokens, common start or not."""
    rows = _rows_with_a_common_start(10, [3, 1, 6, 2, 5])
    parts = [range(0, 2), range(2, 3), range(3, 5)]
    for ids, mask, prefix in (shared_prefix_padded(rows, pad_id=0, device=TEST_DEVICE),
                              (*left_padded_batch([7, 4, 9, 2, 5], device=TEST_DEVICE), 0)):
        told: list[tuple[range, torch.Tensor]] = []
        whole = decoder.read_prompt(ids, mask, SKIP, NEW_TOKENS, shared_prefix=prefix)
        joined = decoder.read_prompt(ids, mask, SKIP, NEW_TOKENS, shared_prefix=prefix, parts=parts,
                                     on_part=lambda part, logits: told.append((part, logits.clone())))
        assert [part for part, _ in told] == parts
        torch.testing.assert_close(torch.cat([logits for _, logits in told]), joined.logits, atol=0, rtol=0)
        torch.testing.assert_close(joined.logits, whole.logits, atol=2e-4, rtol=1e-4)
        assert joined.state.cache.lengths == whole.state.cache.lengths and joined.state.length == whole.state.length
        assert torch.equal(joined.state.key_valid, whole.state.key_valid)
        assert torch.equal(joined.state.next_position, whole.state.next_position)
        assert joined.state.has_padding == whole.state.has_padding
        for layer in (0, NUM_LAYERS - 1):
            for ours, theirs in zip(joined.state.cache.layer(layer), whole.state.cache.layer(layer)):
                torch.testing.assert_close(ours, theirs, atol=2e-4, rtol=1e-4)
        for schedule in (SKIP, full_schedule(NUM_LAYERS)):
            continued = _tokens(decoder, ids, mask, schedule, prefilled=joined.copy(), shared_prefix=prefix)
            assert continued.tokens == _tokens(decoder, ids, mask, schedule, shared_prefix=prefix).tokens


def test_parts_that_do_not_cover_the_batch_in_order_are_refused():
    decoder = SkipDecoder(tiny_model("llama"), eos_token_ids=(), pad_token_id=0)
    ids, mask = left_padded_batch([4, 3, 5])
    for parts in ([range(0, 2)], [range(1, 3)], [range(0, 2), range(1, 3)], [range(0, 1), range(2, 3)],
                  [range(0, 0), range(0, 3)], [range(2, 3), range(0, 2)]):
        with pytest.raises(ValueError, match="consecutive, non-empty row ranges covering the batch of 3"):
            decoder.read_prompt(ids, mask, SKIP, NEW_TOKENS, parts=parts)


def test_the_first_tokens_of_a_part_are_what_a_greedy_stream_records_first():
    """End of text first (no token, the row ended), a stop string at once, and the plain rows: the first
    event of the stream continuing the read records exactly these."""
    model = tiny_model("llama")
    ids, mask = left_padded_batch([4, 3, 5, 6])
    read = SkipDecoder(model, eos_token_ids=(), pad_token_id=0).read_prompt(ids, mask, SKIP, NEW_TOKENS)
    firsts = read.logits.argmax(-1).tolist()
    decoder = SkipDecoder(model, eos_token_ids=(firsts[1],), pad_token_id=0)
    stop = lambda row, tokens: row == 3  # noqa: E731  (the batch's row 3 stops at its first token)
    stream = decoder.stream(ids, mask, SKIP, max_new_tokens=NEW_TOKENS, prefilled=read.copy(), stop_check=stop)
    first = next(stream).record
    tokens, reasons = decoder.first_tokens(read.logits[2:], stop, range(2, 4))
    assert (tokens, reasons) == (first.tokens[2:], first.finish_reasons[2:])
    tokens, reasons = decoder.first_tokens(read.logits[:2], stop, range(0, 2))
    assert (tokens, reasons) == (first.tokens[:2], first.finish_reasons[:2])
    assert tokens[1] == [] and reasons[1] == "eos"  # the cases the stream met: an end of text and a stop
    assert first.finish_reasons[3] == ("eos" if firsts[3] == firsts[1] else "stop")
