"""The Watch page's picture of one tree round: nested lists of escaped token boxes, coloured by verdict."""

from __future__ import annotations

from specviz.core.trace import RoundTrace, TreeTrace
from specviz.viz.strip import esc, token_label

VERDICT_CLASS = {"accepted": "sv-acc", "rejected": "sv-rej sv-struck", "unreached": "sv-faded"}
VERDICT_WORD = {"accepted": "kept", "rejected": "rejected", "unreached": "never reached"}


def _node_box(tree: TreeTrace, i: int, d5: bool) -> str:
    n = tree.nodes[i]
    title = f"{VERDICT_WORD[n.verdict]} · p={n.p:.3f} q={n.q:.3f}" + (
        f" · accept prob {n.accept_prob:.3f}, u={n.uniform:.3f}" if n.accept_prob is not None else "")
    extra = f'<span class="sv-tree-num">p {n.p:.2f} · q {n.q:.2f}</span>' if d5 else ""
    return (f'<span class="sv-tok {VERDICT_CLASS[n.verdict]}" title="{esc(title)}">'
            f'{token_label(n.text)}</span>{extra}')


def _subtree(r: RoundTrace, tree: TreeTrace, node: int, d5: bool) -> str:
    """<ul> of a node's children (in try order), each with its own subtree; the target's token where the walk ended."""
    items = []
    for c in (i for i, n in enumerate(tree.nodes) if n.parent == node):
        items.append(f"<li>{_node_box(tree, c, d5)}{_subtree(r, tree, c, d5)}</li>")
    end = tree.path[-1] if tree.path else -1
    if node == end:  # the target's own token hangs under the last kept node
        cls = "sv-cor" if r.next_origin == "correction" else "sv-bon"
        items.append(f'<li><span class="sv-tok {cls}" title="{esc(r.next_origin)} from the target">'
                     f'{token_label(r.next_text)}</span></li>')
    return f"<ul>{''.join(items)}</ul>" if items else ""


def tree_html(r: RoundTrace, level: str) -> str:
    """One round's tree (empty string for chain rounds): accepted path green, rejected struck, unreached faded."""
    tree = r.tree
    if tree is None:
        return ""
    counts = {v: sum(1 for n in tree.nodes if n.verdict == v) for v in VERDICT_WORD}
    caption = (f"Round {r.index + 1}: {len(tree.nodes)} guesses in a tree · {counts['accepted']} kept · "
               f"{counts['rejected']} rejected · {counts['unreached']} never reached")
    return (f'<div class="sv-tree" role="tree" aria-label="{esc(caption)}"><div class="sv-tree-cap">{esc(caption)}</div>'
            f'<span class="sv-tok sv-tree-root" title="the text so far">▸</span>'
            f"{_subtree(r, tree, -1, level == 'd5')}</div>")
