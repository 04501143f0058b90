"""Token trees: one masked pass per tree, gathered caches, the exact tree rule, greedy identity and the sampling law."""

import os
import itertools
import math
from collections import defaultdict

import pytest
import torch
from scipy.stats import chisquare
from transformers import LlamaConfig, LlamaForCausalLM

from specviz.core.engine import autoregressive_generate, speculative_generate
from specviz.core.progress import drain
from specviz.core.sampling import SamplingConfig, logits_to_probs
from specviz.core.trace import GenerationConfig
from specviz.core.tree_rule import DraftTree
from specviz.core.drafters.tree import TreeConfig, TreeDrafter, pick_children
from specviz.core.kv import TreeLM
from specviz.core.tree_rule import verify_tree, walk_tree
from tests.test_engine import PROMPT, TOK, other, target, tiny_lm  # noqa: F401 (fixtures)

# a tree over 6 nodes: two children under the root, two under node 0, one under 1, one under 2
TOKENS = [5, 6, 7, 8, 9, 2]
PARENTS = [-1, -1, 0, 0, 1, 2]


def branch(parents, tokens, i):
    """The tokens from the root's child down to node i."""
    out = []
    while i >= 0:
        out.append(tokens[i])
        i = parents[i]
    return out[::-1]


def plain_last_logits(model, ids):
    """Logits after `ids` from one plain causal pass with no cache (the reference)."""
    with torch.inference_mode():
        return model(input_ids=torch.tensor([list(ids)])).logits[0, -1].float()


def llama(seed, vocab=12, attn="sdpa"):
    torch.manual_seed(seed)  # test-only: builds weights
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      attn_implementation=attn)
    return LlamaForCausalLM(cfg).eval()


# ------------------------------------------------------------------------------------------
# One masked pass scores every node as a plain pass over its branch would
# ------------------------------------------------------------------------------------------


def check_tree_pass(model, ids, atol):
    """tree_logits at the root and every node equal a no-cache plain pass over that node's branch."""
    lm = TreeLM(model)
    lm.prefill(ids)
    got = lm.tree_logits(ids, TOKENS, PARENTS, with_root=True)  # (1+n, V)
    torch.testing.assert_close(got[0], plain_last_logits(model, ids), atol=atol, rtol=atol)
    for i in range(len(TOKENS)):
        torch.testing.assert_close(got[i + 1], plain_last_logits(model, list(ids) + branch(PARENTS, TOKENS, i)),
                                   atol=atol, rtol=atol)
    return lm


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_every_node_sees_its_branch_only(attn):
    model = llama(0, attn=attn)
    assert model.config._attn_implementation == attn
    check_tree_pass(model, PROMPT + [3, 4], atol=1e-5)


def test_the_node_check_can_fail_without_the_tree_mask(target):
    """The same nodes fed as one causal chain see their cousins: the check above would catch that."""
    with torch.inference_mode():
        chain = target(input_ids=torch.tensor([PROMPT + TOKENS])).logits[0, len(PROMPT):]  # (n, V)
    wrong = [i for i in range(len(TOKENS))
             if not torch.allclose(chain[i], plain_last_logits(target, PROMPT + branch(PARENTS, TOKENS, i)), atol=1e-4)]
    assert wrong  # nodes 2..5 (at least) get other context from a plain causal pass


def test_uncached_ids_and_the_tree_go_in_one_pass(target):
    """Several committed ids not yet cached are fed causally in the same pass as the tree."""
    lm = TreeLM(target)
    lm.prefill(PROMPT[:2])
    ids = PROMPT + [3, 4]
    got = lm.tree_logits(ids, TOKENS, PARENTS, with_root=True)
    assert lm.ids == ids and len(lm.tree_tokens) == len(TOKENS)
    torch.testing.assert_close(got[0], plain_last_logits(target, ids), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[6], plain_last_logits(target, ids + branch(PARENTS, TOKENS, 5)),
                               atol=1e-5, rtol=1e-5)


def test_a_tree_grown_level_by_level_matches_plain_passes(target):
    """The drafter's way: level 1 in one pass, then level 2 under it in another (old entries stay visible)."""
    lm = TreeLM(target)
    ids = PROMPT + [3]
    lm.logits(ids, 1)
    lvl1 = lm.tree_logits(ids, [5, 6], [-1, -1], with_root=False)  # (2, V)
    lvl2 = lm.tree_logits(ids, [7, 8, 9], [0, 0, 1], with_root=False)  # (3, V)
    for got, br in zip(list(lvl1) + list(lvl2), ([5], [6], [5, 7], [5, 8], [6, 9])):
        torch.testing.assert_close(got, plain_last_logits(target, ids + br), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("keep", [[], [0], [1], [0, 3], [1, 4], [0, 2, 5]])
def test_cache_after_commit_equals_a_no_cache_recompute(target, keep):
    lm = check_tree_pass(target, PROMPT + [3, 4], atol=1e-5)
    lm.commit(keep)
    kept = PROMPT + [3, 4] + [TOKENS[i] for i in keep]
    assert lm.ids == kept and lm.cache.get_seq_length() == len(kept) and not lm.tree_tokens
    nxt = kept + [10, 11]
    got = lm.logits(nxt, 3)  # feeds only the two new ids: the gathered entries must be right
    with torch.inference_mode():
        full = target(input_ids=torch.tensor([nxt])).logits[0, -3:]
    torch.testing.assert_close(got, full, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------
# The tree config and the drafter's choices
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs", [dict(budget=0), dict(budget=65), dict(branching=0), dict(depth=0),
                                    dict(depth=17), dict(min_score=1.0), dict(min_score=-0.1)])
def test_tree_config_refuses_bad_values(kwargs):
    with pytest.raises(ValueError):
        TreeConfig(**kwargs)


def test_pick_children_keeps_the_sample_first_and_skips_removed_tokens():
    rank = torch.tensor([0.1, 0.5, 0.0, 0.3, 0.05])
    assert pick_children(rank, 3, None) == [(1, False), (3, False), (0, False)]
    assert pick_children(rank, 3, 3) == [(3, True), (1, False), (0, False)]
    assert pick_children(rank, 9, None) == [(1, False), (3, False), (0, False), (4, False)]  # token 2 has q = 0


def test_drafted_tree_respects_budget_depth_and_parents(target, other):
    cfg = TreeConfig(budget=10, branching=3, depth=4, min_score=0.0)  # no pruning: the budget is filled
    session = TreeDrafter(other, cfg).start(PROMPT, SamplingConfig("greedy"), 12)
    tree = session.propose_tree(PROMPT, 99, torch.Generator())
    assert len(tree.tokens) == 10 and max(tree.depths) <= 4 and tree.q.shape == (11, 12)
    assert all(par < i for i, par in enumerate(tree.parents))
    for node in [-1] + list(range(len(tree.tokens))):
        kids = [tree.tokens[c] for c in tree.children(node)]
        assert len(kids) == len(set(kids)) <= 3  # distinct children
    # greedy children are the draft's best tokens in order: the first is its argmax
    root_logits = plain_last_logits(other, PROMPT)
    assert tree.tokens[tree.children(-1)[0]] == int(root_logits.argmax())
    assert max(session.propose_tree(PROMPT, 2, torch.Generator()).depths) == 2  # the budget bounds the depth


def test_min_score_leaves_out_unlikely_nodes_but_never_the_best_one(target, other):
    """Nodes the draft rates below min_score (path probability) are neither expanded nor verified; the best stays."""
    full = TreeDrafter(other, TreeConfig(budget=24, branching=3, depth=6, min_score=0.0)).start(
        PROMPT, SamplingConfig("greedy"), 12).propose_tree(PROMPT, 99, torch.Generator())
    for floor in (0.05, 0.3, 0.99):
        session = TreeDrafter(other, TreeConfig(budget=24, branching=3, depth=6, min_score=floor)).start(
            PROMPT, SamplingConfig("greedy"), 12)
        tree = session.propose_tree(PROMPT, 99, torch.Generator())
        scores = _path_scores(other, tree)
        assert len(tree.tokens) >= 1 and all(par < i for i, par in enumerate(tree.parents))
        assert all(sc >= floor for sc in scores[1:]) and scores[0] == max(scores)  # only the best may fall below
        assert len(tree.tokens) <= len(full.tokens)


def _path_scores(model, tree) -> list[float]:
    """The draft's path probability of each node (softmax of its logits along the branch), from plain passes."""
    out = []
    for node in range(len(tree.tokens)):
        ids, score = list(PROMPT), 1.0
        for i in tree.branch(node):
            score *= float(torch.softmax(plain_last_logits(model, ids).float(), -1)[tree.tokens[i]])
            ids.append(tree.tokens[i])
        out.append(score)
    return out


def test_branching_one_drafts_the_chain(target, other):
    tree = TreeDrafter(other, TreeConfig(budget=5, branching=1, depth=5, min_score=0.0)).start(
        PROMPT, SamplingConfig("greedy"), 12).propose_tree(PROMPT, 99, torch.Generator())
    ids = list(PROMPT)
    for _ in range(5):
        ids.append(int(plain_last_logits(other, ids).argmax()))
    assert tree.parents == (-1, 0, 1, 2, 3) and list(tree.tokens) == ids[len(PROMPT):]


# ------------------------------------------------------------------------------------------
# The exact rule: every output's probability equals p exactly (small vocabulary, enumerated)
# ------------------------------------------------------------------------------------------

V = 4


def toy_law(seed, context, sharp):
    """A context-dependent distribution over V tokens (float64), a stand-in for a model."""
    g = torch.Generator().manual_seed(hash((seed,) + tuple(context)) % (2**31))
    law = torch.softmax(sharp * torch.randn(V, generator=g, dtype=torch.float64), -1)
    if seed == 2:  # the draft misses one token the target likes: q = 0 where p > 0
        law[(len(context) + 1) % V] = 0.0
        law /= law.sum()
    return law


def p_law(context):
    return toy_law(1, context, 1.3)


def q_law(context):
    return toy_law(2, context, 1.8)


class Need(Exception):
    """The scripted uniforms ran out: the enumeration must branch."""


def output_law(tree, p_rows):
    """P(round emits accepted path + next token), enumerated over every accept/reject outcome of the real walk."""
    out = defaultdict(float)
    pending = [()]
    while pending:
        script = pending.pop()
        used = iter(script)

        def uniform():
            try:
                return 0.0 if next(used) else 1.0  # u = 0 accepts whenever a > 0; u = 1 always rejects
            except StopIteration:
                raise Need from None

        try:
            path, tried, accepts, _, law = walk_tree(p_rows, tree, uniform)
        except Need:
            pending += [script + (True,), script + (False,)]
            continue
        prob = math.prod(a if d else 1.0 - a for a, d in zip(accepts, script))
        if prob > 0:
            prefix = tuple(tree.tokens[c] for c in path)
            for y in range(V):
                out[prefix + (y,)] += prob * float(law[y])
    return out


def build_tree(context, depth, k, sampled_choice, keep_sampled=True):
    """A tree grown like the drafter does (pick_children), with the sampled children given explicitly."""
    tokens, parents, sampled = [], [], []
    rows = [q_law(context)]
    frontier = [-1]
    for _ in range(depth):
        nxt = []
        for node in frontier:
            ctx = list(context) + branch(parents, tokens, node)
            q = q_law(ctx)
            first = next(sampled_choice)
            for tok, s in pick_children(q, k, first):
                if s and not keep_sampled:
                    continue  # a budget may drop the sampled child and keep the picks
                tokens.append(tok), parents.append(node), sampled.append(s)
                nxt.append(len(tokens) - 1)
        frontier = nxt
    for i in range(len(tokens)):
        rows.append(q_law(list(context) + branch(parents, tokens, i)))
    return DraftTree(tuple(tokens), tuple(parents), tuple(sampled), torch.stack(rows))


def law_of_three(context, emitted):
    """P(first three tokens = z) when the round's output is continued by the target itself."""
    got = defaultdict(float)
    for s, pr in emitted.items():
        for rest in itertools.product(range(V), repeat=3 - len(s)):
            z, ctx, w = s + rest, list(context) + list(s), pr
            for t in rest:
                w *= float(p_law(ctx)[t])
                ctx.append(t)
            got[z] += w
    return got


def exact_three(context):
    out = {}
    for z in itertools.product(range(V), repeat=3):
        w, ctx = 1.0, list(context)
        for t in z:
            w *= float(p_law(ctx)[t])
            ctx.append(t)
        out[z] = w
    return out


@pytest.mark.parametrize("shape", ["sampled+picks", "picks only", "chain of samples", "greedy-like picks k=3"])
def test_tree_rule_output_law_is_exactly_p(shape):
    context = [1, 0]
    depth, k, mode = {"sampled+picks": (2, 2, "sample"), "picks only": (2, 2, "picks"),
                      "chain of samples": (2, 1, "sample"), "greedy-like picks k=3": (2, 3, "picks")}[shape]
    n_frontier = 1 + k  # nodes whose children are drawn: the root and its k children (depth 2)
    total = defaultdict(float)
    choices = itertools.product(range(V), repeat=n_frontier) if mode == "sample" else [(None,) * n_frontier]
    for choice in choices:
        # the sampled child of each expanded node is a draw from q there: weight the tree by its probability
        tree = build_tree(context, depth, k, iter(choice), keep_sampled=True)
        weight = 1.0
        if mode == "sample":
            ctxs = [context] + [context + branch(tree.parents, tree.tokens, c) for c in tree.children(-1)]
            weight = math.prod(float(q_law(c)[x]) for c, x in zip(ctxs, choice))
            if weight == 0:
                continue
        p_rows = torch.stack([p_law(context)] + [p_law(context + branch(tree.parents, tree.tokens, i))
                                                for i in range(len(tree.tokens))])
        for z, pr in law_of_three(context, output_law(tree, p_rows)).items():
            total[z] += weight * pr
    exact = exact_three(context)
    assert sum(total.values()) == pytest.approx(1.0, abs=1e-9)
    for z in exact:
        assert total[z] == pytest.approx(exact[z], abs=1e-9), z


def test_tree_rule_is_exact_when_the_budget_drops_a_sampled_child():
    context = [2]
    total = defaultdict(float)
    for choice in itertools.product(range(V), repeat=3):
        tree = build_tree(context, 2, 2, iter(choice), keep_sampled=False)  # only the picks remain
        q0 = q_law(context)
        weight = float(q0[choice[0]])  # the dropped draws still steered which tokens were picked
        p_rows = torch.stack([p_law(context)] + [p_law(context + branch(tree.parents, tree.tokens, i))
                                                for i in range(len(tree.tokens))])
        for z, pr in law_of_three(context, output_law(tree, p_rows)).items():
            total[z] += weight * pr / V ** 2  # the deeper draws are uniform weights here: any choice is exact
    exact = exact_three(context)
    for z in exact:
        assert total[z] == pytest.approx(exact[z], abs=1e-9)


def test_a_wrong_rule_fails_the_enumeration():
    """Accepting a picked child with min(1, p/q) instead of p(x) skews the law: the enumeration sees it."""
    context = [1, 0]
    tree = build_tree(context, 1, 2, iter([None]), keep_sampled=True)
    wrong = DraftTree(tree.tokens, tree.parents, (True, False), tree.q)  # the first pick treated as if drawn from q
    p_rows = torch.stack([p_law(context)] + [p_law(context + [t]) for t in tree.tokens])
    got = law_of_three(context, output_law(wrong, p_rows))
    exact = exact_three(context)
    assert max(abs(got[z] - exact[z]) for z in exact) > 1e-3


def test_greedy_walk_follows_the_target_argmax():
    # p rows one-hot: after root -> 2, after node 1 (token 2) -> 0, after node 3 (token 0) -> 3
    tree = DraftTree((1, 2, 0, 0), (-1, -1, 1, 1), (False,) * 4, torch.zeros(5, V))
    p = torch.zeros(5, V)
    p[0, 2], p[1, 1], p[2, 0], p[3, 3], p[4, 1] = 1, 1, 1, 1, 1
    v = verify_tree(p, tree, torch.Generator().manual_seed(0))
    assert v.path == (1, 2) and v.next_token == 3 and v.next_origin == "bonus"
    assert v.tried == (0, 1, 2) and v.accept_probs == (0.0, 1.0, 1.0)


# ------------------------------------------------------------------------------------------
# The engine: greedy identity, records, and the sampling law
# ------------------------------------------------------------------------------------------

CONFIGS = [TreeConfig(), TreeConfig(budget=8, branching=1, depth=8), TreeConfig(budget=32, branching=4, depth=5),
           TreeConfig(budget=3, branching=3, depth=1)]


def _greedy(n=60):
    return GenerationConfig(max_new_tokens=n, sampling=SamplingConfig("greedy"), stop_at_eos=False)


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_greedy_tree_is_identical_to_target_only(target, other, cfg):
    base = drain(autoregressive_generate(target, TOK, PROMPT, _greedy()))
    spec = drain(speculative_generate(target, TreeDrafter(other, cfg), TOK, PROMPT, _greedy()))
    assert spec.tokens == base.tokens and spec.drafter == "tree"
    assert spec.accepted > 0


def test_greedy_tree_with_the_target_as_drafter_never_rejects(target):
    """Each node's first child is the draft's argmax; when the draft is the target, it is always accepted."""
    cfg = TreeConfig(budget=12, branching=2, depth=5)
    spec = drain(speculative_generate(target, TreeDrafter(target, cfg), TOK, PROMPT, _greedy(36)))
    base = drain(autoregressive_generate(target, TOK, PROMPT, _greedy(36)))
    assert spec.tokens == base.tokens
    assert all(n.verdict != "rejected" for r in spec.rounds if r.tree for n in r.tree.nodes)
    assert all(r.next_origin == "bonus" and r.n_accepted >= 1 for r in spec.rounds[:-1])


def test_tree_round_records_the_whole_tree(target, other):
    spec = drain(speculative_generate(target, TreeDrafter(other, TreeConfig(12, 3, 4, min_score=0.0)), TOK, PROMPT,
                                      _greedy(40)))  # no pruning: the trees are full, so some nodes go unreached
    position = 0
    for r in spec.rounds:
        t = r.tree
        assert r.position == position
        position += len(r.new_ids)
        if not r.draft_ids:  # the last token of the budget is a plain target step
            assert t is None and r.index == len(spec.rounds) - 1
            continue
        assert [n.verdict for n in t.nodes].count("accepted") == len(t.path) == r.n_accepted
        assert r.draft_ids[: r.n_accepted] == tuple(t.nodes[i].token for i in t.path)
        assert len(r.draft_ids) == len(t.nodes) == len(r.accept_probs) == len(r.uniforms)
        for i, node in enumerate(t.nodes):
            assert node.depth == (1 if node.parent < 0 else t.nodes[node.parent].depth + 1)
            assert node.text == f"<{node.token}>" and 0 <= node.p <= 1 and 0 <= node.q <= 1
            tried = node.accept_prob is not None
            assert tried == (node.verdict != "unreached")
            if node.verdict == "accepted":
                assert node.uniform < node.accept_prob
            if node.verdict == "rejected":
                assert node.uniform >= node.accept_prob
    nodes = [n for r in spec.rounds if r.tree for n in r.tree.nodes]
    assert any(n.verdict == "rejected" for n in nodes) and any(n.verdict == "unreached" for n in nodes)


def test_chains_keep_no_tree(target, other):
    from specviz.core.drafters.model import ModelDrafter

    spec = drain(speculative_generate(target, ModelDrafter(other), TOK, PROMPT, GenerationConfig(max_new_tokens=10)))
    assert all(r.tree is None for r in spec.rounds)


def test_sampling_tree_replays_bit_for_bit(target, other):
    cfg = GenerationConfig(max_new_tokens=20, sampling=SamplingConfig("sample", temperature=0.9, seed=5))
    a = drain(speculative_generate(target, TreeDrafter(other), TOK, PROMPT, cfg))
    b = drain(speculative_generate(target, TreeDrafter(other), TOK, PROMPT, cfg))
    assert a.tokens == b.tokens and [r.tree for r in a.rounds] == [r.tree for r in b.rounds]


def first_two_counts(target, drafter, tok, prompt, sampling, draws):
    """Counts of the first two emitted tokens over `draws` seeds, and how many deterministic tree picks settled them.

    The runs advance together through the batched executor, as a class's do (each run's answers are its own:
    tests/test_serve.py), so the prompt's first pass is computed once and each pass serves many runs."""
    from specviz.core.engine import speculative_program
    from specviz.serve.batch import run_together

    programs = [speculative_program(target, drafter, tok, prompt, GenerationConfig(
        max_new_tokens=3, sampling=SamplingConfig(**{**sampling.__dict__, "seed": seed}), stop_at_eos=False))
        for seed in range(draws)]
    gens, _, _ = run_together(programs, target)
    counts = defaultdict(int)
    for g in gens:
        counts[tuple(g.tokens[:2])] += 1
    tried_picks = sum(1 for g in gens for r in g.rounds if r.position < 2 and r.tree  # the rounds that settled the first two
                      for n in r.tree.nodes if not n.sampled and n.verdict != "unreached")
    return counts, tried_picks


def joint_two(model, prompt, sampling):
    """The target's exact law of the first two tokens, from the engine's own passes (a CachedLM, as every run reads
    the target). The engine gives a row the same bits in any pass; transformers' plain forward takes other float paths,
    which on a gguf target (8-bit activations) moved qwen-coder's logits by up to 0.5 and swapped its 4th and 5th
    tokens after "She opened the door and looked": a law of another computation, which a test once took for
    the target's (tests/test_real_pairs.py)."""
    from specviz.core.kv import CachedLM

    lm = CachedLM(model)
    with torch.inference_mode():
        p1 = logits_to_probs(lm.logits(prompt, 1)[0], sampling)
        law = {}
        for a in torch.nonzero(p1).flatten().tolist():
            p2 = logits_to_probs(lm.logits(prompt + [a], 1)[0], sampling)
            for b in torch.nonzero(p2).flatten().tolist():
                law[(a, b)] = float(p1[a] * p2[b])
    return law


def chi_square_pvalue(counts, law, draws):
    keys = sorted(law, key=law.get, reverse=True)
    big = [k for k in keys if law[k] * draws > 5]
    obs = [counts.get(k, 0) for k in big] + [draws - sum(counts.get(k, 0) for k in big)]
    exp = [law[k] * draws for k in big] + [draws * (1 - sum(law[k] for k in big))]
    if exp[-1] < 5:  # pool a thin rest into the last bin
        obs[-2] += obs.pop()
        exp[-2] += exp.pop()
    return chisquare(obs, [e * sum(obs) / sum(exp) for e in exp]).pvalue, len(big)


@pytest.mark.slow
def test_sampled_tree_two_token_law_matches_target_tiny():
    target, draft = tiny_lm(3, 6), tiny_lm(4, 6)
    sampling = SamplingConfig("sample", temperature=2.0, top_k=5)
    draws = 2500
    counts, picks = first_two_counts(target, TreeDrafter(draft, TreeConfig(6, 2, 2)), TOK, [1, 2], sampling, draws)
    pvalue, bins = chi_square_pvalue(counts, joint_two(target, [1, 2], sampling), draws)
    assert bins >= 10 and picks > 500  # the deterministic picks really were tried, many times
    assert pvalue > 1e-3


# ------------------------------------------------------------------------------------------
# Real weights
# ------------------------------------------------------------------------------------------

REAL_PROMPTS = {"code": "def fibonacci(n):", "story": "Once upon a time, in a small village by the sea,"}


@pytest.fixture(scope="module")
def smollm():
    from specviz.models import load_pair

    return load_pair("smollm2-135m")


LONG = pytest.mark.skipif(os.environ.get("SPECVIZ_LONG_TESTS") != "1",
                          reason="long real-weight tree check (over 9 min on 2 cores): SPECVIZ_LONG_TESTS=1 bash tests/run.sh tests/test_tree.py")


@pytest.mark.real
def test_smollm2_every_node_sees_its_branch_only(smollm):
    """On the fp32 target. (The int8 draft is no reference: dynamic quantization scales each Linear's input by
    the max over the whole batch, so its logits depend on which rows share a pass, in chains as in trees.)"""
    model = smollm.target
    ids = smollm.tokenizer(REAL_PROMPTS["code"])["input_ids"]
    lm = TreeLM(model)
    lm.prefill(ids)
    toks = [220, 600, 7, 800, 9, 2000]
    got = lm.tree_logits(ids, toks, PARENTS, with_root=True)
    for i in range(len(toks)):
        torch.testing.assert_close(got[i + 1], plain_last_logits(model, ids + branch(PARENTS, toks, i)), atol=2e-4, rtol=1e-4)
    lm.commit([1, 4])
    nxt = ids + [600, 9, 11]
    torch.testing.assert_close(lm.logits(nxt, 2), torch.stack([plain_last_logits(model, nxt[:-1]), plain_last_logits(model, nxt)]),
                               atol=2e-4, rtol=1e-4)


@pytest.mark.real
@pytest.mark.parametrize("prompt_name", REAL_PROMPTS)
@pytest.mark.parametrize("cfg", [TreeConfig(), TreeConfig(budget=24, branching=3, depth=8)], ids=str)
def test_smollm2_greedy_tree_identity(smollm, prompt_name, cfg):
    ids = smollm.tokenizer(REAL_PROMPTS[prompt_name])["input_ids"]
    g = _greedy(48)
    base = drain(autoregressive_generate(smollm.target, smollm.tokenizer, ids, g))
    spec = drain(speculative_generate(smollm.target, TreeDrafter(smollm.draft, cfg), smollm.tokenizer, ids, g))
    assert spec.tokens == base.tokens and spec.accepted > 0


@pytest.mark.real
@pytest.mark.slow
@LONG
def test_smollm2_sampled_tree_two_token_law(smollm):
    """Chi-square of the first two tokens of tree runs on real weights against the target's exact joint law."""
    ids = smollm.tokenizer(REAL_PROMPTS["story"])["input_ids"]
    sampling = SamplingConfig("sample", temperature=1.5, top_k=6)
    draws = 1200
    counts, picks = first_two_counts(smollm.target, TreeDrafter(smollm.draft, TreeConfig(8, 2, 2)),
                                     smollm.tokenizer, ids, sampling, draws)
    pvalue, bins = chi_square_pvalue(counts, joint_two(smollm.target, ids, sampling), draws)
    assert bins >= 8 and picks > 0
    assert pvalue > 1e-3


@pytest.mark.real
@pytest.mark.slow
@LONG
def test_qwen_coder_greedy_tree_identity(qwen_pair):
    """The default pair's token trees give the target's own greedy text (the session's shared load of the pair)."""
    pair = qwen_pair
    ids = pair.tokenizer(REAL_PROMPTS["code"])["input_ids"]
    g = _greedy(32)
    base = drain(autoregressive_generate(pair.target, pair.tokenizer, ids, g))
    spec = drain(speculative_generate(pair.target, TreeDrafter(pair.draft, TreeConfig()), pair.tokenizer, ids, g))
    assert spec.tokens == base.tokens and spec.accepted > 0


# ------------------------------------------------------------------------------------------
# The command line
# ------------------------------------------------------------------------------------------


def test_cli_json_tree_rounds_carry_the_tree():
    from tests.test_cli import run_json

    res = run_json("--pair", "tiny-random", "--prompt", "def add(a, b):", "--drafter", "tree", "--tree-budget", "10",
                   "--tree-branching", "3", "--tree-depth", "4", "--max-new-tokens", "20", "--baseline", "-q")
    assert res["drafter"] == "tree" and res["identical_to_baseline"] is True
    assert res["tree_config"] == {"budget": 10, "branching": 3, "depth": 4}
    trees = [r["tree"] for r in res["rounds"] if r["tree"]]
    assert trees and all(len(t["nodes"]) <= 10 and max(n["depth"] for n in t["nodes"]) <= 4 for t in trees)
    for r in res["rounds"]:
        if r["tree"]:
            kept = [r["tree"]["nodes"][i]["token"] for i in r["tree"]["path"]]
            assert kept == r["draft_tokens"][: r["n_accepted"]]
            assert {n["verdict"] for n in r["tree"]["nodes"]} <= {"accepted", "rejected", "unreached"}


@pytest.mark.parametrize("bad", [["--tree-budget", "0"], ["--tree-branching", "9"], ["--tree-depth", "17"]])
def test_cli_refuses_bad_tree_shapes_in_one_line(bad):
    from tests.test_cli import assert_one_error_line, run_cli

    done = run_cli("generate", "--pair", "tiny-random", "--prompt", "x", "--drafter", "tree", *bad, in_process=True)
    assert_one_error_line(done, 2, bad[0])
