"""The helper that remembers (core.memory: its index, runs and datastore; drafters suffix and hybrid): matches, bounds, exactness, runs that draft from runs."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from specviz.core import drafters
from specviz.core.drafters.hybrid import HybridDrafter
from specviz.core.drafters.model import ModelDrafter
from specviz.core.drafters.suffix import SuffixConfig, SuffixDrafter, continuation_tree
from specviz.core.engine import autoregressive_generate, speculative_generate
from specviz.core.memory import Match, Memory, RunMemory, SuffixIndex
from specviz.core.progress import drain
from specviz.core.sampling import SamplingConfig
from specviz.core.trace import GenerationConfig
from specviz.core.memory import datastore
from tests.test_cli import run_json
from tests.test_engine import TOK, tiny_lm
from tests.test_tree import V as LAW_V
from tests.test_tree import chi_square_pvalue, exact_three, first_two_counts, joint_two, law_of_three, output_law, p_law
from tests.test_tree import branch


def brute_longest(docs, ids, max_length, vocab):
    """The longest suffix of ids (≤ max_length) followed by a token inside one document, by plain scanning."""
    best = 0
    for m in range(1, min(max_length, len(ids)) + 1):
        tail = list(ids[-m:])
        if any(doc[s:s + m] == tail and s + m < len(doc) for doc in docs for s in range(len(doc) - m + 1)):
            best = m
    return best


@pytest.mark.parametrize("seed", range(6))
def test_longest_match_agrees_with_a_plain_scan(seed):
    rng = random.Random(seed)
    docs = [[rng.randrange(4) for _ in range(rng.randrange(1, 40))] for _ in range(5)]
    index = SuffixIndex(docs, 4)
    for _ in range(30):
        ids = [rng.randrange(4) for _ in range(rng.randrange(1, 12))]
        m, starts = index.longest_match(ids, 8)
        assert m == brute_longest(docs, ids, 8, 4)
        for s in starts.tolist():  # every occurrence really is the suffix, with a token after it in the same document
            assert index.text[s:s + m].tolist() == ids[-m:] and index.text[s + m] < 4
        for least in (2, 3, 5):  # the hybrid's search: only matches at least this long count
            shortest, _ = index.longest_match(ids, 8, min_length=least)
            assert shortest == (m if m >= least else 0)


def test_a_match_never_runs_across_two_documents():
    index = SuffixIndex([[1, 2, 3], [4, 5]], 6)
    found = index.match([0, 2, 3], "visitor", 8, 8, 8)
    assert found.length == 0  # [2, 3] ends its document: nothing followed it there
    found = index.match([9 % 6, 1, 2], "visitor", 8, 8, 8)
    assert found.length == 2 and found.continuations == ((3,),)  # cut at the document's end, not running into [4, 5]


def test_the_index_gives_its_documents_back_as_they_were_given():
    docs = [[1, 2, 3], [], [4, 5], [0]]
    assert [d.tolist() for d in SuffixIndex(docs, 6).documents()] == docs
    assert SuffixIndex([], 6).documents() == []


def test_ids_outside_the_vocabulary_are_refused():
    with pytest.raises(ValueError, match="outside the vocabulary"):
        SuffixIndex([[1, 7]], 5)


def test_run_memory_stays_bounded_and_drops_the_least_recently_used():
    mem = RunMemory(vocab_size=50, max_runs=8, max_tokens=200)
    for run in range(500):  # a soak test's worth of runs
        mem.note(mem.new_key(), [run % 50] * 30)
        assert mem.runs <= 8 and mem.tokens <= 200
    assert mem.runs == 6  # 6 runs of 30 tokens fit 200
    kept = [seq[0] for seq in mem._runs.values()]
    assert kept == [(499 - i) % 50 for i in range(5, -1, -1)]  # the newest six, oldest first
    assert mem.index().tokens == 180


def test_a_run_that_grows_is_one_run_not_many():
    mem = RunMemory(vocab_size=10)
    key = mem.new_key()
    for n in range(1, 20):
        mem.note(key, list(range(n % 10)) * 2)
    assert mem.runs == 1


def test_the_tree_is_ranked_by_frequency_and_its_depth_follows_the_match():
    match = Match("datastore", 8, ((1, 2, 3), (1, 2, 4), (1, 5, 6), (7, 8, 9)))
    d = continuation_tree(match, SuffixConfig(max_depth=2, min_prob=0.2), vocab=10)
    # depth ≤ 2; 1 seen 3/4, 1→2 2/4, then 7, 1→5 and 7→8 1/4 each; 1→2→3 would be depth 3
    assert d.tree.tokens[0] == 1 and d.tree.parents[0] == -1
    assert max(d.tree.depths) == 2
    assert set(zip(d.tree.tokens, d.tree.depths)) == {(1, 1), (2, 2), (7, 1), (5, 2), (8, 2)}
    assert all(p < i for i, p in enumerate(d.tree.parents))  # parents before children
    assert d.score == pytest.approx(0.75 + 0.5 + 3 * 0.25)
    assert len(continuation_tree(match, SuffixConfig(min_prob=0.3), vocab=10).tree.tokens) == 2  # 1 and 1→2 only
    assert float(d.tree.q[0, 1]) == pytest.approx(0.75) and float(d.tree.q[1, 2]) == pytest.approx(2 / 3)
    assert not any(d.tree.sampled)  # every node is a pick: the rule tries it as a one-hot draft
    # a short match drafts little: no deeper and no more nodes than it is long (× spec_factor)
    for length, nodes in ((1, (1,)), (2, (1, 2)), (3, (1, 2, 3))):  # ties at 1/4 go by the tokens
        short = continuation_tree(Match("datastore", length, match.continuations), SuffixConfig(min_prob=0.2), vocab=10)
        assert short.tree.tokens == nodes and max(short.tree.depths) <= length


def test_a_short_datastore_match_drafts_nothing_but_a_short_match_in_the_text_does():
    mem = RunMemory(LAW_V)
    mem.note(mem.new_key(), [3, 1, 2, 0, 1, 2, 0])
    config = SuffixConfig(datastore_min_match=3, min_prob=0.0)
    store = SuffixIndex([[3, 1, 2, 0, 1, 2, 0]], LAW_V)
    context = [2, 3, 1, 2]  # ends in "3 1 2" only in the stores; "1 2" also earlier in this text
    session = SuffixDrafter(Memory(datastore=store), config).start(context, SamplingConfig(), LAW_V)
    assert session.best(context, 4).source == "datastore"  # a 3-token match in the datastore drafts
    short = [0, 0, 2, 0]  # "2 0" is 2 tokens long in the datastore: too short to draft from there
    session = SuffixDrafter(Memory(datastore=store), config).start(short, SamplingConfig(), LAW_V)
    assert session.best(short, 4).source == "text"  # the text's own "0" match still drafts (its 1-token match)
    session = SuffixDrafter(Memory(visitor=mem), config).start(short, SamplingConfig(), LAW_V)
    assert session.best(short, 4).source == "visitor"  # the floor is the datastore's only


def _memory_tree(context, runs):
    """The suffix drafter's tree after `context` with these earlier runs in memory (vocabulary of the toy laws)."""
    mem = RunMemory(LAW_V)
    for seq in runs:
        mem.note(mem.new_key(), seq)
    session = SuffixDrafter(Memory(visitor=mem), SuffixConfig(min_prob=0.0)).start(context, SamplingConfig(), LAW_V)
    return session.best(context, 2).tree


@pytest.mark.parametrize("runs", [
    [[1, 0, 2, 3], [1, 0, 2, 1], [1, 0, 3, 3]],  # a branching tree whose support is smaller than the target's
    [[1, 0, 2, 2], [1, 0, 2, 2]],  # one branch, twice seen
    [[1, 0, 3]],  # a single token
])
def test_memory_drafts_keep_the_output_law_exactly_p(runs):
    """Exact enumeration: whatever the memory proposes (q is 0 outside what it saw), three tokens follow p exactly."""
    context = [1, 0]
    tree = _memory_tree(context, runs)
    assert tree.tokens, "the memory must draft something here"
    p_rows = torch.stack([p_law(context)] + [p_law(context + branch(tree.parents, tree.tokens, i))
                                            for i in range(len(tree.tokens))])
    got = law_of_three(context, output_law(tree, p_rows))
    exact = exact_three(context)
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-9)
    for z in exact:
        assert got[z] == pytest.approx(exact[z], abs=1e-9), z


def _tiny_pair():
    return tiny_lm(3), tiny_lm(4)


def _remembered(runs, vocab):
    mem = RunMemory(vocab)
    for seq in runs:
        mem.note(mem.new_key(), seq)
    return Memory(visitor=mem)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["suffix", "hybrid"])
def test_sampled_memory_runs_follow_the_target_law_tiny(kind):
    """Chi-square on the first two tokens; the memory holds continuations of the prompt, and every draw adds one."""
    target, draft = _tiny_pair()
    prompt = [1, 5, 2, 7]
    rng = random.Random(0)
    memory = _remembered([prompt + [rng.randrange(12) for _ in range(4)] for _ in range(12)], 12)
    made = SuffixDrafter(memory, SuffixConfig(min_prob=0.05)) if kind == "suffix" else \
        HybridDrafter(memory, ModelDrafter(draft), threshold=0.5, min_match=1)
    sampling = SamplingConfig("sample", temperature=2.0, top_k=6)
    draws = 2500
    counts, picks = first_two_counts(target, made, TOK, prompt, sampling, draws)
    pvalue, bins = chi_square_pvalue(counts, joint_two(target, prompt, sampling), draws)
    assert bins >= 10 and picks > 500  # memory drafts really were tried, many times
    assert pvalue > 1e-3


def _greedy(n):
    return GenerationConfig(max_new_tokens=n, gamma=4, stop_at_eos=False)


@pytest.mark.parametrize("kind", ["suffix", "hybrid"])
def test_greedy_runs_are_identical_and_the_second_run_drafts_from_the_first(kind):
    target, draft = _tiny_pair()
    prompt = [1, 5, 2, 7, 1, 5, 3, 9, 4]  # longer than the hybrid's MIN_MATCH: its second run's first round is memory's
    base = drain(autoregressive_generate(target, TOK, prompt, _greedy(30)))
    memory = Memory(visitor=RunMemory(12))
    made = drafters.build(kind, draft, target, memory=memory)
    first = drain(speculative_generate(target, made, TOK, prompt, _greedy(30)))
    second = drain(speculative_generate(target, made, TOK, prompt, _greedy(30)))
    assert first.tokens == base.tokens == second.tokens
    assert len(second.rounds) <= 3 < len(first.rounds)  # 30 tokens in a few target calls, from memory
    assert {r.memory_source for r in second.rounds if r.draft_ids} == {"visitor"}
    if kind == "hybrid":
        assert {r.helper for r in first.rounds} <= {"memory", "model"} and "model" in {r.helper for r in first.rounds}
        assert all(r.draft_ms > 0 for r in second.rounds if r.draft_ids)  # the lookup is billed to the round


def test_a_run_without_visitor_memory_remembers_nothing():
    target, _ = _tiny_pair()
    made = SuffixDrafter(Memory())
    prompt = [3, 1, 4, 1, 5]
    a = drain(speculative_generate(target, made, TOK, prompt, _greedy(20)))
    b = drain(speculative_generate(target, made, TOK, prompt, _greedy(20)))
    assert [r.draft_ids for r in a.rounds] == [r.draft_ids for r in b.rounds]
    assert "visitor" not in {r.memory_source for r in b.rounds}


# ------------------------------------------------------------------------------------------
# the datastore and the command line
# ------------------------------------------------------------------------------------------


class _Tok:
    """A byte tokenizer (ids 0..255), for datastores built in a test."""

    def __call__(self, text):
        return {"input_ids": list(text.encode("utf-8"))}


@pytest.fixture
def sources(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "lib"
    (root / "pkg").mkdir(parents=True)
    (root / "test").mkdir()
    (root / "a.py").write_text("def add(a, b):\n    return a + b\n")
    (root / "pkg" / "b.py").write_text("def sub(a, b):\n    return a - b\n")
    (root / "test" / "t.py").write_text("assert False\n")  # tests are left out
    return root


def test_the_datastore_is_bounded_checked_and_refused_when_damaged_or_foreign(sources):
    tok = _Tok()
    datastore.build("toy", tok, 256, max_tokens=40, root=sources)
    m = datastore.manifest("toy")
    assert m["tokens"] == 40 and m["files"] == 2 and m["max_tokens"] == 40
    index = datastore.load("toy", tok, 256)
    assert index.tokens == 40
    assert index.match(list(b"def add(a, b):\n"), "datastore", 32, 8, 8).continuations == (tuple(b"    retu"),)

    class Other(_Tok):
        def __call__(self, text):
            return {"input_ids": [min(255, b + 1) for b in text.encode("utf-8")]}

    with pytest.raises(datastore.DatastoreError, match="another tokenizer"):
        datastore.load("toy", Other(), 256)
    data = datastore.folder("toy") / "tokens.npz"
    raw = bytearray(data.read_bytes())
    raw[-10] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(datastore.DatastoreError, match="sha256"):
        datastore.load("toy", tok, 256)
    rebuilt = datastore.ensure("toy", tok, 256)  # a damaged one is built again (from this Python's own sources)
    assert rebuilt.tokens == datastore.manifest("toy")["tokens"] > 40
    with pytest.raises(datastore.DatastoreError, match="no datastore"):
        datastore.load("missing", tok, 256)


def test_two_processes_wanting_a_missing_datastore_build_it_once(sources, monkeypatch):
    """The build is locked (two test workers, or the app beside a CLI run): the second waits and loads the first's.

    The first's build goes on only once the second has found no datastore, so without the lock both would build."""
    import threading

    tok, builds, second_looked = _Tok(), [], threading.Event()
    real_build, real_load = datastore.build, datastore.load

    def build(*args, **kwargs):
        builds.append(threading.current_thread().name)
        assert second_looked.wait(30)
        return real_build(*args, **{**kwargs, "max_tokens": 40, "root": sources})

    def load(*args, **kwargs):
        if threading.current_thread().name == "second":
            second_looked.set()
        return real_load(*args, **kwargs)

    monkeypatch.setattr(datastore, "build", build)
    monkeypatch.setattr(datastore, "load", load)
    got = []
    threads = [threading.Thread(target=lambda: got.append(datastore.ensure("toy", tok, 256)), name=name)
               for name in ("first", "second")]
    threads[0].start()
    for _ in range(6000):  # the first holds the lock and builds before the second asks (at most a minute)
        if builds:
            break
        threading.Event().wait(0.01)
    threads[1].start()
    for thread in threads:
        thread.join(60)
    assert builds == ["first"] and [index.tokens for index in got] == [40, 40]
    assert sorted(p.name for p in datastore.folder("toy").iterdir()) == ["manifest.json", "tokens.npz"]  # no temp left


def test_source_files_leave_tests_out_and_keep_a_fixed_order(sources):
    names = [p.relative_to(sources).as_posix() for p in datastore.source_files(sources)]
    assert names == ["a.py", "pkg/b.py"]


def test_generate_runs_prints_one_result_per_run_and_the_second_drafts_from_the_first():
    res = run_json("--pair", "tiny-random", "--prompt", "def add(a, b):", "--max-new-tokens", "24", "--drafter",
                   "suffix", "--runs", "2", "--baseline")
    first, second = res["runs"]
    assert first["tokens"] == second["tokens"] and first["identical_to_baseline"] and second["identical_to_baseline"]
    assert second["target_calls"] < first["target_calls"]
    assert {r["memory_source"] for r in second["rounds"] if r["draft_tokens"]} >= {"visitor"}
    assert json.dumps(res)  # plain JSON all the way down
    assert all("measured_c" in r for r in res["runs"])


def test_the_registry_names_the_memory_drafters():
    assert {"suffix", "hybrid"} <= set(drafters.names())
    assert drafters.spec("suffix").remembers and not drafters.spec("suffix").needs_draft_model
    assert drafters.spec("hybrid").needs_draft_model and drafters.spec("hybrid").remembers
    assert not any(drafters.spec(n).remembers for n in ("model", "ngram", "tree"))


def test_memory_index_of_many_runs_is_rebuilt_only_when_something_changed():
    mem = RunMemory(20)
    mem.note(mem.new_key(), [1, 2, 3])
    first = mem.index()
    assert mem.index() is first
    mem.note(mem.new_key(), [4, 5])
    assert mem.index() is not first and isinstance(mem.index().text, np.ndarray)
    assert list(mem._runs.values()) == [(1, 2, 3), (4, 5)]


@pytest.mark.parametrize("runs", ["0", "21"])
def test_generate_refuses_a_runs_count_out_of_range_in_one_line(runs):
    from tests.test_cli import assert_one_error_line, run_cli

    done = run_cli("generate", "--pair", "tiny-random", "--prompt", "x", "--runs", runs, in_process=True)
    assert_one_error_line(done, 2, "--runs must be in 1..20")


# ------------------------------------------------------------------------------------------
# A shared server's memories: each visitor's own, the class's only when asked, all bounded
# ------------------------------------------------------------------------------------------


def _drafted_from(memory: Memory, ids: list[int]) -> set[str]:
    """The sources a suffix session finds the end of `ids` in."""
    return {source for source, index in memory.sources() if index.longest_match(ids, 32)[0] >= len(ids)}


def test_a_visitor_drafts_from_their_own_runs_only_unless_the_class_memory_is_given():
    from specviz.core.memory import Memories

    store = Memories()
    secret = [5, 6, 7, 8, 9, 10]
    ada = store.visitor("browser:ada", "tiny", 64)
    ada.note(ada.new_key(), secret)
    bob = store.visitor("browser:bob", "tiny", 64)
    assert store.visitor("browser:ada", "tiny", 64) is ada and store.visitor("browser:ada", "other", 64) is not ada
    assert _drafted_from(Memory(visitor=bob), secret[:4]) == set()  # Bob never sees Ada's run
    assert _drafted_from(Memory(visitor=ada), secret[:4]) == {"visitor"}
    shared = store.class_wide("tiny", 64)
    Memory(visitor=ada, shared=shared).note((ada.new_key(), shared.new_key()), secret)
    assert _drafted_from(Memory(visitor=bob, shared=shared), secret[:4]) == {"class"}
    assert len({store.next_run() for _ in range(100)}) == 100  # a run number is never reused


def test_a_servers_memories_stay_bounded_over_hundreds_of_runs_by_many_visitors():
    from specviz.core.memory import runs as memories

    store = memories.Memories(max_visitors=8)
    rng = random.Random(0)
    for run in range(600):  # a soak test's worth of runs, from 40 visitors on two pairs
        owner, pair = f"browser:{rng.randrange(40)}", ("a", "b")[run % 2]
        doc = [rng.randrange(64) for _ in range(rng.randrange(50, 900))]
        Memory(visitor=store.visitor(owner, pair, 64), shared=store.class_wide(pair, 64)).note(
            (run + 1, run + 1), doc)
        use = store.use()
        assert use.visitors <= 8
        assert use.tokens <= 8 * memories.VISITOR_TOKENS + 2 * memories.CLASS_TOKENS
        assert use.runs <= 8 * memories.VISITOR_RUNS + 2 * memories.CLASS_RUNS
