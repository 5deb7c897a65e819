"""Distillation data at scale, offline: ``python -m model make-data``.

The skip policy learns to match the full model's next-token distribution on text the full
model writes. More DISTINCT text is the lever (a few hundred prompts seen 13 times flatten the
held-out curve), so this builds tens of thousands of unique sequences without any download:

1. prompts from five offline sources, deduplicated and never overlapping the held-out sets:
   * ``magpie``: user turns the model writes itself. The chat template is cut right after the
     user header and the model samples what a user would ask (Magpie, arXiv 2406.08464);
     kept if it ends its turn, has 3-60 words and is not a duplicate.
   * ``templates``: committed task templates x committed topics (assets/prompts/).
   * ``wordnet``: questions about WordNet lemmas (Debian's wordnet-base, installed by
     scripts/make_data.sh; skipped with a note when absent).
   * ``entities``: short fact questions about WordNet's named instances (people, places,
     events, works: "Which country is Odessa in?", "Who was Jakob Boehme?"), the kind of
     question whose short answer SkipDecode loses most often (fact retention). No question that
     names a held-out fact's entity or answer is made. Off by default (``--entity-questions N``);
     run it with ``--max-new-tokens 32``, the reply length the fact measure decays over, so that
     training sees the steep decay of a short reply.
   * ``pydoc``: raw-text passages from the Python standard library's own docstrings (no chat
     template: the playground also runs raw prompts).
2. continuations from the full model: one greedy and ``samples`` sampled (temperature 0.8) per
   prompt, up to ``max_new_tokens`` tokens. The text may be written with the fast int8 weights
   (the KL targets are computed from the float original at train time, never stored here).

Everything lands in one folder (default runs/data/default): user_turns.jsonl, prompts.jsonl,
sequences.jsonl (one training sequence per line: prompt ids + target ids), manifest.json.
Each stage appends whole batches and resumes where it stopped; running the command again only
finishes what is missing.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import random
import re
import sys
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import torch
from tqdm.auto import tqdm

from model.common.checks import check_choice, check_int
from model.generation.generator import TextGenerator
from model.generation.schedules import ScheduleRequest
from model.loading import load_model, resolve_device
from model.skipdecode.decoder import SamplingConfig, left_padded
from model.skipdecode.schedule import full_schedule
from model.training.data import (
    ASSETS,
    DEFAULT_EVAL_PROMPTS,
    DEFAULT_FACTS,
    continuation_target,
    read_jsonl,
    sequence_key,
)

PROMPTS_DIR = ASSETS / "prompts"
TOPICS_FILE = PROMPTS_DIR / "topics.txt"
TEMPLATES_FILE = PROMPTS_DIR / "templates.txt"
WORDNET_DIR = Path("/usr/share/wordnet")
SOURCES = ("magpie", "templates", "wordnet", "entities", "pydoc")
WORDNET_QUESTIONS = ("What does the word \"{word}\" mean?", "Use the word \"{word}\" in two example sentences.",
                     "Explain what \"{word}\" means and give an example.")
# Question templates per WordNet lexicographer file of an instance noun (18 person, 15 location,
# 17 natural object, 04 act, others); "{x}" is the instance's name.
ENTITY_QUESTIONS = {
    "18": ("Who was {x}?", "What is {x} known for?", "Which country was {x} from?", "When did {x} live?",
           "What was {x}'s profession?"),
    "15": ("Where is {x}?", "Which country is {x} in?", "What is {x} known for?", "What kind of place is {x}?"),
    "17": ("Where is {x}?", "What is {x}?", "What is {x} known for?"),
    "04": ("When did {x} take place?", "What was {x}?", "Who fought in {x}?"),
    "other": ("What is {x}?", "What is {x} known for?"),
}
PYDOC_MODULES = ("os", "os.path", "pathlib", "json", "re", "string", "collections", "itertools", "functools",
                 "math", "statistics", "random", "datetime", "calendar", "time", "textwrap", "difflib",
                 "csv", "sqlite3", "shutil", "tempfile", "glob", "fnmatch", "argparse", "logging", "typing",
                 "dataclasses", "enum", "decimal", "fractions", "heapq", "bisect", "array", "copy", "pprint",
                 "io", "zipfile", "tarfile", "gzip", "hashlib", "hmac", "secrets", "base64", "struct", "codecs",
                 "unicodedata", "locale", "gettext", "threading", "queue", "subprocess", "socket", "selectors",
                 "asyncio", "urllib.parse", "http.client", "email", "html", "xml.etree.ElementTree", "unittest",
                 "doctest", "inspect", "ast", "dis", "tokenize", "importlib", "pkgutil", "contextlib", "abc",
                 "operator", "weakref", "types", "numbers", "cmath", "wave", "colorsys", "turtle", "tkinter",
                 "configparser", "shelve", "pickle", "platform", "sys", "warnings", "traceback", "timeit")


WRITERS = ("full", "skipdecode")


@dataclass
class MakeDataConfig:
    output_dir: str = "runs/data/default"
    model: str | None = None  # None: the embedded default model
    sources: tuple[str, ...] = SOURCES
    # ~10,000 prompts -> ~20,000 sequences. Magpie turns are the slowest source on a CPU
    # (~30% of samples are filtered out); a GPU run can raise them.
    magpie_turns: int = 500  # user turns to sample (kept after filtering; fewer if duplicates abound)
    template_prompts: int = 6000  # template x topic pairs (drawn without replacement)
    wordnet_prompts: int = 2500
    entity_questions: int = 0  # short fact questions about WordNet instances (the ``entities`` source; 0: none)
    pydoc_prompts: int = 1000
    samples: int = 1  # sampled continuations per prompt, besides the greedy one
    temperature: float = 0.8
    max_new_tokens: int = 128
    max_prompt_tokens: int = 160
    batch_size: int = 32
    weights: str = "int8"  # weights that WRITE the text on a CPU: int8 (fast) or float (a GPU always runs float)
    device: str = "auto"  # cuda when there is one, else cpu
    threads: int | None = None
    seed: int = 0
    limit_prompts: int | None = None  # only the first N prompts get continuations (quick runs, tests)
    # On-policy data (GKD / DistillSpec): "skipdecode" writes the continuations with SkipDecode
    # itself (the adapter, at the speedups below in turn), so training sees the prefixes the
    # policy drifts into when it runs free; the KL targets still come from the float full model
    # at train time. "full" (default) writes them with the full model.
    writer: str = "full"
    writer_speedups: tuple[float, ...] = (1.5, 2.0, 3.0)
    adapter: str = "auto"  # the skip policy an on-policy writer runs
    prompts_from: str | None = None  # reuse another make-data folder's prompt list (same prompts, new writer)

    def __post_init__(self) -> None:
        for name in ("magpie_turns", "template_prompts", "wordnet_prompts", "entity_questions", "pydoc_prompts", "samples"):
            check_int(name, getattr(self, name), low=0)
        for name in ("max_new_tokens", "max_prompt_tokens", "batch_size"):
            check_int(name, getattr(self, name), low=1)
        unknown = set(self.sources) - set(SOURCES)
        if unknown:
            raise ValueError(f"unknown sources {sorted(unknown)}; choose from {', '.join(SOURCES)}")
        if self.weights not in ("int8", "float", "none", "int4"):
            raise ValueError(f"weights must be int8, int4 or float; got {self.weights!r}")
        check_choice("writer", self.writer, WRITERS)
        if self.writer == "skipdecode" and (not self.writer_speedups or min(self.writer_speedups) < 1.0):
            raise ValueError(f"writer_speedups must be >= 1; got {self.writer_speedups}")


@dataclass
class PromptRecord:
    id: int
    prompt: str
    source: str
    raw: bool = False  # True: no chat template (plain-text continuation)


@dataclass
class DataManifest:
    config: dict
    prompts: int = 0
    prompts_by_source: dict = field(default_factory=dict)
    prompts_done: int = 0
    sequences: int = 0
    target_tokens: int = 0
    duplicates_dropped: int = 0


# --- text hygiene ------------------------------------------------------------------------------


def normalized(text: str) -> str:
    """The dedup key: lower case, letters and digits only, single spaces."""
    return " ".join(re.sub(r"[^0-9a-z]+", " ", text.lower()).split())


def held_out_keys() -> set[str]:
    """Normalised prompts that must never be trained on: the held-out eval set and the fact questions."""
    keys = {normalized(r["prompt"]) for r in read_jsonl(DEFAULT_EVAL_PROMPTS)}
    if DEFAULT_FACTS.is_file():
        keys |= {normalized(r["question"]) for r in read_jsonl(DEFAULT_FACTS)}
    return keys


def good_user_turn(text: str) -> bool:
    """A sampled user turn worth keeping: 3-60 words, mostly plain text, no role markers."""
    words = text.split()
    if not 3 <= len(words) <= 60 or "<|" in text or "assistant" in text.lower()[:20]:
        return False
    letters = sum(ch.isalpha() for ch in text)
    return letters >= 0.6 * len(text.replace(" ", "")) and text.isprintable()


def read_lines(path: Path) -> list[str]:
    if not path.is_file():
        raise ValueError(f"{path} is missing (it is committed with the repository)")
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# --- prompt sources ----------------------------------------------------------------------------


def template_prompts(count: int, rng: random.Random) -> list[str]:
    """``count`` distinct template x topic pairs, drawn without replacement."""
    templates, topics = read_lines(TEMPLATES_FILE), read_lines(TOPICS_FILE)
    pairs = [(t, p) for t in range(len(templates)) for p in range(len(topics))]
    rng.shuffle(pairs)
    return [templates[t].replace("{topic}", topics[p]) for t, p in pairs[:count]]


def wordnet_lemmas(folder: Path = WORDNET_DIR) -> list[str]:
    """Single-word noun, verb and adjective lemmas from WordNet's data files (empty if not installed)."""
    lemmas: set[str] = set()
    for part in ("noun", "verb", "adj"):
        path = folder / f"data.{part}"
        if not path.is_file():
            continue
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("  "):  # the licence header
                continue
            fields = line.split(" ")
            if len(fields) > 4 and fields[4].isalpha() and fields[4].islower() and 4 <= len(fields[4]) <= 14:
                lemmas.add(fields[4])
    return sorted(lemmas)


def wordnet_prompts(count: int, rng: random.Random) -> list[str]:
    lemmas = wordnet_lemmas()
    if not lemmas:
        print("make-data: WordNet not installed (Debian wordnet-base; scripts/make_data.sh installs it): "
              "skipping the wordnet source", file=sys.stderr)
        return []
    rng.shuffle(lemmas)
    return [WORDNET_QUESTIONS[i % len(WORDNET_QUESTIONS)].format(word=w) for i, w in enumerate(lemmas[:count])]


def wordnet_instances(folder: Path | None = None) -> list[tuple[str, str]]:
    """(lexicographer file, name) of every named instance noun ("@i" pointer) in WordNet; a
    person's fullest name ("Jakob Boehme" rather than "Boehme"); empty if not installed."""
    path = (folder or WORDNET_DIR) / "data.noun"
    if not path.is_file():
        return []
    instances = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("  ") or " @i " not in line:
            continue
        fields = line.split(" ")
        count = int(fields[3], 16)
        names = [fields[4 + 2 * i].replace("_", " ") for i in range(count)]
        names = [re.sub(r"\(.*\)$", "", n).strip() for n in names]
        name = max(names[:3], key=lambda n: len(n.split())) if fields[1] == "18" else names[0]
        if name[:1].isupper() and name.replace(" ", "").replace("-", "").replace(".", "").replace("'", "").isalpha():
            instances.append((fields[1], name))
    return sorted(set(instances))


def held_out_fact_terms() -> list[str]:
    """Normalised held-out fact questions and accepted answers: an entity question must name none of them."""
    if not DEFAULT_FACTS.is_file():
        return []
    records = read_jsonl(DEFAULT_FACTS)
    return [normalized(r["question"]) for r in records] + [normalized(a) for r in records for a in r["answers"]]


def names_held_out_fact(question: str, entity: str, terms: Sequence[str]) -> bool:
    """Does an entity question touch a held-out fact: its entity inside a fact question, or an
    accepted answer inside the question ("Who was William Shakespeare?" for "Who wrote Hamlet?")?"""
    padded_entity, padded_question = f" {normalized(entity)} ", f" {normalized(question)} "
    return any(term and (padded_entity in f" {term} " or f" {term} " in padded_question) for term in terms)


def entity_prompts(count: int, rng: random.Random) -> list[str]:
    """``count`` distinct short fact questions: one template per WordNet instance, instances drawn
    without replacement (more than the instances: each gets a second template, and so on)."""
    if count <= 0:
        return []
    instances = wordnet_instances()
    if not instances:
        print("make-data: WordNet not installed (Debian wordnet-base; scripts/make_data.sh installs it): "
              "skipping the entities source", file=sys.stderr)
        return []
    terms = held_out_fact_terms()
    rng.shuffle(instances)
    first_template = [rng.randrange(len(ENTITY_QUESTIONS.get(lexfile, ENTITY_QUESTIONS["other"])))
                      for lexfile, _ in instances]  # each instance walks its templates from a random one
    questions: list[str] = []
    for round_index in range(max(len(t) for t in ENTITY_QUESTIONS.values())):
        for (lexfile, name), first in zip(instances, first_template):
            templates = ENTITY_QUESTIONS.get(lexfile, ENTITY_QUESTIONS["other"])
            if round_index >= len(templates):
                continue
            template = templates[(first + round_index) % len(templates)]
            question = template.format(x=name)
            if not names_held_out_fact(question, name, terms):
                questions.append(question)
            if len(questions) >= count:
                return questions
    return questions


def docstring_passages() -> Iterator[str]:
    """First paragraphs (>= 20 words) of the docstrings of standard-library modules and their members."""
    for name in PYDOC_MODULES:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                module = importlib.import_module(name)
        except (ImportError, RuntimeError, OSError):  # a module missing from this Python build (tkinter, turtle): skip it
            continue
        members = [module] + [value for _, value in inspect.getmembers(module)
                              if inspect.isclass(value) or inspect.isfunction(value) or inspect.isbuiltin(value)]
        for member in members:
            for paragraph in (inspect.getdoc(member) or "").split("\n\n"):
                text = " ".join(paragraph.split())
                if len(text.split()) >= 20 and ">>>" not in text:
                    yield text


def pydoc_prompts(count: int, rng: random.Random) -> list[str]:
    """Raw-text prompts: the first half (at most 40 words) of a docstring paragraph."""
    passages = sorted(set(docstring_passages()))
    rng.shuffle(passages)
    prompts = []
    for text in passages[:count]:
        words = text.split()
        prompts.append(" ".join(words[: min(40, max(12, len(words) // 2))]))
    return prompts


# --- stage 1: magpie user turns ----------------------------------------------------------------


def sample_user_turns(generator, config: MakeDataConfig, path: Path, progress) -> list[str]:
    """Append sampled user turns to ``path`` batch by batch until ``magpie_turns`` good, unique ones exist."""
    kept = [r["prompt"] for r in _read_if_exists(path)]
    seen = {normalized(t) for t in kept} | held_out_keys()
    # The chat template up to the user header: what the model sees right before a user writes.
    header, _ = generator.text.template_around_user
    if not header:
        raise ValueError("Magpie user turns need a model with a chat template; leave out the magpie source")
    header = torch.tensor([header] * config.batch_size, device=generator.loaded.device)
    mask = torch.ones_like(header)
    batch_index = len(list(_read_if_exists(path.with_suffix(".batches"))))
    with progress(total=config.magpie_turns, initial=len(kept), desc="magpie user turns") as bar:
        while len(kept) < config.magpie_turns and batch_index < 4 * config.magpie_turns // config.batch_size + 8:
            sampling = SamplingConfig(temperature=1.0, top_p=0.95, seed=config.seed * 100_003 + batch_index)
            result = generator.full_decoder.generate(header, mask, full_schedule(generator.num_layers),
                                                     max_new_tokens=64, sampling=sampling)
            fresh = []
            for tokens, reason in zip(result.tokens, result.finish_reasons):
                text = generator.text.decode_text(tokens).strip()  # the decoder leaves EOS out
                key = normalized(text)
                if reason == "eos" and good_user_turn(text) and key not in seen:
                    seen.add(key)
                    fresh.append(text)
            fresh = fresh[: config.magpie_turns - len(kept)]
            _append_jsonl(path, [{"prompt": t, "source": "magpie"} for t in fresh])
            _append_jsonl(path.with_suffix(".batches"), [{"batch": batch_index, "kept": len(fresh)}])
            kept += fresh
            batch_index += 1
            bar.update(len(fresh))
    return kept


# --- stage 2: the prompt list ------------------------------------------------------------------


def build_prompt_list(config: MakeDataConfig, magpie: Sequence[str]) -> list[PromptRecord]:
    """Every source, deduplicated against each other and the held-out sets, interleaved so that
    any prefix of the list (a smaller data size in the scaling curve) mixes all sources."""
    rng = random.Random(config.seed)
    by_source = {
        "magpie": list(magpie) if "magpie" in config.sources else [],
        "templates": template_prompts(config.template_prompts, rng) if "templates" in config.sources else [],
        "wordnet": wordnet_prompts(config.wordnet_prompts, rng) if "wordnet" in config.sources else [],
        "entities": entity_prompts(config.entity_questions, rng) if "entities" in config.sources else [],
        "pydoc": pydoc_prompts(config.pydoc_prompts, rng) if "pydoc" in config.sources else [],
    }
    seen = held_out_keys()
    unique: dict[str, list[str]] = {}
    for source, prompts in by_source.items():
        unique[source] = []
        for prompt in prompts:
            key = normalized(prompt)
            if key and key not in seen:
                seen.add(key)
                unique[source].append(prompt)
    records = []
    for prompt, source in _interleave(unique):
        records.append(PromptRecord(id=len(records), prompt=prompt, source=source, raw=source == "pydoc"))
    return records


def _interleave(groups: dict[str, list[str]]) -> Iterator[tuple[str, str]]:
    """Round-robin weighted by size: position i of a group of n lands near i/n of the whole list."""
    keyed = [((i + 0.5) / len(items), source, item) for source, items in groups.items() for i, item in enumerate(items)]
    for _, source, item in sorted(keyed, key=lambda k: k[0]):
        yield item, source


# --- stage 3: continuations --------------------------------------------------------------------


def write_continuations(generator, prompts: Sequence[PromptRecord], config: MakeDataConfig, folder: Path,
                        progress) -> DataManifest:
    """Greedy + sampled continuations of every prompt not yet done, appended chunk by chunk."""
    sequences_path, done_path = folder / "sequences.jsonl", folder / "prompts_done.jsonl"
    done = {r["id"] for r in _read_if_exists(done_path)}
    seen = {sequence_key(r["prompt"], r["target"]) for r in _read_if_exists(sequences_path)}
    manifest = _load_manifest(folder, config)
    todo = [p for p in prompts if p.id not in done]
    finished = len(prompts) - len(todo)
    with progress(total=len(prompts), initial=finished, desc="continuations (prompts)") as bar:
        for batch in _length_sorted_batches(generator, todo, config):
            records = [r for r in _continue_batch(generator, batch, config) if _is_new(r, seen, manifest)]
            _append_jsonl(sequences_path, records)
            _append_jsonl(done_path, [{"id": p.id} for p, _ in batch])
            manifest.sequences += len(records)
            manifest.target_tokens += sum(len(r["target"]) for r in records)
            finished += len(batch)
            manifest.prompts_done = finished
            bar.update(len(batch))
            bar.set_postfix(sequences=manifest.sequences, tokens=manifest.target_tokens)
            _save_manifest(folder, manifest)
    manifest.prompts_done = len(prompts)
    _save_manifest(folder, manifest)
    return manifest


def _length_sorted_batches(generator, prompts: Sequence[PromptRecord], config: MakeDataConfig,
                           chunk: int = 512) -> Iterator[list[tuple[PromptRecord, list[int]]]]:
    """Batches of similar prompt length (less padding), sorted within chunks of the list so that
    progress still moves through the list in order (a stopped run leaves a mixed prefix)."""
    for start in range(0, len(prompts), chunk):
        encoded = [(p, generator.text.encode([p.prompt], raw=p.raw)[0][0].tolist()[-config.max_prompt_tokens:])
                   for p in prompts[start:start + chunk]]
        encoded.sort(key=lambda item: len(item[1]))
        for i in range(0, len(encoded), config.batch_size):
            yield encoded[i:i + config.batch_size]


def _continue_batch(generator, batch: Sequence[tuple[PromptRecord, list[int]]], config: MakeDataConfig) -> list[dict]:
    ids, mask = left_padded([row for _, row in batch], generator.loaded.pad_token_id, generator.loaded.device)
    eos = generator.loaded.tokenizer.eos_token_id
    first_id = batch[0][0].id
    kinds = [("greedy", SamplingConfig())] + [
        (f"sampled{i}", SamplingConfig(temperature=config.temperature, seed=config.seed + 7919 * first_id + i))
        for i in range(config.samples)]
    decoder, schedule, label = _writer(generator, config, first_id)
    records = []
    for kind, sampling in kinds:
        result = decoder.generate(ids, mask, schedule, max_new_tokens=config.max_new_tokens, sampling=sampling)
        kind = f"{label}{kind}"
        for (prompt, prompt_ids), tokens, reason in zip(batch, result.tokens, result.finish_reasons):
            target = continuation_target(tokens, reason, eos)
            if len(target) >= 2:
                records.append({"prompt_id": prompt.id, "source": prompt.source, "kind": kind,
                                "prompt": prompt_ids, "target": target})
    return records


def _writer(generator, config: MakeDataConfig, batch_id: int):
    """(decoder, schedule, kind prefix) that writes a batch: the full model, or SkipDecode at one
    of the writer speedups (picked by the batch's first prompt id, so the speedups take turns)."""
    if config.writer == "full":
        return generator.full_decoder, full_schedule(generator.num_layers), ""

    speedup = config.writer_speedups[batch_id % len(config.writer_speedups)]
    solved = generator.schedules.schedule_for(ScheduleRequest(target_speedup=speedup), config.max_new_tokens)
    return generator.skip_decoder, solved.config, f"skip{speedup:g}x-"


def _is_new(record: dict, seen: set[str], manifest: DataManifest) -> bool:
    key = sequence_key(record["prompt"], record["target"])
    if key in seen:
        manifest.duplicates_dropped += 1
        return False
    seen.add(key)
    return True


# --- files -------------------------------------------------------------------------------------


def _read_if_exists(path: Path) -> Iterable[dict]:
    """The complete records of a JSONL file this command appends to. A last line cut by a kill is
    removed from the file first: its batch is redone, and later appends start on a clean line."""
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8")
    records, kept = [], 0
    for line in text.splitlines(keepends=True):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break
        if not line.endswith("\n"):
            break
        kept += len(line.encode("utf-8"))
    if kept < len(text.encode("utf-8")):
        with path.open("rb+") as handle:
            handle.truncate(kept)
        records = records[: text.encode("utf-8")[:kept].count(b"\n")]
    return records


def _append_jsonl(path: Path, records: Sequence[dict]) -> None:
    """One write per batch, flushed to disk: a killed run loses at most the batch in flight."""
    if not records:
        return
    with path.open("a", encoding="utf-8") as handle:
        handle.write("".join(json.dumps(r) + "\n" for r in records))
        handle.flush()
        os.fsync(handle.fileno())


def _load_manifest(folder: Path, config: MakeDataConfig) -> DataManifest:
    path = folder / "manifest.json"
    if path.is_file():
        stored = json.loads(path.read_text())
        return DataManifest(**{**stored, "config": asdict(config)})
    return DataManifest(config=asdict(config))


def _save_manifest(folder: Path, manifest: DataManifest) -> None:
    (folder / "manifest.json").write_text(json.dumps(asdict(manifest), indent=2, default=str))


# --- the command -------------------------------------------------------------------------------


def make_data(config: MakeDataConfig, progress=tqdm) -> DataManifest:
    """Run (or resume) every stage; returns the manifest (counts) of the folder."""
    if config.threads:
        torch.set_num_threads(config.threads)
    folder = Path(config.output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    device = resolve_device(config.device)
    weights = "none" if config.weights == "float" or device.type != "cpu" else config.weights
    adapter = config.adapter if config.writer == "skipdecode" else None
    generator = TextGenerator(load_model(config.model, device=str(device), dtype="float32", adapter=adapter,
                                         quantize=weights))
    if config.writer == "skipdecode" and not generator.loaded.adapter_path:
        raise ValueError("--writer skipdecode needs the skip policy it puts on-policy: this model has no adapter "
                         "(pass --adapter FOLDER)")
    torch.manual_seed(config.seed)
    prompts_path = folder / "prompts.jsonl"
    if config.prompts_from and not prompts_path.is_file():
        shared = Path(config.prompts_from) / "prompts.jsonl"
        if not shared.is_file():
            raise ValueError(f"--prompts-from {config.prompts_from}: no prompts.jsonl there (run make-data first)")
        prompts_path.write_text(shared.read_text(encoding="utf-8"), encoding="utf-8")
    if prompts_path.is_file():  # the list is fixed once written: resuming must not reshuffle it
        prompts = [PromptRecord(**r) for r in _read_if_exists(prompts_path)]
    else:
        magpie = (sample_user_turns(generator, config, folder / "user_turns.jsonl", progress)
                  if "magpie" in config.sources and config.magpie_turns else [])
        prompts = build_prompt_list(config, magpie)
        prompts_path.write_text("".join(json.dumps(asdict(p)) + "\n" for p in prompts), encoding="utf-8")
    manifest = _load_manifest(folder, config)
    manifest.prompts = len(prompts)
    manifest.prompts_by_source = {s: sum(p.source == s for p in prompts) for s in SOURCES}
    _save_manifest(folder, manifest)
    limit = prompts[: config.limit_prompts] if config.limit_prompts else prompts
    return write_continuations(generator, limit, config, folder, progress)
