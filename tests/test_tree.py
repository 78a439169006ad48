"""Token trees: the tree-masked forward, cache rollback to the accepted path, exactness of the
multi-candidate rule (χ² on the joint of three tokens), batch rejection rates, greedy equivalence
on the real pair, the trace round trip and the tree view."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
import torch

from specviz import theory
from specviz.core.engine import standard_decode
from specviz.core.kv import CachedLM
from specviz.core.sampling import Warp
from specviz.core.settings import DecodeSettings, SettingsError
from specviz.drafters import DraftContext, make_drafter
from specviz.core.verify import ROOT
from specviz.core.verify import verify_tree as verify
from specviz.drafters.tree.structure import DraftTree
from specviz.models.tiny import build_tiny_pair
from specviz.trace import Extra, Position, Round, Token, TraceError, trace_from_dict, trace_from_json
from specviz.trace.tree import RoundTree, TreeNode, TreeTry, TreeVisit
from specviz.views.tree import tree_html, tree_mask_figure, tree_narration, tree_steps
from tests.test_engine import PROMPT, assert_matches, make_pair, next_dist
from tests.drafted import speculative_decode


def tree_settings(mode: str, branches: int, **kw) -> DecodeSettings:
    return DecodeSettings.checked(drafter="tree", tree_mode=mode, branches=branches, **kw)


# ---- the tree forward and the caches -------------------------------------------------

PREFIX = [5, 6, 7, 8, 9, 10, 11]
# (token, parent) in creation order; parent -1 = a child of PREFIX[-1]
NODES = [(12, -1), (13, -1), (12, 0), (14, 0), (15, 1), (16, 2), (17, 2), (12, 5)]


def ancestors_path(nodes, i):
    path = []
    while i >= 0:
        path.append(i)
        i = nodes[i][1]
    return path[::-1]


@torch.inference_mode()
def plain_logits(model, ids):
    return model(input_ids=torch.tensor([ids])).logits[0, -1]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_tree_forward_equals_plain_forward_along_every_path(attn):
    pair = build_tiny_pair()
    model = pair.target
    model.config._attn_implementation = attn
    lm = CachedLM(model, pair.device)
    with torch.inference_mode():
        lm.feed(PREFIX[:4])  # the cache holds a prefix; three prompt tokens are still uncached
        # Two feeds, as the drafter grows a tree level by level: depth ≤ 2, then the rest.
        first = [k for k, (_, par) in enumerate(NODES) if par < 0 or NODES[par][1] < 0]
        rest = [k for k in range(len(NODES)) if k not in first]
        out1 = lm.feed_tree(PREFIX, [NODES[k][0] for k in first], [NODES[k][1] for k in first])
        index = {k: i for i, k in enumerate(first + rest)}  # a node's place among the cache's tree nodes
        out2 = lm.feed_tree(PREFIX, [NODES[k][0] for k in rest], [index[NODES[k][1]] for k in rest])
    assert out1.logits.shape[0] == len(first) + 1 and out2.logits.shape[0] == len(rest)
    torch.testing.assert_close(out1.logits[0], plain_logits(model, PREFIX), atol=1e-5, rtol=0)
    rows = {k: out1.logits[1 + i] for i, k in enumerate(first)} | {k: out2.logits[i] for i, k in enumerate(rest)}
    for k in range(len(NODES)):
        path = [NODES[j][0] for j in ancestors_path(NODES, k)]
        torch.testing.assert_close(rows[k], plain_logits(model, PREFIX + path), atol=1e-5, rtol=0)


def test_keep_path_leaves_exactly_the_accepted_path_in_the_cache():
    pair = build_tiny_pair()
    lm, ref = CachedLM(pair.target, pair.device), CachedLM(pair.target, pair.device)
    path = ancestors_path(NODES, 7)  # 0 → 2 → 5 → 7
    tokens = [NODES[k][0] for k in path]
    with torch.inference_mode():
        lm.prefill(PREFIX)
        lm.feed_tree(PREFIX, [t for t, _ in NODES], [p for _, p in NODES])
        lm.keep_path(path[:3])  # the path's first three nodes: the fourth would be the bonus position
        ref.feed(PREFIX + tokens[:3])
        assert lm.cached == ref.cached == len(PREFIX) + 3
        for a, b in zip(lm.cache.layers, ref.cache.layers):
            assert a.keys.shape == b.keys.shape
            torch.testing.assert_close(a.keys, b.keys, atol=1e-5, rtol=0)
            torch.testing.assert_close(a.values, b.values, atol=1e-5, rtol=0)
        # Decoding goes on from the kept path as from a plain prefix.
        nxt = lm.feed(PREFIX + tokens + [20]).logits[-1]
    torch.testing.assert_close(nxt, plain_logits(pair.target, PREFIX + tokens + [20]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("mode", ["iid", "best-first", "unique"])
def test_drafter_grows_a_tree_and_keeps_only_the_accepted_path(mode):
    pair = build_tiny_pair()
    settings = tree_settings(mode, 3, gamma=3, tree_nodes=7, temperature=1.0)
    drafter = make_drafter(pair, settings)
    gen = torch.Generator().manual_seed(3)
    with torch.inference_mode():
        drafter.start(PREFIX)
        trees = list(drafter.grow(DraftContext(PREFIX, 3, Warp(1.0), gen, pair.device), eos=set()))
    tree = trees[-1]
    assert 3 < len(tree) <= 7 and max(tree.depth(n) for n in range(len(tree))) == 3
    assert tree.forwards == 3  # the prefix, then one forward per expanded depth
    if mode == "iid":
        assert len(tree.tries[ROOT]) == 3 and sum(tree.draws[k] for k in tree.tries[ROOT]) == 3
    elif mode == "unique":
        # M distinct children at each expanded node, within the budget: never pruned afterwards.
        for node, kids in tree.tries.items():
            assert len(kids) == len({tree.tokens[k] for k in kids}) <= 3
        assert len(tree.tries[ROOT]) == 3 and len(tree) == 7
    else:
        # The node budget prunes the lowest cumulative probabilities; root children stay in q order.
        kids = tree.tries[ROOT]
        assert len(tree) == 7 and len(set(kids)) == len(kids) <= 3
        assert [tree.q_tok[k] for k in kids] == sorted((tree.q_tok[k] for k in kids), reverse=True)
    leaf = max(range(len(tree)), key=tree.depth)
    path, node = [], leaf
    while node != ROOT:
        path.insert(0, node)
        node = tree.parents[node]
    with torch.inference_mode():
        drafter.keep_path(path)
        fed = drafter.lm.cached - len(PREFIX)
        assert fed == len(path) - 1  # the leaf was never fed: nothing was drafted below it
        ref = CachedLM(pair.draft, pair.device)
        ref.feed(PREFIX + [tree.tokens[n] for n in path[:fed]])
        for a, b in zip(drafter.lm.cache.layers, ref.cache.layers):
            torch.testing.assert_close(a.keys, b.keys, atol=1e-5, rtol=0)
    drafter.free()


@pytest.mark.parametrize("mode,branches", [("iid", 3), ("best-first", 3), ("unique", 3)])
def test_greedy_tree_equals_standard_decoding_on_tiny_models(mode, branches):
    pair = make_pair(vocab=11, draft_seed=5, target_seed=6, sharp=10.0)
    for prompt in ([1, 2, 3], [7, 7, 0, 1, 9, 10]):
        s = tree_settings(mode, branches, gamma=4, tree_nodes=12, temperature=0.0, max_new_tokens=30)
        spec = speculative_decode(pair, prompt, s)
        std = standard_decode(pair, prompt, s)
        assert [t.id for t in spec.tokens] == [t.id for t in std.tokens]
        assert spec.n_tokens == 30 and spec.summary().rejections > 0  # rollback was exercised
        assert all(r.tree is None or len(r.tree.nodes) <= 12 for r in spec.rounds)
        # The target reads the prompt in the first round's tree pass, as the chain loop does: no pass of its own.
        first = spec.rounds[0]
        assert first.prompt_fed == len(prompt) - 1 and spec.target_prefill < 0.05
        assert first.tree is not None and first.tree.fed == len(prompt) + len(first.tree.nodes)
        assert all(r.prompt_fed == 0 for r in spec.rounds[1:])


# ---- exactness -----------------------------------------------------------------------


def exact_joint(pair, warp, n=3):
    """The target's exact distribution of its first n tokens after PROMPT."""
    out = {(): 1.0}
    for _ in range(n):
        nxt = {}
        for seq, pr in out.items():
            p = next_dist(pair.target, PROMPT + list(seq), warp)
            for x in range(p.numel()):
                if p[x] > 0:
                    nxt[seq + (x,)] = pr * float(p[x])
        out = nxt
    return out


@pytest.mark.parametrize("mode,branches,nodes,top_p,kind", [
    ("iid", 2, 16, 1.0, "fast"),
    ("iid", 3, 16, 0.8, "fast"),
    ("best-first", 2, 64, 1.0, "fast"),  # top-k children, nothing pruned
    ("best-first", 3, 4, 0.8, "llama"),  # best-first: the node budget prunes the tree; transformers' Llama
    ("unique", 2, 16, 1.0, "fast"),  # distinct children drawn without replacement
    ("unique", 3, 5, 0.8, "fast"),  # … with top-p, and a budget that leaves later nodes fewer children
])
def test_tree_speculative_sampling_is_exact(mode, branches, nodes, top_p, kind):
    """The first three emitted tokens follow the target's exact joint distribution (one case on
    transformers' Llama: its 4D tree mask and position ids, the rest on the lean TinyLM)."""
    pair = make_pair(kind=kind)
    warp = Warp(1.0, 0, top_p)
    q1 = next_dist(pair.draft, PROMPT, warp)
    assert 0.5 * float((next_dist(pair.target, PROMPT, warp) - q1).abs().sum()) > 0.2  # the draft disagrees
    base = tree_settings(mode, branches, gamma=2, tree_nodes=nodes, temperature=1.0, top_p=top_p, max_new_tokens=3)
    samples, tries_beyond_first = [], 0
    for seed in range(1200):
        tr = speculative_decode(pair, PROMPT, DecodeSettings(**{**base.as_dict(), "seed": seed}))
        samples.append(tuple(t.id for t in tr.tokens))
        tries_beyond_first += sum(len(v.tries) > 1 for r in tr.rounds if r.tree for v in r.tree.visits)
    assert tries_beyond_first > 50  # later children really were tried (the tree matters)
    assert_matches(samples, exact_joint(pair, warp))


@pytest.mark.parametrize("mode", ["iid", "best-first", "unique"])
def test_multi_candidate_rule_emits_p_on_synthetic_distributions(mode):
    """The rule alone, M = 1…4 children, with p having mass where q has none."""
    p = torch.tensor([0.35, 0.3, 0.2, 0.1, 0.05, 0.0])
    q = torch.tensor([0.05, 0.1, 0.3, 0.3, 0.0, 0.25])
    gen = torch.Generator().manual_seed(7)
    for m in range(1, 5):
        out = []
        for _ in range(3000):
            tree = DraftTree(mode, dist={ROOT: q})
            if mode == "best-first":
                xs = torch.topk(q, m).indices.tolist()
            else:  # q has 5 tokens with mass: M ≤ 4 distinct draws always exist
                xs = torch.multinomial(q, m, replacement=mode == "iid", generator=gen).tolist()
            for x in xs:
                child = tree.child(ROOT, x)
                child = tree.add(x, ROOT, float(q[x]), float(q[x])) if child is None else child
                tree.draws[child] += 1
                tree.tries.setdefault(ROOT, []).append(child)
            v = verify(tree, p.expand(len(tree) + 1, -1), gen, False, set())
            out.append((tree.tokens[v.path[0]] if v.path else v.extra,))
        assert_matches(out, {(x,): float(p[x]) for x in range(6) if p[x] > 0})


def test_greedy_rule_follows_the_child_equal_to_argmax_p():
    tree = DraftTree("best-first", dist={ROOT: torch.tensor([0.5, 0.3, 0.2])})
    for x in (0, 1, 2):
        tree.tries.setdefault(ROOT, []).append(tree.add(x, ROOT, 0.1, 0.1))
    p = torch.tensor([[0.0, 0.0, 1.0]] * 4)  # one-hot: argmax 2, the third child
    v = verify(tree, p, torch.Generator().manual_seed(0), True, set())
    assert v.path == [2] and [t.accepted for t in v.visits[0].tries] == [False, False, True]
    assert v.extra_kind == "bonus" and v.extra == 2


def test_first_position_rejection_rate_matches_the_batch_recursion():
    """P(all M i.i.d. drafts at the first position are rejected) = Π_m TV(q, r_{m−1})."""
    pair = make_pair(kind="llama")  # a pair where M matters (checked below)
    warp = Warp(1.0)
    p, q = next_dist(pair.target, PROMPT, warp), next_dist(pair.draft, PROMPT, warp)
    n = 700
    for m in range(1, 5):
        expect = theory.batch_rejection_exact(p, q, m)[-1]
        s = tree_settings("iid", m, gamma=1, temperature=1.0, max_new_tokens=2)
        rejected = 0
        for seed in range(n):
            tr = speculative_decode(pair, PROMPT, DecodeSettings(**{**s.as_dict(), "seed": seed}))
            tree = tr.rounds[0].tree
            visit = tree.visits[0]
            assert sum(n.draws for n in tree.nodes if n.parent == -1) == m  # M draws, duplicates merged
            assert visit.reject_prob == pytest.approx(expect, abs=1e-5)  # recorded from the real p and q
            rejected += not any(t.accepted for t in visit.tries)
        sigma = (expect * (1 - expect) / n) ** 0.5
        assert abs(rejected / n - expect) < 4 * sigma + 1e-3, (m, rejected / n, expect)
    # M matters here (0.82 → 0.52 on this pair), far beyond the sampling error the check allows.
    assert theory.batch_rejection_exact(p, q, 4)[-1] < theory.batch_rejection_exact(p, q, 1)[-1] - 0.2


# ---- the real default pair -------------------------------------------------------------


@pytest.fixture(scope="module")
def real_tree_run(real_pair_fp32, is_prime_standard):
    pair = real_pair_fp32
    prompt, ids, std = is_prime_standard  # standard greedy decoding, 24 tokens
    s = tree_settings("best-first", 3, gamma=4, tree_nodes=16, temperature=0.0, max_new_tokens=24)
    spec = speculative_decode(pair, ids, s, prompt=prompt)
    return spec, std


@pytest.mark.real_model
def test_greedy_tree_equals_standard_on_the_real_pair(real_tree_run):
    spec, std = real_tree_run
    assert [t.id for t in spec.tokens] == [t.id for t in std.tokens] and spec.n_tokens == 24
    summ = spec.summary()
    assert summ.rounds < spec.n_tokens and summ.accepted > 0
    assert all(r.tree is not None and len(r.tree.nodes) <= 16 for r in spec.rounds if r.draft)
    back = trace_from_json(spec.to_json())
    assert back.to_dict() == spec.to_dict()


@pytest.mark.real_model
def test_real_tree_round_renders(real_tree_run):
    spec, _ = real_tree_run
    rnd = max(spec.rounds, key=lambda r: len(r.tree.path) if r.tree else -1)
    html = tree_html(rnd)
    assert html.count('data-status="accepted"') == len(rnd.tree.path) > 0
    assert tree_steps(rnd) == max(n.depth for n in rnd.tree.nodes) + sum(len(v.tries) for v in rnd.tree.visits) + 1
    depth = max(n.depth for n in rnd.tree.nodes)
    walk = [tree_narration(rnd, step) for step in range(depth + 1, tree_steps(rnd))]
    assert sum(" accepted: u=" in line for line in walk) == len(rnd.tree.path)  # one line per node kept


# ---- settings, trace, view ---------------------------------------------------------------


def test_tree_settings_are_validated():
    assert DecodeSettings().drafter == "model"  # chain runs are unchanged by the tree fields
    with pytest.raises(SettingsError, match="chain drafting only"):
        DecodeSettings.checked(drafter="tree", epsilon=0.1)
    with pytest.raises(SettingsError, match="UNO"):
        DecodeSettings.checked(drafter="tree", variant="uno")
    # Dynamic policies shape trees too (specviz.core.policy: depth, width, nodes verified).
    assert DecodeSettings.checked(drafter="tree", policy="adaptive", gamma=20).policy == "adaptive"
    with pytest.raises(SettingsError, match="branches"):
        DecodeSettings.checked(branches=9)
    with pytest.raises(SettingsError, match="tree nodes"):
        DecodeSettings.checked(tree_nodes=0)
    with pytest.raises(SettingsError, match="tree mode"):
        DecodeSettings.checked(tree_mode="beam")
    assert DecodeSettings.checked(drafter="tree", tree_mode="IID", branches="4").branches == 4
    assert DecodeSettings.checked(epsilon=0.1, branches=8).epsilon == 0.1  # chain: ε as before


def synthetic_round() -> Round:
    """A best-first tree after the prefix: 'a' (rejected), 'b' (accepted) → 'c' (accepted, a leaf);
    'a''s child 'd' and 'b''s second child '<script>' never visited; bonus 'e'."""
    nodes = [TreeNode(0, "a", -1, 1, 0.5), TreeNode(1, "b", -1, 1, 0.3), TreeNode(2, "d", 0, 2, 0.6),
             TreeNode(3, "c", 1, 2, 0.7), TreeNode(4, "<script>", 1, 2, 0.2)]
    visits = [TreeVisit(-1, 0.2, 0.3, [TreeTry(0, 1.0, 0.1, 0.1, 0.6, False), TreeTry(1, 1.0, 0.8, 0.8, 0.2, True)]),
              TreeVisit(1, 0.1, 0.1, [TreeTry(3, 1.0, 0.9, 0.9, 0.4, True)])]
    tree = RoundTree("best-first", nodes, visits, [1, 3], fed=6, t_forward=0.02)
    return Round(index=0, n_before=0, tree=tree, extra=Extra(5, "e", "bonus", 0.9),
                 emitted=[Token(1, "b", "accepted"), Token(3, "c", "accepted"), Token(5, "e", "bonus")],
                 positions=[Position(1, 1.0, 0.8, 0.8, 0.2, True, 0.2, 0.3, 0.0),
                            Position(2, 1.0, 0.9, 0.9, 0.4, True, 0.1, 0.1, 0.0)])


def test_tree_view_steps_through_drafting_and_verification():
    rnd = synthetic_round()
    assert tree_steps(rnd) == 2 + 3 + 1
    status = lambda html, s: html.count(f'data-status="{s}"')  # noqa: E731
    drafting = tree_html(rnd, step=1)
    assert status(drafting, "pending") == 2 and "'c'" not in tree_narration(rnd, 1)
    assert status(tree_html(rnd, step=2), "pending") == 5
    first = tree_html(rnd, step=3)  # 'a' rejected, so its child 'd' is left behind; the rest still pending
    assert (status(first, "rejected"), status(first, "discarded"), status(first, "pending")) == (1, 1, 3)
    assert first.count('data-current="1"') == 1 and 'data-current="1" data-node="0"' in first  # 'a' just tried
    second = tree_html(rnd, step=4)  # 'b' accepted: 'a''s subtree is left behind
    assert status(second, "accepted") == 1 and status(second, "discarded") == 1 and status(second, "pending") == 2
    final = tree_html(rnd)
    assert "data-current" not in final and "data-current" not in drafting
    assert (status(final, "accepted"), status(final, "rejected"), status(final, "discarded"), status(final, "bonus")) \
        == (2, 1, 2, 1)
    assert "<script>" not in final and "&lt;script&gt;" in final
    assert "b = min(1, r/q)" in final and "r(x) before the try" in final
    lines = [tree_narration(rnd, s) for s in range(tree_steps(rnd) + 1)]
    assert lines[3].startswith("After the prefix, child 1 of 2 ('a'") and "excludes 'a'" in lines[3]
    assert "accepted" in lines[4] and "move to 'b'" in lines[4]
    # 'b' has two children: the first one accepted is child 1 of 2, though only one try was needed.
    assert lines[5].startswith("At 'b', child 1 of 2 ('c'")
    tried = re.findall(r'tried</span><span class="sv-tip-v">([^<]*)<', final)
    assert tried == ["1 of 2", "2 of 2", "1 of 2"]  # 'a', 'b' after the prefix; 'c' at 'b'
    assert lines[-1].startswith("The path reached a leaf: bonus 'e'")
    rnd.tree.mode = "unique"  # children drawn without replacement: the next one came from q without 'a'
    assert tree_narration(rnd, 3).endswith("excludes 'a', and the next child was drawn from q without 'a'.")


def test_tree_mask_figure_marks_ancestors():
    rnd = synthetic_round()
    fig = tree_mask_figure(rnd)
    z = fig.data[0].z
    assert len(z) == 5 and len(z[0]) == 6
    seen = [[c > 0 for c in row] for row in z]
    assert seen[3] == [True, False, True, False, True, False]  # 'c': the prefix, 'b' and itself
    assert seen[2] == [True, True, False, True, False, False]  # 'd': the prefix, 'a' and itself
    assert tree_mask_figure(None).layout.annotations  # "no tree round yet"


def test_tree_trace_round_trips_and_chain_rounds_stay_unchanged():
    pair = make_pair()
    s = tree_settings("iid", 3, gamma=3, temperature=1.0, max_new_tokens=12, seed=4)
    tr = speculative_decode(pair, PROMPT, s)
    assert any(r.tree_size > 3 for r in tr.rounds)
    back = trace_from_json(tr.to_json())
    assert back.to_dict() == tr.to_dict() and back.rounds[0].tree == tr.rounds[0].tree
    for r in tr.rounds:  # the chain fields summarise the accepted path
        if r.tree:
            assert [t.id for t in r.emitted[: len(r.tree.path)]] == [r.tree.nodes[k].id for k in r.tree.path]
            assert len(r.positions) == len(r.tree.visits)
    chain = speculative_decode(pair, PROMPT, DecodeSettings(gamma=3, temperature=1.0, max_new_tokens=8))
    assert all("tree" not in r for r in chain.to_dict()["rounds"])
    assert trace_from_json(chain.to_json()).rounds[0].tree is None
    d = json.loads(tr.to_json())
    k = next(i for i, r in enumerate(d["rounds"]) if "tree" in r)
    bad = json.loads(json.dumps(d))
    bad["rounds"][k]["tree"]["nodes"][0]["parent"] = 5
    with pytest.raises(TraceError, match=rf"rounds\[{k}\]\.tree\.nodes\[0\]\.parent"):
        trace_from_dict(bad)
    bad = json.loads(json.dumps(d))
    bad["rounds"][k]["tree"]["visits"][0]["tries"][0]["b"] = 1.5
    with pytest.raises(TraceError, match=r"tree\.visits\[0\]\.tries\[0\]\.b"):
        trace_from_dict(bad)


def test_tree_counts_in_the_engine_match_the_trace():
    pair = make_pair()
    s = tree_settings("best-first", 2, gamma=3, tree_nodes=5, temperature=1.0, max_new_tokens=20, seed=1)
    tr = speculative_decode(pair, PROMPT, s)
    assert tr.n_tokens == 20
    for r in tr.rounds:
        if r.tree is None:
            continue
        assert len(r.tree.nodes) <= 5 and r.tree.fed >= len(r.tree.nodes) + 1
        assert r.draft_forwards <= 3 and r.target_forwards == 1
        kinds = Counter(t.origin for t in r.emitted)
        assert kinds["accepted"] == len(r.tree.path) and kinds["correction"] + kinds["bonus"] <= 1


def test_unique_tree_rounds_have_distinct_children_and_round_trip():
    pair = make_pair()
    tr = speculative_decode(pair, PROMPT, tree_settings("unique", 3, gamma=3, temperature=1.0, max_new_tokens=12,
                                                        seed=2))
    assert "3 distinct draws per node" in tr.models["drafter"]
    for r in (r for r in tr.rounds if r.tree):
        assert r.tree.mode == "unique" and all(n.draws == 1 for n in r.tree.nodes)
        for parent in {n.parent for n in r.tree.nodes}:
            kids = [n.id for n in r.tree.nodes if n.parent == parent]
            assert len(kids) == len(set(kids)) <= 3  # without replacement: no token twice under a node
    back = trace_from_json(tr.to_json())
    assert back.to_dict() == tr.to_dict() and back.settings.tree_mode == "unique"
