"""Posts to distil the TL;DR skip policies from, made offline and never from the test posts.

No training split of Reddit TL;DR is available here, so the default model writes the posts itself: from
subreddit and title prompts this file composes (people, ages and an event, in the test set's subreddits),
sampled, one post per title. The distillation targets are then the task model's own greedy TL;DRs of
these posts (as E2E's policies were distilled from the task model's descriptions). ``assert_no_test_post``
guards that no title or post is a test post's.

    synthetic_titles   seeded titles in the shape of the test set's ("Me [24 F] with my boyfriend [26 M] ..."):
                       the composed ones (a few people and events), or varied ones (more people, events,
                       shapes, and the test set's subreddits in about its proportions)
    write_posts        the model's post for each title, appended to a JSONL file as they are written, so an
                       interrupted run resumes where it stopped
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from model.generation.generator import TextGenerator
from model.generation.runs import GenerationRequest
from model.generation.schedules import ScheduleRequest
from model.skipdecode.decoder import SamplingConfig
from model.tasks.tldr import TldrPost, read_posts

SUBREDDITS = ("relationships", "relationship_advice", "dating_advice", "AskReddit", "tifu", "legaladvice",
              "personalfinance", "Advice")
PEOPLE = ("boyfriend", "girlfriend", "husband", "wife", "best friend", "roommate", "mom", "dad", "sister",
          "brother", "boss", "coworker", "landlord", "ex", "fiance", "neighbour", "friend", "cousin")
EVENTS = ("forgot my birthday", "wants to move across the country", "read my messages", "lent money and never paid it back",
          "won't talk about the future", "got a job offer in another city", "keeps cancelling plans",
          "told everyone my secret", "wants to get a dog", "spends every weekend gaming", "lied about where they were",
          "invited their ex to the party", "wants us to split everything 50/50", "doesn't get along with my family",
          "broke my laptop", "is moving in next month", "kissed someone else at a party", "won't stop smoking",
          "asked me to lie for them", "stopped replying after our third date", "posted our fight online",
          "wants to quit their job", "forgot to pay the rent", "keeps borrowing my car", "is jealous of my friend")
ASKS = ("what should I do?", "am I overreacting?", "how do I bring it up?", "is this normal?",
        "should I end it?", "how do I move on?", "what are my options?")
TIFU_EVENTS = ("by locking myself out in a towel", "by sending a text to the wrong person", "by eating a whole chili",
               "by falling asleep on the train", "by cooking with the wrong salt", "by replying all at work",
               "by dyeing my hair green", "by losing my passport the day before a flight")


@dataclass(frozen=True)
class PostTitle:
    post_id: str  # "synthetic-<n>"
    subreddit: str
    title: str


def _age(rng: random.Random) -> str:
    return f"{rng.randint(17, 45)} {rng.choice('FM')}"


def synthetic_title(rng: random.Random, index: int) -> PostTitle:
    subreddit = rng.choice(SUBREDDITS)
    if subreddit == "tifu":
        return PostTitle(f"synthetic-{index}", subreddit, f"TIFU {rng.choice(TIFU_EVENTS)}")
    person, event, ask = rng.choice(PEOPLE), rng.choice(EVENTS), rng.choice(ASKS)
    title = f"My [{_age(rng)}] {person} [{_age(rng)}] {event}, {ask}"
    if subreddit in ("AskReddit", "personalfinance", "legaladvice", "Advice") and rng.random() < 0.5:
        title = f"My {person} {event}. {ask[0].upper()}{ask[1:]}"
    return PostTitle(f"synthetic-{index}", subreddit, title)


# The varied titles (``varied_title``): the subreddits in about the test set's proportions (relationships
# first) and the shapes its posters use ("Me [25F] with my SO [27 M] of 3 years, ..."), with many more
# people and events than the composed ones, so a policy meets titles it has not seen a hundred times.
VARIED_SUBREDDITS = (("relationships", 50), ("AskReddit", 11), ("tifu", 9), ("relationship_advice", 9),
                     ("dating_advice", 5), ("legaladvice", 4), ("loseit", 3), ("jobs", 3), ("offmychest", 3),
                     ("personalfinance", 2), ("self", 1))
VARIED_PEOPLE = ("boyfriend", "girlfriend", "husband", "wife", "SO", "GF", "BF", "best friend", "friend", "roommate",
                 "mom", "dad", "mother", "father", "sister", "brother", "stepdad", "stepmom", "grandma", "boss",
                 "coworker", "manager", "landlord", "ex", "ex-boyfriend", "ex-girlfriend", "fiance", "fiancee",
                 "neighbour", "cousin", "aunt", "uncle", "in-laws", "crush", "date", "teacher", "classmate",
                 "flatmate", "son", "daughter")
VARIED_EVENTS = ("won't introduce me to their parents", "went through my phone", "wants an open relationship",
                 "is still texting their ex", "forgot our anniversary", "hates my best friend", "wants to move in together",
                 "never pays for anything", "got drunk and said something cruel", "is moving abroad for a year",
                 "wants to get married next year", "doesn't want kids", "keeps making plans without me",
                 "told me they have feelings for me", "blames me for their bad day", "ignores me when their friends are around",
                 "is addicted to their phone", "stopped wanting to have sex", "lied about their age",
                 "has a lot of debt they never told me about", "gets jealous when I go out", "won't go to therapy",
                 "wants me to quit my job", "ghosted me after two months", "met someone online", "kissed my friend",
                 "keeps bringing up my past", "gave my dog away", "wants to take a break", "reads my diary",
                 "won't clean up after themselves", "is always late", "posts about me online", "asked to borrow $2000",
                 "refuses to meet my family", "cheated on me last year", "is pressuring me to lose weight",
                 "doesn't support my career", "spends all our savings", "wants to move back home",
                 "plays video games all night", "invited their ex to our wedding", "never texts back",
                 "changed after getting a new job", "makes fun of my accent", "won't let me see my friends",
                 "threw a party while I was away", "is getting divorced", "got fired and hid it from me",
                 "broke up with me over text")
VARIED_DURATIONS = ("3 months", "6 months", "8 months", "a year", "1 year", "2 years", "3 years", "4 years",
                    "5 years", "7 years", "10 years", "a few weeks")
VARIED_FEELINGS = ("I don't know how to feel", "I can't stop thinking about it", "I feel like I'm losing my mind",
                   "I'm not sure if I'm overreacting", "I don't know what to do anymore", "I feel betrayed",
                   "I don't know how to bring it up")
VARIED_ASKS = ("What should I do?", "Am I overreacting?", "How do I talk to them about it?", "Is this a red flag?",
               "Should I break up?", "How do I get over it?", "Is it normal?", "How do I handle this?",
               "Am I the one in the wrong?", "Need advice.")
VARIED_TIFU = ("by texting my boss instead of my girlfriend", "by locking my keys in the car at the airport",
               "by eating my roommate's special brownies", "by falling asleep in a job interview",
               "by washing my phone with my jeans", "by calling my teacher mom", "by microwaving a fork",
               "by trying to fix the sink myself", "by waving at someone who wasn't waving at me",
               "by forgetting my own birthday party", "by sitting on wet paint", "by telling my date about my ex",
               "by shaving my eyebrows off", "by leaving the oven on all day", "by reading the wrong speech at a wedding",
               "by feeding my dog chocolate", "by using my sister's shampoo", "by taking the wrong bus home",
               "by replying to a scam email", "by going to work on a holiday")
VARIED_ASKREDDIT = ("Reddit, what is the worst {thing} you have ever {did}?", "What {thing} changed your life?",
                    "People who {did} a {thing}, how did it go?", "What's a {thing} everyone should try once?",
                    "Reddit, how do you deal with a {thing} you {did}?")
VARIED_THINGS = ("job", "first date", "roommate", "gift", "road trip", "break up", "apology", "mistake", "boss",
                 "holiday", "haircut", "wedding", "move", "argument", "habit")
VARIED_DIDS = ("had", "got", "gave", "made", "survived", "regretted", "went through")
VARIED_OTHER = {
    "legaladvice": ("My landlord kept my deposit after I moved out, what can I do?",
                    "My employer hasn't paid me for {n} weeks, {ask_l}", "I got a ticket for something I didn't do, {ask_l}",
                    "My neighbour's tree fell on my car, who pays?", "My roommate moved out and left me with the rent, {ask_l}"),
    "loseit": ("I lost {n} pounds but my {p} says I look sick", "How do I stay on my diet on a {n} day vacation?",
               "Down {n} lbs and my {p} keeps bringing me junk food", "Plateaued for {n} weeks, {ask_l}"),
    "jobs": ("I got an offer from another company, should I tell my {p}?", "My {p} takes credit for my work, {ask_l}",
             "I've been unemployed for {n} months, {ask_l}", "Quitting my job after {n} years, {ask_l}"),
    "offmychest": ("My {p} never believed in me and I just graduated", "I finally told my {p} how I feel",
                   "I miss my {p} and I can't tell anyone"),
    "personalfinance": ("My {p} wants me to co-sign a loan, {ask_l}", "I have ${n},000 in debt at 22, {ask_l}",
                        "My {p} keeps asking me for money, {ask_l}"),
    "self": ("I think I'm finally happy, after {n} years", "I pushed my {p} away and I regret it"),
}


def _varied_age(rng: random.Random) -> str:
    age, sex = rng.randint(16, 45), rng.choice("FM")
    return rng.choice((f"[{age} {sex}]", f"[{age}{sex}]", f"({age}/{sex.lower()})", f"[{age}/{sex.lower()}]",
                       f"({age}{sex})"))


def varied_title(rng: random.Random, index: int) -> PostTitle:
    names, weights = zip(*VARIED_SUBREDDITS)
    subreddit = rng.choices(names, weights)[0]
    person, event, ask = rng.choice(VARIED_PEOPLE), rng.choice(VARIED_EVENTS), rng.choice(VARIED_ASKS)
    me, them = _varied_age(rng), _varied_age(rng)
    if subreddit == "tifu":
        title = f"TIFU {rng.choice(VARIED_TIFU)}"
    elif subreddit == "AskReddit":
        title = rng.choice(VARIED_ASKREDDIT).format(thing=rng.choice(VARIED_THINGS), did=rng.choice(VARIED_DIDS))
    elif subreddit in VARIED_OTHER:
        title = rng.choice(VARIED_OTHER[subreddit]).format(p=person, n=rng.randint(2, 30),
                                                           ask_l=ask[0].lower() + ask[1:])
    else:
        shapes = (f"Me {me} with my {person} {them} of {rng.choice(VARIED_DURATIONS)}, they {event}. {ask}",
                  f"My {person} {them} {event}. {ask}",
                  f"I {me} found out my {person} {them} {event} and {rng.choice(VARIED_FEELINGS)}",
                  f"{me} My {person} {them} {event}, {rng.choice(VARIED_FEELINGS)}. {ask}",
                  f"Me {me} and my {person} {them} of {rng.choice(VARIED_DURATIONS)}: {event}",
                  f"How do I deal with my {person} {them} who {event}?")
        title = rng.choice(shapes)
    return PostTitle(f"varied-{index}", subreddit, title)


def synthetic_titles(count: int, seed: int = 0, varied: bool = False) -> list[PostTitle]:
    """``count`` distinct seeded titles (a repeat is drawn again): the composed ones, or ``varied`` ones."""
    rng = random.Random(seed)
    titles: list[PostTitle] = []
    seen: set[str] = set()
    draw = varied_title if varied else synthetic_title
    while len(titles) < count:
        title = draw(rng, len(titles))
        if title.title not in seen:
            seen.add(title.title)
            titles.append(title)
    return titles


def post_prompt(title: PostTitle) -> str:
    return (f"Write a Reddit post for r/{title.subreddit} with the title \"{title.title}\". Write it in the first "
            "person, about 200 words, telling what happened with names of places and times, and end with the "
            "question you want answered. Write only the post.")


def assert_no_test_post(posts: Iterable[TldrPost | PostTitle], test_posts: Sequence[TldrPost] | None = None) -> None:
    """Raise if any title (or post text) is a test post's: the test posts are never trained on."""
    test = list(test_posts) if test_posts is not None else read_posts()
    titles = {post.title.strip().lower() for post in test}
    texts = {post.post.strip().lower() for post in test}
    for post in posts:
        if post.title.strip().lower() in titles or (isinstance(post, TldrPost) and post.post.strip().lower() in texts):
            raise ValueError(f"{post.post_id} repeats a test post ({post.title[:60]!r}): never train on the test set")


def _written_ids(path: Path) -> set[str]:
    """The titles a run already drew: written to ``path``, or dropped as too short (beside it, .skipped)."""
    written = ({json.loads(line)["post_id"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()}
               if path.is_file() else set())
    skipped = path.with_suffix(".skipped")
    return written | (set(skipped.read_text().split()) if skipped.is_file() else set())


def write_posts(generator: TextGenerator, titles: Sequence[PostTitle], path: Path, batch_size: int = 16,
                max_new_tokens: int = 320, min_words: int = 80, seed: int = 0) -> int:
    """The model's post for each title not yet in ``path`` (sampled: temperature 0.8, top-p 0.95, each batch its
    own seed), appended as JSONL rows as each batch ends; posts under ``min_words`` words are dropped. Returns the
    rows written by this call."""
    assert_no_test_post(titles)
    done = _written_ids(path)
    todo = [title for title in titles if title.post_id not in done]
    path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    for start in range(0, len(todo), batch_size):
        batch = todo[start:start + batch_size]
        result = generator.generate(GenerationRequest(
            prompts=tuple(post_prompt(title) for title in batch), max_new_tokens=max_new_tokens,
            schedule=ScheduleRequest(full=True), sampling=SamplingConfig(temperature=0.8, top_p=0.95, seed=seed + start)))
        rows = [{"post_id": title.post_id, "subreddit": title.subreddit, "title": title.title, "post": text.strip()}
                for title, text in zip(batch, result.outputs) if len(text.split()) >= min_words]
        with path.open("a", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        # a short post is marked written too, so a resumed run does not draw it again
        kept = {row["post_id"] for row in rows}
        with path.with_suffix(".skipped").open("a", encoding="utf-8") as handle:
            handle.writelines(title.post_id + "\n" for title in batch if title.post_id not in kept)
        written += len(rows)
    return written


def read_synthetic_posts(path: Path) -> list[TldrPost]:
    """The written posts as TldrPosts (no reference: their targets are the task model's own TL;DRs)."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [TldrPost(row["post_id"], row["subreddit"], row["title"], row["post"], "") for row in rows]
