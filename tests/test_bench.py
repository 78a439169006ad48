"""The bench CLI, run in-process on the tiny pair: every configuration, sane numbers, honest transformers settings."""

from __future__ import annotations

import json
import statistics

import pytest

from specviz.cli import bench, bench_hf, bench_report
from specviz.core.settings import DRAFT_STOPS
from specviz.core.settings import POLICIES

GAMMA, MAX_NEW = 2, 12
PROMPTS = [
    {"name": "code", "category": "code", "prompt": "def add(a, b):"},
    {"name": "chat", "category": "chat", "prompt": "hello there, how are you?"},
]


def spreads(obj, path=""):
    """Every {median, min, max} in a JSON tree."""
    if isinstance(obj, dict):
        if set(obj) == {"median", "min", "max"}:
            yield path, obj
        for k, v in obj.items():
            yield from spreads(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from spreads(v, f"{path}[{i}]")


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in PROMPTS) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def spy(monkeypatch):
    """Record the pair the bench loads, and the assistant's draft-length settings each time
    transformers' assisted generation asks the draft model for candidates."""
    seen: dict = {"pair": None, "draft_calls": []}
    load = bench.load_pair

    def load_and_keep(*a, **kw):
        seen["pair"] = load(*a, **kw)
        return seen["pair"]

    monkeypatch.setattr(bench, "load_pair", load_and_keep)
    from transformers.generation.utils import GenerationMixin

    generate = GenerationMixin.generate

    def spying_generate(self, *a, **kw):
        pair = seen["pair"]
        if pair is not None and self is pair.draft:  # a candidate call inside assisted generation
            cfg = self.generation_config
            values = {k: getattr(cfg, k) for k in bench_hf.ASSISTANT_KEYS}
            seen["draft_calls"].append((values, kw.get("max_new_tokens")))
        return generate(self, *a, **kw)

    monkeypatch.setattr(GenerationMixin, "generate", spying_generate)
    return seen


def test_bench_runs_every_configuration_with_sane_numbers(prompts_file, tmp_path, spy, capsys):
    out = tmp_path / "bench.json"
    rc = bench.main(["--preset", "tiny", "--prompts", str(prompts_file), "--gamma", str(GAMMA),
                     "--max-new-tokens", str(MAX_NEW), "--repeats", "2", "--compare-hf", "--policy", "all",
                     "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text(encoding="utf-8"))
    configs = ["standard"] + [f"spec-{p}" for p in POLICIES] + ["hf_plain", "hf_same", "hf_default"]
    assert doc["configs"] == configs and doc["repeats"] == 2 and doc["policies"] == list(POLICIES)
    assert set(doc["aggregate"]) == set(configs)

    for p in doc["prompts"]:
        assert set(p["configs"]) == set(configs) and set(p["runs"]) == set(configs)
        # The order rotates between repeats, so no configuration always runs first.
        assert p["orders"][0] == configs and p["orders"][1] == configs[1:] + configs[:1]
        for cfg in configs:
            runs = p["runs"][cfg]
            assert len(runs) == 2
            for r in runs:
                assert 1 <= r["tokens"] <= MAX_NEW and r["seconds"] > 0
                assert r["tok_s"] == pytest.approx(r["tokens"] / r["seconds"])
            m = p["configs"][cfg]
            assert m["tok_s"]["median"] == pytest.approx(statistics.median(r["tok_s"] for r in runs))
            # Greedy, fp32: every way of decoding gives the standard text token for token.
            if cfg != "standard":
                assert m["greedy_equal"] is True and m["first_diff"] is None
        for policy in POLICIES:
            m = p["configs"][f"spec-{policy}"]
            assert 0 <= m["alpha"] <= 1 and 0 < m["mean_draft_length"] <= GAMMA
            assert m["c"]["median"] > 0 and m["theory"] > 0 and m["verify_extra"]["median"] > -1
            assert set(m["draft_stops"]) <= set(DRAFT_STOPS)
            # One stop reason per round, summed over the repeats.
            assert sum(m["draft_stops"].values()) == sum(sum(r["draft_stops"].values())
                                                         for r in p["runs"][f"spec-{policy}"])
    for path, s in spreads(doc):
        assert s["min"] <= s["median"] <= s["max"], path

    # Aggregates are total tokens / total time, per repeat, then the median over repeats.
    agg = doc["aggregate"]
    for cfg in configs:
        per_repeat = [sum(p["runs"][cfg][rep]["tokens"] for p in doc["prompts"])
                      / sum(p["runs"][cfg][rep]["seconds"] for p in doc["prompts"]) for rep in range(2)]
        assert agg[cfg]["tok_s"]["median"] == pytest.approx(statistics.median(per_repeat))
    assert agg["spec-constant"]["mean_draft_length"] <= GAMMA
    assert set(agg["spec-adaptive"]["draft_stops"]) <= set(DRAFT_STOPS)

    # hf_same really used γ: transformers read it from the assistant's generation_config, which
    # the bench set for the call and restored afterwards; hf_default ran transformers' defaults.
    pair = spy["pair"]
    assert {k: getattr(pair.draft.generation_config, k) for k in bench_hf.ASSISTANT_KEYS} == dict.fromkeys(
        bench_hf.ASSISTANT_KEYS)  # the tiny draft sets none of them, and still sets none
    same = {"num_assistant_tokens": GAMMA, "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": 0.0}
    assert doc["hf"]["same"] == same
    assert doc["hf"]["default"] == {"num_assistant_tokens": 20, "num_assistant_tokens_schedule": "constant",
                                    "assistant_confidence_threshold": 0.4}
    calls = spy["draft_calls"]
    same_calls = [n for cfg, n in calls if cfg == same]
    default_calls = [n for cfg, n in calls if cfg == dict.fromkeys(bench_hf.ASSISTANT_KEYS)]
    assert same_calls and default_calls and len(same_calls) + len(default_calls) == len(calls)
    assert all(n <= GAMMA for n in same_calls)  # at most γ candidates per round
    assert max(default_calls) > GAMMA  # transformers' own 20, cut by the tokens left

    # The readable table: one row per policy, then the baselines.
    text = capsys.readouterr().out
    rows = [line.split()[0] for line in text.splitlines() if line.split()]
    assert all(p in rows for p in POLICIES)
    assert "hf_same:" in rows and "hf_default:" in rows and "hf_plain:" in rows


def test_bench_single_policy_sampling_prints_one_row_per_prompt(prompts_file, tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = bench.main(["--preset", "tiny", "--prompts", str(prompts_file), "--gamma", "3", "--max-new-tokens", "8",
                     "--repeats", "1", "--temperature", "1", "--top-k", "5", "--top-p", "0.9", "--compare-hf",
                     "--category", "chat", "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert [p["name"] for p in doc["prompts"]] == ["chat"]
    assert doc["configs"] == ["standard", "spec-constant", "hf_plain", "hf_same", "hf_default"]
    for cfg, m in doc["prompts"][0]["configs"].items():
        assert "greedy_equal" not in m  # only greedy output has one right answer
        assert 1 <= m["tokens"] <= 8
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].startswith("chat") and lines[3].startswith("ALL")


def test_bad_arguments_are_refused_with_a_message(prompts_file, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--preset", "tiny", "--prompts", str(prompts_file), "--gamma", "0"])
    assert "γ" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--preset", "tiny", "--repeats", "0"])
    assert bench.main(["--preset", "tiny", "--prompts", str(prompts_file), "--category", "poetry"]) == 2
    assert "no prompts of category" in capsys.readouterr().err


def test_assistant_settings_are_restored_even_when_generate_fails():
    from transformers import GenerationConfig

    class Model:
        generation_config = GenerationConfig(num_assistant_tokens=7)

    m = Model()
    with pytest.raises(RuntimeError), bench_hf.assistant_settings(m, num_assistant_tokens=3,
                                                                assistant_confidence_threshold=0.0):
        assert m.generation_config.num_assistant_tokens == 3
        raise RuntimeError("generate failed")
    assert m.generation_config.num_assistant_tokens == 7
    assert m.generation_config.assistant_confidence_threshold is None


def test_theory_and_divergence_helpers():
    assert bench_report.thm38(0.0, 4, 0.1) == pytest.approx(1 / 1.4)  # nothing accepted: one token per round
    assert bench_report.thm38(1.0, 4, 0.1) == pytest.approx(5 / 1.4)
    assert bench_report.thm38(0.5, 2.5, 0.2) == pytest.approx((1 - 0.5**3.5) / 0.5 / 1.5)  # a mean draft length
    assert bench_report.thm38(0.5, 2, 0.2, verify=1.5) == pytest.approx(1.75 / 1.9)
    assert bench_report.thm38(None, 3, 0.1) is None
    assert bench_report.first_diff([1, 2, 3], [1, 2, 3]) is None
    assert bench_report.first_diff([1, 2, 3], [1, 5, 3]) == 1
    assert bench_report.first_diff([1, 2], [1, 2, 3]) == 2


def test_bench_tree_drafter_takes_the_unique_tree_mode(prompts_file, tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = bench.main(["--preset", "tiny", "--prompts", str(prompts_file), "--gamma", "3", "--max-new-tokens", "8",
                     "--repeats", "1", "--temperature", "1", "--category", "chat", "--drafter", "tree",
                     "--branches", "3", "--tree-nodes", "6", "--tree-mode", "unique", "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text(encoding="utf-8"))
    s = doc["settings"]
    assert (s["drafter"], s["tree_mode"], s["branches"], s["tree_nodes"]) == ("tree", "unique", 3, 6)
    assert 1 <= doc["prompts"][0]["configs"]["spec-constant"]["tokens"] <= 8
    with pytest.raises(SystemExit):
        bench.main(["--preset", "tiny", "--prompts", str(prompts_file), "--drafter", "tree", "--tree-mode", "beam"])


def test_gamma_max_applies_to_the_dynamic_policies_only(prompts_file, tmp_path, capsys):
    """--gamma-max is the dynamic policies' maximum; constant (and hf_same, standard) keep --gamma."""
    out = tmp_path / "bench.json"
    rc = bench.main(["--preset", "tiny", "--prompts", str(prompts_file), "--gamma", "2", "--gamma-max", "4",
                     "--tau", "0", "--max-new-tokens", str(MAX_NEW), "--repeats", "1", "--policy", "all",
                     "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["settings"]["gamma"] == 2 and doc["gamma_max"] == 4
    agg = doc["aggregate"]
    assert agg["spec-constant"]["mean_draft_length"] <= 2
    # τ = 0: the confidence policy never stops early, so it drafts past the constant γ up to 4.
    assert 2 < agg["spec-confidence"]["mean_draft_length"] <= 4
    # The per-prompt rate table: one row per prompt and ALL, one column per configuration.
    text = capsys.readouterr().out
    header = next(line for line in text.splitlines() if "standard" in line and "confidence" in line
                  and "adaptive" in line)
    assert "heuristic" in header
    assert any(line.split() and line.split()[0] == "ALL" for line in text.splitlines())


def test_versus_runs_the_draft_models_chain_beside_a_tree_on_one_clock(prompts_file, tmp_path, capsys):
    """--versus: the tree (with the adaptive policy) and the chain's policies run interleaved in the
    same repeats, and both appear in the tables and the JSON."""
    out = tmp_path / "bench.json"
    rc = bench.main(["--preset", "tiny", "--prompts", str(prompts_file), "--gamma", "2", "--gamma-max", "4",
                     "--max-new-tokens", "8", "--repeats", "2", "--drafter", "tree", "--branches", "2",
                     "--policy", "adaptive", "--versus", "constant,adaptive", "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text(encoding="utf-8"))
    configs = ["standard", "spec-adaptive", "chain-constant", "chain-adaptive"]
    assert doc["configs"] == configs and doc["versus"] == ["constant", "adaptive"]
    for p in doc["prompts"]:
        assert p["orders"][1] == configs[1:] + configs[:1]  # interleaved, rotating
        assert all(len(p["runs"][c]) == 2 for c in configs)
    agg = doc["aggregate"]
    assert agg["chain-constant"]["mean_draft_length"] <= 2 and agg["spec-adaptive"]["tokens"] > 0
    text = capsys.readouterr().out
    assert "chain adaptive" in text and "chain constant" in text
    for bad, says in ((["--versus", "beam"], "unknown policy"), (["--drafter", "model", "--versus", "all"], "chain")):
        with pytest.raises(SystemExit):
            bench.main(["--preset", "tiny", "--prompts", str(prompts_file), "--drafter", "tree", *bad])
        assert says in capsys.readouterr().err


def test_rule_all_runs_one_configuration_per_rule(prompts_file, tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = bench.main(["--preset", "tiny", "--prompts", str(prompts_file), "--gamma", "3", "--max-new-tokens", "10",
                     "--repeats", "1", "--temperature", "1", "--rule", "all", "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["configs"] == ["standard", "spec-token", "spec-block", "spec-match"] and doc["rules"] == [
        "token", "block", "match"]
    agg = doc["aggregate"]
    for rule in ("token", "block", "match"):
        m = agg[f"spec-{rule}"]
        assert 1.0 <= m["mean_accepted_length"] <= 4.0
        same = m["same_draft_mal"]  # each rule's exact expectation on this run's own drafts
        assert set(same) == {"token", "block", "match"} and same["token"] >= same["match"] - 1e-9
    text = capsys.readouterr().out
    assert "same draft token/block/match" in text and "block" in text and "match" in text
    # greedy: all three rules keep the same text as standard decoding
    rc = bench.main(["--preset", "tiny", "--prompts", str(prompts_file), "--gamma", "3", "--max-new-tokens", "10",
                     "--repeats", "1", "--rule", "all", "--json", str(out)])
    agg = json.loads(out.read_text(encoding="utf-8"))["aggregate"]
    assert rc == 0 and all(agg[f"spec-{r}"]["greedy_equal_prompts"] == "2/2" for r in ("token", "block", "match"))
    with pytest.raises(SystemExit):  # ε belongs to the token rule
        bench.main(["--preset", "tiny", "--prompts", str(prompts_file), "--rule", "block", "--epsilon", "0.1"])
    assert "token-wise rule only" in capsys.readouterr().err
