"""The Watch page plays a tree run (AppTest, tiny-random) and the tree picture escapes every token."""

from __future__ import annotations

from dataclasses import replace

from specviz.core.trace import RoundTrace, TreeNode, TreeTrace
from specviz.viz.tree import tree_html
from tests.test_page_watch import XSS, html, make_app, no_exception, play_to_end, texts


def _node(token, text, parent, depth, verdict, tried=True):
    return TreeNode(token, text, parent, depth, 0.5, 0.4, parent < 0 and depth == 1, 0.5 if tried else None,
                    0.1 if tried else None, verdict)


def _round(nodes, path, next_text="!", origin="correction"):
    return RoundTrace(0, 0, (), (), (), (), (), (), (), len(path), 7, next_text, origin, None, None, None, 1.0, 2.0,
                      tree=TreeTrace(tuple(nodes), tuple(path)))


def test_tree_html_marks_verdicts_and_escapes_text():
    nodes = [_node(1, XSS, -1, 1, "accepted"), _node(2, "b", -1, 1, "unreached", tried=False),
             _node(3, "<script>", 0, 2, "rejected"), _node(4, "d", 2, 3, "unreached", tried=False)]
    page = tree_html(_round(nodes, [0], next_text="</li>"), "d5")
    assert "<img" not in page and "<script>" not in page and "</li></span>" not in page
    assert "&lt;img" in page and "alert(1)&gt;" in page and "&lt;script&gt;" in page
    assert page.count("sv-acc") == 1 and page.count("sv-struck") == 1 and page.count("sv-faded") == 2
    assert page.count("sv-cor") == 1  # the target's token under the last kept node
    # nesting follows the parents: node 3 is inside node 0's list, node 4 inside node 3's
    assert page.index("&lt;script&gt;") > page.index("&lt;img") and page.index(">d<") > page.index("&lt;script&gt;")
    assert "1 kept · 1 rejected · 2 never reached" in page


def test_chain_rounds_draw_no_tree():
    r = _round([], [])
    assert tree_html(replace(r, tree=None), "d2") == ""


def test_watch_page_plays_a_tree_run_on_tiny_random():
    at = make_app(drafter="tree")
    at.run()
    no_exception(at)
    assert at.radio(key="cfg.drafter").value == "tree"
    at = play_to_end(at)
    page = html(at)
    assert 'class="sv-tree"' in page and "guesses in a tree" in page
    assert "sv-acc" in page
    assert "tree of guesses" in texts(at).lower() or "branch" in texts(at).lower()


def test_a_tree_run_at_d5_shows_its_pass_cost_not_the_chain_formula():
    at = play_to_end(make_app(drafter="tree", level="d5"))
    metrics = {m.label: m.value for m in at.metric}
    assert "nodes per tree" in metrics and float(metrics["tree pass (steps)"]) > 0
    assert float(metrics["nodes per tree"]) >= 1.0
    assert not any(label.startswith("expected") for label in metrics)  # Leviathan's formula is for chains
    assert "has no such curve here" in texts(at)


def _lane_round(verdicts, path, origin):
    """A tree round as the engine records it: chain fields list the accepted branch first, then the other nodes."""
    nodes = [_node(10 + i, f"t{i}", -1 if i == 0 or verdicts[i] != "accepted" else i - 1, 1, v, tried=v != "unreached")
             for i, v in enumerate(verdicts)]
    on_path = set(path)
    order = list(path) + [i for i in range(len(nodes)) if i not in on_path]
    n = len(order)
    return RoundTrace(0, 0, tuple(nodes[i].token for i in order), tuple(nodes[i].text for i in order), (0.5,) * n,
                      (0.4,) * n, (0.5,) * n, (0.1,) * n, tuple(k < len(path) for k in range(n)), len(path), 7, "!",
                      origin, None, None, None, 1.0, 2.0, tree=TreeTrace(tuple(nodes), tuple(path)))


def test_a_tree_lane_marks_off_branch_nodes_by_their_own_verdict():
    """Nodes off the accepted branch were rejected or never reached: the lane must not call the first one "rejected"."""
    from specviz.lessons import labels
    from specviz.viz import playback as pb
    from specviz.viz import strip

    r = _lane_round(["accepted", "accepted", "unreached", "unreached"], [0, 1], "bonus")
    end = pb.lane_state(r, pb.round_frames(r) - 1)
    lane = strip.lane_html(r, end, labels("d2"))
    assert lane.count("sv-acc") == 2 and "sv-rej" not in lane and lane.count("sv-struck") == 2
    assert "kept 2 along one branch of the 4-guess tree to its end, plus 1 bonus" in lane
    assert "kept all 4" not in lane
    assert [strip.draft_verdict(r, i) for i in range(4)] == ["accepted", "accepted", "unreached", "unreached"]
    assert "another branch of the tree" in strip.rule_table_html(r, 2, "d2", True)
    rejected = _lane_round(["accepted", "rejected", "unreached"], [0], "correction")
    lane = strip.lane_html(rejected, pb.lane_state(rejected, pb.round_frames(rejected) - 1), labels("d5"))
    assert lane.count("sv-rej") == 1 and lane.count("sv-struck") == 1 and "path n = 1 of 3 nodes" in lane


def test_the_watch_page_plays_memory_runs_and_says_which_helper_drafted():
    from specviz.app import jobs

    for drafter in ("suffix", "hybrid"):
        jobs.memories.clear()  # AppTest sessions share one session id: without this the hybrid remembers the suffix run
        at = play_to_end(make_app(drafter=drafter, level="d5"))
        no_exception(at)
        assert at.radio(key="cfg.drafter").value == drafter
        if drafter == "hybrid":  # tiny-random's text rarely repeats: the model drafts, and the page says so
            assert "small draft model drafted this round" in texts(at)


def test_play_after_a_remembering_run_makes_the_visitors_next_run_and_compares_the_two():
    at = make_app(drafter="suffix", level="d1")
    play_to_end(at)
    first = at.session_state["watch.run"]
    assert first.spec_key[5] is not None  # (visitor, run number): a remembering run is this visitor's own, never shared
    said = texts(at)
    assert "never from other visitors' runs" in said and "Class-wide memory is on" not in said
    assert "second time" in said.lower() and at.radio(key="watch.predict.second") is not None
    at.radio(key="watch.predict.second").set_value("Much faster").run()
    play_to_end(at)  # Play at the end of the replay: a new run, which drafts from the first
    second = at.session_state["watch.run"]
    assert second.asks == first.asks and second.spec_key != first.spec_key
    assert second.plain_key == first.plain_key  # the baseline does not remember: it is shared
    assert at.session_state["watch.previous"] == first
    assert "Measured: the first run was" in html(at)
    # the second run found the first in this visitor's memory (greedy: the same text, so it copies it)
    spec = at.session_state["watch.run"]
    from specviz.app import jobs

    rounds = jobs.job(spec.spec_key).view().rounds
    assert any(r.memory_source == "visitor" for r in rounds)


def test_the_page_says_when_the_operator_turned_class_wide_memory_on(monkeypatch):
    monkeypatch.setenv("SPECVIZ_CLASS_MEMORY", "1")
    at = make_app(drafter="hybrid")
    at.run()
    no_exception(at)
    assert "Class-wide memory is on" in texts(at)
    monkeypatch.setenv("SPECVIZ_CLASS_MEMORY", "0")
    at.run()
    assert "Class-wide memory is on" not in texts(at)
