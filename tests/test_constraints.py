"""Decoding constraints (batch/toc/constraints.py, docs/running-toc.md#constrained-decoding): the grammar builders checked with xgrammar's own
matcher (the backend vLLM compiles them with), the config switches, the cache key, and — with the real
engine — constrained clarifications that parse, constrained quotes the checker finds verbatim at their
offsets, and a constrained run that replays identically under all three schedulers."""

from __future__ import annotations

import json
import random

import polars as pl
import pytest

from clarify.batch import config
from clarify.batch.toc.constraints import answer_grammar, clarify_grammar, quote_words, quotes_grammar
from clarify.batch.toc.format import (
    FORMAT_END_TOKENS,
    FORMAT_MAX_DA,
    FORMAT_MAX_DQ,
    FORMAT_MAX_PAIRS,
    FORMAT_MAX_TOKENS,
    FORMAT_MAX_WORD_CHARS,
    FORMAT_PAIR_TOKENS,
    FORMAT_TOKENS_PER_WORD,
    format_grammar,
    parse_disambiguations,
)
from clarify.batch.toc.quotes import check_answers, normalise
from clarify.batch.toc.settings import TreeSettings
from clarify.files import data_dir
from clarify.local_llm.engine import GenParams, request_key
from clarify.schemas import Passage
from tests.run_fixtures import SMALL

xgrammar = pytest.importorskip("xgrammar")
from xgrammar.testing import _get_matcher_from_grammar  # noqa: E402  (after the skip)


def accepts(grammar: str, text: str) -> bool:
    """xgrammar's matcher (no tokenizer: strings only) accepts all of `text` and may end there."""
    m = _get_matcher_from_grammar(grammar)
    return m.accept_string(text) and m.is_terminated()


# -- the format grammar ---------------------------------------------------------------------------------
FORMAT_OK = [
    "DQ 1: Who won in 2010?\nDA 1: Spain",
    "DQ 1: Who won in 2010?\nDA 1: Spain; the Netherlands\nDQ 2: Who won in 2014?\nDA 2: Germany",
    "DQ 1: Who won?\nDA 1: Spain\n\nAnswer:",
    "DQ 1: Who " + "y" * (FORMAT_MAX_WORD_CHARS - 1) + "?\nDA 1: " + "x" * FORMAT_MAX_WORD_CHARS,
    "".join(f"DQ {i}: q{i}?\nDA {i}: a{i}\n" for i in range(1, FORMAT_MAX_PAIRS)) + f"DQ {FORMAT_MAX_PAIRS}: q?\nDA {FORMAT_MAX_PAIRS}: a",
]
FORMAT_BAD = [
    "",
    "DQ 1: Who won?",  # a question without its answer
    "DQ 1: Who won?\nDA 1: ",  # an empty answer
    "DQ 1: Who won?\nDA 1: ; Spain",  # an answer the parser would drop the first part of
    "DQ 2: Who won?\nDA 2: Spain",  # numbering starts at 1
    "DQ 1: Who won?\nDA 1: Spain\nDQ 3: Who?\nDA 3: x",  # and counts up
    "DQ 1:  \nDA 1: Spain",  # an empty question
    "Disambiguations:\nDQ 1: Who won?\nDA 1: Spain",
    "DQ 1: Who won?\nDA 1: Spain\nThe answer is Spain.",
    "".join(f"DQ {i}: q?\nDA {i}: a\n" for i in range(1, FORMAT_MAX_PAIRS + 2)).rstrip("\n"),  # past FORMAT_MAX_PAIRS
    "DQ 1: " + "The World Boa, " * (FORMAT_MAX_DQ // 3 + 1) + "\nDA 1: x",  # a line past FORMAT_MAX_DQ words (a looping model)
    "DQ 1: Who?\nDA 1: " + "Boa; " * FORMAT_MAX_DA + "Boa",  # past FORMAT_MAX_DA words
    "DQ 1: Who?\nDA 1: a" + "x" * FORMAT_MAX_WORD_CHARS,  # a word past FORMAT_MAX_WORD_CHARS (words glued together)
    "DQ 1: Who " + "y" * FORMAT_MAX_WORD_CHARS + "?\nDA 1: a",
]


@pytest.mark.parametrize("text", FORMAT_OK)
def test_format_grammar_accepts_the_official_format_and_it_parses(text):
    assert accepts(format_grammar(), text)
    parsed = parse_disambiguations(text.removesuffix("\n\nAnswer:"))
    assert parsed.error is None and len(parsed.pairs) == text.count("DA ")


@pytest.mark.parametrize("text", FORMAT_BAD)
def test_format_grammar_refuses_what_does_not_parse_as_the_official_format(text):
    assert not accepts(format_grammar(), text)


def test_every_prefix_the_format_grammar_can_stop_at_parses():
    """Random completions the grammar accepts, built from its own rules: each parses without a note."""
    rng = random.Random(7)
    chars = "abcXYZ0189;:-?.\"'é"

    def line(first: str, max_words: int) -> str:  # words of the grammar's characters, single spaces
        words = [rng.choice(first) + "".join(rng.choice(chars) for _ in range(rng.randint(0, FORMAT_MAX_WORD_CHARS - 1)))]
        words += ["".join(rng.choice(chars) for _ in range(rng.randint(1, FORMAT_MAX_WORD_CHARS)))
                  for _ in range(rng.randint(0, max_words - 1))]
        return " ".join(words)

    for _ in range(200):
        n = rng.randint(1, FORMAT_MAX_PAIRS)
        lines = []
        for i in range(1, n + 1):
            lines += [f"DQ {i}: {line('abcXYZé?', FORMAT_MAX_DQ)}", f"DA {i}: {line('abcXYZ01é', FORMAT_MAX_DA)}"]
        text = "\n".join(lines)
        assert accepts(format_grammar(), text), text
        parsed = parse_disambiguations(text)
        assert parsed.error is None and len(parsed.pairs) == n, (text, parsed)


def test_the_longest_constrained_clarification_fits_in_clarify_max_tokens(llm_model_dir):
    """The format's caps are derived so that FORMAT_MAX_PAIRS pairs fit in the default clarify_max_tokens
    (batch/toc/format.py): the arithmetic, and its inputs measured with the embedded model's tokenizer on
    ASQA dev's gold pairs cut to the caps (a pair's fixed tokens, the 95th percentile of tokens per word)."""
    from transformers import AutoTokenizer

    assert FORMAT_MAX_TOKENS <= config.load(None).toc.clarify_max_tokens
    tok = AutoTokenizer.from_pretrained(llm_model_dir)

    def n(text: str) -> int:
        return len(tok(text, add_special_tokens=False)["input_ids"])

    fixed = n(f"DQ {FORMAT_MAX_PAIRS}: \nDA {FORMAT_MAX_PAIRS}: \n")
    assert fixed <= FORMAT_PAIR_TOKENS and n("\n\nAnswer:") <= FORMAT_END_TOKENS
    gold = json.loads((data_dir() / "asqa" / "dev.json").read_text(encoding="utf-8"))["dev"]
    per_word = []
    for ex in gold.values():
        for qa in ex["qa_pairs"]:
            q = " ".join(qa["question"].split()[:FORMAT_MAX_DQ])
            a = " ".join("; ".join(qa["short_answers"]).split()[:FORMAT_MAX_DA])
            per_word.append((n(f"DQ 1: {q}\nDA 1: {a}\n") - fixed) / (len(q.split()) + len(a.split())))
    per_word.sort()
    assert per_word[int(0.95 * len(per_word))] <= FORMAT_TOKENS_PER_WORD


# -- the quotes grammar --------------------------------------------------------------------------------
SOURCE = Passage("p1", "Paris", "Paris is the capital of France,  with 2.1 million people [citation].\n"
                 "Its mayor is Anne Hidalgo; the café is «open».")


def word_runs(text: str) -> set[str]:
    words = quote_words(text)
    runs = set()
    for i in range(len(words)):
        s = ""
        for j in range(i, len(words)):
            if "[" in words[j][0] or "]" in words[j][0]:
                break
            s += words[j][0]
            runs.add(s)
            s += words[j][1]
    return runs


def test_quotes_grammar_accepts_exactly_the_runs_of_a_sources_words():
    g = quotes_grammar([SOURCE])
    runs = word_runs(SOURCE.text) | word_runs(SOURCE.title)
    assert {"capital of France,", "2.1 million", "France, with", "citation", "Hidalgo; the café is «open»."} <= runs
    # every run, as a marker inside free text, is accepted
    for r in runs:
        assert accepts(g, f"[1 {r}] indeed."), r
    # and the near misses are not: part of a word, another case, doubled spaces, a bracket, another source
    rng = random.Random(3)
    for r in rng.sample(sorted(runs), 40):
        for bad in (r[1:], r[:-1], r.upper(), r.replace(" ", "  "), r + " [x]", "x" + r):
            assert accepts(g, f"[1 {bad}]") == (bad in runs), bad
    for text in ("[2 Paris]", "[1 ]", "[1 Paris", "[Paris]", "[1 people [citation]]", "[1 capital of Paris]"):
        assert not accepts(g, text), text
    # text outside markers is free (but for `[`), but an answer opens with a marker, so holds one
    assert accepts(g, "[1 Paris] (the city), population: [1 2.1 million]!\nSo: big.") and accepts(g, "[1 Paris]")
    for text in ("Paris (the city), population: 2.1 million!", "", "It is [1 Paris]", " [1 Paris]"):
        assert not accepts(g, text), text


def test_quotes_grammar_numbers_sources_as_the_prompt_does():
    a, b = Passage("a", "A", "alpha beta"), Passage("b", "B", "gamma delta")
    g = quotes_grammar([a, b])
    assert accepts(g, "[1 alpha beta] and [2 gamma] or [1 A]") and not accepts(g, "alpha and gamma")
    assert not accepts(g, "[1 gamma]") and not accepts(g, "[3 alpha]")
    assert accepts(quotes_grammar([]), "no sources, free text")


def test_every_word_run_of_every_quotesum_source_is_verbatim_for_the_checker():
    """The grammar writes a run of words with one space for each whitespace run; batch/toc/quotes.py's checker
    must find each such run verbatim in its source, at offsets that hold it (all shipped QuoteSum sources,
    random runs of each)."""
    rng = random.Random(11)
    rows, sources = [], {}
    for line in (data_dir() / "quotesum" / "dev.jsonl").read_text(encoding="utf-8").splitlines():
        obj = json.loads(line)
        for k in range(1, 9):
            text = obj.get(f"source{k}")
            if text and text not in sources.values():
                sources[f"s{len(sources)}"] = text
    answers = []
    for pid, text in sources.items():
        words = quote_words(text)
        marked = []
        for _ in range(3):
            i = rng.randrange(len(words))
            j = min(len(words), i + rng.randint(1, 12))
            run = "".join(w + (s if n < j - 1 else "") for n, (w, s) in enumerate(words[i:j], i))
            if "[" in run or "]" in run:
                continue
            marked.append(f"[1 {run}]")
        answers.append({"qid": pid, "answer": " and ".join(marked), "passage_ids": [pid]})
        rows.append({"passage_id": pid, "title": "", "text": text})
    checked, spans = check_answers(pl.DataFrame(answers), pl.DataFrame(rows), repair_threshold=1.0, progress=False)
    assert len(sources) > 200 and spans.height > 600
    assert (spans["status"] == "verbatim").all(), spans.filter(pl.col("status") != "verbatim").head(3)
    for s in spans.iter_rows(named=True):
        assert normalise(sources[s["passage_id"]][s["start"]:s["end"]])[0] == normalise(s["text"])[0]


# -- switches, params, cache key ------------------------------------------------------------------------
def test_an_invisible_word_is_no_word_the_grammar_can_quote():
    """A source "word" of zero-width or other invisible characters only is what the checker's `normalise`
    drops: the grammar never quotes it alone (`[1 \u200b]` would be an empty span), and the words around it
    join with the space the checker sees."""
    src = Passage("p", "", "Paris \u200b is\u00ad big \u2060\u200d today")
    g = quotes_grammar([src])
    for bad in ("[1 \u200b]", "[1 \u00ad]", "[1 \u2060]", "[1 Paris \u200b is]"):
        assert not accepts(g, bad), bad
    runs = ["Paris is", "Paris is big today", "is", "big today"]
    for run in runs:
        assert accepts(g, f"[1 {run}]"), run
    answers = pl.DataFrame({"qid": [str(i) for i in range(len(runs))], "answer": [f"[1 {r}]" for r in runs],
                            "passage_ids": [["p"]] * len(runs)})
    _, spans = check_answers(answers, pl.DataFrame([{"passage_id": "p", "title": "", "text": src.text}]),
                             repair_threshold=1.0, progress=False)
    assert (spans["status"] == "verbatim").all(), spans


def test_a_lone_surrogate_in_a_source_breaks_the_chain_and_the_grammar_compiles():
    g = quotes_grammar([Passage("p", "T\udc80", "alpha \ud800 beta gamma")])
    g.encode("utf-8")  # a grammar vLLM can send on
    assert accepts(g, "[1 beta gamma]") and accepts(g, "[1 alpha]") and accepts(g, "[1 T]")
    assert not accepts(g, "[1 alpha beta]")


def test_the_grammar_quotes_at_most_its_cap_of_words_shared_over_the_sources(monkeypatch):
    """20,000 source words (8 sources of 2,500): each source's first words up to an equal share of
    GRAMMAR_MAX_UNITS are quotable, the rest is not; below the cap the grammar is the uncapped one (the
    largest QuoteSum dev source set, 934 words)."""
    from clarify.batch.toc import constraints

    sources = [Passage(f"p{k}", f"Title {k}", " ".join(f"w{k}x{i}" for i in range(2500))) for k in range(1, 9)]
    g = quotes_grammar(sources)
    lines = g.splitlines()
    assert sum(line.startswith("s") for line in lines) == constraints.GRAMMAR_MAX_UNITS  # a word of <= 8 bytes: 1 unit
    share = (constraints.GRAMMAR_MAX_UNITS - 2 * 8) / 8  # the titles' two words each, then equal shares
    for k in range(1, 9):
        n = sum(line.startswith(f"s{k}t_") for line in lines)
        assert int(share) <= n <= int(share) + 1 and f"s{k}h_1 ::=" in g and f'"[{k} " q{k} "]"' in g
        assert f's{k}t_{n - 1} ::= "w{k}x{n - 1}"\n' in g + "\n"  # its first n words, the last one ends the chain
    assert g.count(" ::= ") < 3 * constraints.GRAMMAR_MAX_UNITS
    rows = [json.loads(line) for line in (data_dir() / "quotesum" / "dev.jsonl").read_text(encoding="utf-8").splitlines()]
    biggest = max(rows, key=lambda o: sum(len(quote_words(o.get(f"source{k}") or "")) for k in range(1, 9)))
    srcs = [Passage(f"p{k}", biggest.get(f"title{k}") or "", biggest.get(f"source{k}") or "") for k in range(1, 9)]
    capped = quotes_grammar(srcs)
    monkeypatch.setattr(constraints, "GRAMMAR_MAX_UNITS", 10**9)
    assert quotes_grammar(srcs) == capped
    assert quotes_grammar(sources).count(" ::= ") > 20_000


def test_switches_are_off_by_default_and_recorded_in_the_frozen_config():
    cfg = config.load(None)
    assert (cfg.toc.constrain_format, cfg.answer.constrain_quotes) == (False, False)
    tree = TreeSettings.of(cfg)  # what the tree program decodes by
    assert clarify_grammar(tree) is None and answer_grammar(tree, [SOURCE]) is None
    on = config.load(None, {"toc.constrain_format": True, "answer.constrain_quotes": True})
    frozen = json.loads(on.to_json())
    assert frozen["toc"]["constrain_format"] is True and frozen["answer"]["constrain_quotes"] is True
    assert config.from_dict(frozen) == on
    tree = TreeSettings.of(on)
    assert clarify_grammar(tree) == format_grammar() and answer_grammar(tree, [SOURCE]) == quotes_grammar([SOURCE])
    # the free answer style has no markers: nothing to constrain
    free = config.load(None, {"answer.constrain_quotes": True, "answer_style": "free"})
    assert answer_grammar(TreeSettings.of(free), [SOURCE]) is None
    with pytest.raises(Exception, match="constrain_quotes"):
        config.load(None, {"answer.constrain_quotes": "yes"})


def test_the_grammar_is_part_of_the_cache_key_and_absent_keeps_old_keys():
    p = GenParams(temperature=0.7, max_tokens=8, seed=1)
    # the key a request had before GenParams had a grammar field (same dict, no "grammar" entry)
    old = {"temperature": 0.7, "top_p": 1.0, "max_tokens": 8, "stop": (), "seed": 1, "n": 1, "choices": None}
    assert p.as_dict() == old
    g = GenParams(temperature=0.7, max_tokens=8, seed=1, grammar=format_grammar())
    assert request_key("m", "x", g) != request_key("m", "x", p)
    assert request_key("m", "x", g) != request_key("m", "x", GenParams(temperature=0.7, max_tokens=8, seed=1,
                                                                        grammar=quotes_grammar([SOURCE])))
    with pytest.raises(ValueError):
        GenParams(grammar="root ::= \"a\"", choices=("a",))


# -- the real engine ------------------------------------------------------------------------------------
CONSTRAINED = {"toc.constrain_format": True, "answer.constrain_quotes": True, "answer_style": "quoted"}


@pytest.fixture(scope="module")
def constrained_run(tmp_path_factory, default_local_index, llm_engine):
    """1 ASQA question, both constraints on, driven by the continuous scheduler on vLLM's step loop."""
    from clarify.batch.run.resources import open_resources, prepare
    from clarify.batch.run.scheduler import drive
    from clarify.batch.toc.tree import Tree

    tmp = tmp_path_factory.mktemp("constrained")
    cfg = config.load(None, {"limit": 1, **CONSTRAINED, **SMALL})
    prep = prepare(cfg, index=default_local_index, engine_factory=lambda c: llm_engine)
    questions = prep.questions

    def resources():
        return open_resources(prep, tmp / "cache")

    def trees():
        return [Tree.new(q, text) for q, text in zip(questions["qid"], questions["question"])]

    res, cont_trees = resources(), trees()
    rec = drive("continuous", cont_trees, res, TreeSettings.of(cfg))
    res.engine.flush()
    return cfg, rec, cont_trees, resources, trees


@pytest.mark.integration
def test_real_constrained_clarifications_all_parse(constrained_run):
    _, rec, _, _, _ = constrained_run
    calls = pl.DataFrame(rec.llm_calls)
    clarify = calls.filter(pl.col("step") == "clarify")
    assert clarify.height >= 1
    # every completion the grammar let finish parses
    finished = clarify.filter(pl.col("finish_reason") == "stop")
    assert finished["parse_error"].is_null().all(), finished.select("completion", "parse_error").rows()
    # one cut at max_tokens is a prefix of the format (its last pair lost at most): the engine kept the grammar
    for row in clarify.iter_rows(named=True):
        m = _get_matcher_from_grammar(format_grammar())
        assert m.accept_string(row["completion"]), row["completion"]
        assert row["finish_reason"] in ("stop", "length")


@pytest.mark.integration
def test_real_constrained_quotes_are_verbatim_at_their_offsets(constrained_run, default_local_index, tmp_path,
                                                               llm_engine):
    from clarify.batch.run.pipeline import run

    _, rec, _, resources, _ = constrained_run
    res = resources()
    answers = pl.DataFrame(rec.answers)
    ids = list(dict.fromkeys(p for ps in answers["passage_ids"] for p in ps))
    store = res.passages(ids)
    passages = pl.DataFrame([{"passage_id": p.passage_id, "title": p.title, "text": p.text} for p in store.values()])
    # QuoteSum: the question's own sources, answers only (cheap); both runs' spans checked alike
    cfg = config.load(None, {"dataset": "quotesum", "limit": 2, **CONSTRAINED, **SMALL})
    run(cfg, tmp_path / "qs", engine_factory=lambda c: llm_engine, index=default_local_index, progress=False)
    qs_answers = pl.read_parquet(tmp_path / "qs" / "answers.parquet")
    qs_passages = pl.read_parquet(tmp_path / "qs" / "passages.parquet")
    n_spans = 0
    for ans, pas in ((answers, passages), (qs_answers.select("qid", pl.col("answer_raw").alias("answer"),
                                                             "passage_ids"), qs_passages)):
        checked, spans = check_answers(ans.select("qid", "answer", "passage_ids"), pas, progress=False)
        n_spans += spans.height
        # every answer quotes: the grammar opens it with a marker
        assert set(spans["qid"]) == set(ans["qid"]), (ans["answer"].to_list(), spans["qid"].to_list())
        assert (spans["status"] == "verbatim").all(), spans.select("text", "status").rows()
        text = {r["passage_id"]: r for r in pas.iter_rows(named=True)}
        for s in spans.iter_rows(named=True):
            field = text[s["passage_id"]]["text" if s["field"] == "text" else "title"]
            assert normalise(field[s["start"]:s["end"]])[0] == normalise(s["text"])[0]
    summary = json.loads((tmp_path / "qs" / "summary.json").read_text())
    assert summary["constraints"] == {"format": True, "quotes": True}
    assert summary["quote_fidelity"]["n_spans"] == 0 or summary["quote_fidelity"]["share_verbatim"] == 1.0
    assert n_spans > 0  # the model did quote (a vacuous pass would test nothing)


@pytest.mark.integration
def test_real_constrained_run_replays_identically_under_every_scheduler(constrained_run, llm_engine):
    from clarify.batch.run.pipeline import nodes_table
    from clarify.batch.run.scheduler import drive

    cfg, rec, cont_trees, resources, trees = constrained_run
    calls = pl.DataFrame(rec.llm_calls)
    for name in ("waves", "sequential"):
        before = llm_engine.stats.prompts
        res = resources()
        replay_trees = trees()
        got = drive(name, replay_trees, res, TreeSettings.of(cfg))
        assert llm_engine.stats.prompts == before, name  # all from the cache: the grammar is in the key
        assert nodes_table(replay_trees).equals(nodes_table(cont_trees)), name
        assert pl.DataFrame(got.answers).equals(pl.DataFrame(rec.answers)), name
        assert pl.DataFrame(got.llm_calls).drop("cached").equals(calls.drop("cached")), name


def test_command_line_flags_set_the_switches():
    from clarify.batch.cli import build_parser
    from clarify.batch.cli.commands import _overrides

    args = build_parser().parse_args(["run", "--out", "x", "--constrain-format", "--constrain-quotes"])
    cfg = config.load(None, _overrides(args))
    assert cfg.toc.constrain_format and cfg.answer.constrain_quotes
    cfg = config.load(None, _overrides(build_parser().parse_args(["run", "--out", "x"])))
    assert not cfg.toc.constrain_format and not cfg.answer.constrain_quotes


def test_demo_decodes_constrained_and_says_so_and_an_unconstrained_demo_resumes_so(tmp_path, monkeypatch, capsys):
    """`clarify demo` decodes under both constraints (better on the embedded model:
    docs/running-toc.md#constrained-decoding) and says so, with `clarify run` keeping the official default; a
    demo started without them resumes without them."""
    import types

    from clarify.batch.cli import build_parser, commands, demo_sizing
    from clarify.batch.run import pipeline, resources

    got = []

    class Ran(Exception):
        pass

    def fake_run(cfg, out, **kw):
        got.append(cfg)
        raise Ran

    monkeypatch.setattr(pipeline, "run", fake_run)
    monkeypatch.setattr(resources, "engine_for", lambda model, tree: types.SimpleNamespace(cpu=None, device="cpu",
                                                                                           dtype="float32"))
    monkeypatch.setattr(demo_sizing, "probe_speed", lambda engine, **kw: demo_sizing.Probe(1.0, 2.0, 6, 1000.0))
    monkeypatch.setattr("clarify.index.ensure_default_index", lambda: tmp_path / "index")
    with pytest.raises(Ran):
        commands.cmd_demo(build_parser().parse_args(["demo", "--limit", "3", "--out", str(tmp_path / "d")]))
    assert got[-1].toc.constrain_format and got[-1].answer.constrain_quotes
    out = capsys.readouterr().out
    assert "decoding constrained to the DQ/DA format and verbatim quotes" in out
    assert "`clarify run` keeps the official free decoding" in out
    # a demo frozen with the constraints off (before they were the demo's) keeps its settings
    from tests.run_fixtures import write_run

    write_run(tmp_path / "old", {"limit": 3})
    with pytest.raises(Ran):
        commands.cmd_demo(build_parser().parse_args(["demo", "--out", str(tmp_path / "old")]))
    assert not got[-1].toc.constrain_format and not got[-1].answer.constrain_quotes
    assert "decoding constrained" not in capsys.readouterr().out
    # `clarify run` keeps the official default
    assert not config.load(None, commands._overrides(build_parser().parse_args(["run", "--out", "x"]))).toc.constrain_format


def test_compare_table_shows_the_switches_of_each_run(tmp_path, monkeypatch):
    """`clarify compare`'s table (and so comparison.md) has a row for each switch, read from each run's
    frozen config; a report's run section shows them with the rest of the config."""
    from clarify.batch.compare import compare as cmp
    from clarify.batch.report.comparison import flatten
    from clarify.batch.run.rundir import Run
    from tests.run_fixtures import write_run

    summary = {"params": 1, "n_questions": 1, "wall_s_total": 1.0, "llm_calls_per_question": 1.0,
               "tokens": {"prompt": 1, "output": 1}, "valid_nodes_per_question": 0.0, "parse_errors": 0,
               "cached_calls": 0, "metrics": {}, "quote_fidelity": None}
    out = tmp_path / "cmp"
    write_run(out / "a", {"toc.constrain_format": True}, summary={**summary, "constraints": {"format": True}})
    write_run(out / "b", {}, summary=summary)
    monkeypatch.setattr(cmp, "_launch", lambda models, *a, **k: {m: {"started": 0, "finished": 1, "devices": ""}
                                                                for m in models})
    table = cmp.compare(["a", "b"], config.load(None), out)
    assert table["constrain_format"].to_list() == [True, False]
    assert table["constrain_quotes"].to_list() == [False, False]
    assert "| constrain_format | True | False |" in (out / "comparison.md").read_text()
    assert flatten(Run.open(out / "a").settings)["toc.constrain_format"] is True


def test_a_run_started_before_the_switches_existed_resumes(tmp_path):
    """A checkpointed run whose config.json predates the switches (no `answer` section, no
    toc.constrain_format) resumes under the defaults (off: what it ran); switching one on is refused."""
    from clarify.batch.run.rundir import RunDir
    from clarify.errors import InputError

    rd = RunDir(tmp_path / "old")
    rd.path.mkdir()
    old = json.loads(config.load(None).to_json())  # as the pipeline freezes it
    del old["answer"], old["toc"]["constrain_format"]
    for added in ("batch_invariant", "max_num_seqs", "backend", "base_url", "api_key_env", "endpoint",
                  "max_concurrency", "request_timeout_s", "max_retries"):  # the engine settings added after constraints
        del old["model"][added]
    rd.freeze(old, {})
    (rd.path / "parts" / "0001").mkdir(parents=True)
    rd.freeze(json.loads(config.load(None).to_json()), {})  # resumes
    assert json.loads((rd.path / "config.json").read_text())["answer"] == {"constrain_quotes": False}
    with pytest.raises(InputError, match="constrain_format"):
        rd.freeze(json.loads(config.load(None, {"toc.constrain_format": True}).to_json()), {})
