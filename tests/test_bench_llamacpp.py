"""--compare-llamacpp (issue 35): llama.cpp's plain decoding of the target's GGUF as one more interleaved
configuration of the bench.  llama-cpp-python is never a requirement, so these tests stand a fake runner
in for it (greedy decoding with the tiny pair's own target, so its text must equal specviz's standard);
the bench itself, on the real pair and the real bindings, is in the README."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specviz.cli import bench, bench_llamacpp
from specviz.cli.bench_report import LLAMACPP
from tests.test_bench import prompts_file  # noqa: F401  (the fixture)


class FakeLlama:
    """What bench_llamacpp.LlamaCpp offers, decoding greedily with a given model."""

    instances: list["FakeLlama"] = []

    def __init__(self, path: Path, threads: int):
        self.path, self.threads, self.calls = Path(path), threads, []
        FakeLlama.instances.append(self)

    def version(self) -> str:
        return "fake"

    def greedy(self, ids, max_new_tokens, eos, keep=()):
        self.calls.append((list(ids), max_new_tokens))
        self.kept = tuple(keep)
        model = bench.load_pair(bench.resolve_preset("tiny")).target
        seq, new = list(ids), []
        with torch.inference_mode():
            while len(new) < max_new_tokens:
                token = int(model(torch.tensor([seq])).logits[0, -1].argmax())
                new.append(token)
                seq.append(token)
                if token in eos:
                    break
        return new, 0.01 * len(new), 0.01 * max(0, len(new) - 1)


def test_llamacpp_runs_interleaved_with_the_same_prompt_ids(prompts_file, tmp_path, monkeypatch, capsys):  # noqa: F811
    FakeLlama.instances.clear()
    monkeypatch.setattr(bench_llamacpp, "available", lambda: True)
    monkeypatch.setattr(bench_llamacpp, "LlamaCpp", FakeLlama)
    monkeypatch.setattr(bench_llamacpp, "gguf_file", lambda ref, progress=None: tmp_path / "target.gguf")
    out = tmp_path / "bench.json"
    rc = bench.main(["--preset", "tiny", "--prompts", str(prompts_file), "--gamma", "2", "--max-new-tokens", "6",
                     "--repeats", "2", "--compare-llamacpp", "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["configs"][-1] == LLAMACPP and doc["llamacpp"]["gguf"] == "target.gguf"
    llama = FakeLlama.instances[0]
    # one warm-up, then 2 prompts x 2 repeats, each on the prompt ids specviz's own runs decode
    assert len(llama.calls) == 1 + 2 * 2 and all(n == 6 for _, n in llama.calls[1:])
    ids = [bench.encode_prompt(bench.load_pair(bench.resolve_preset("tiny")), p["prompt"], chat=True) for p in
           [json.loads(line) for line in prompts_file.read_text().splitlines()]]
    assert {tuple(c) for c, _ in llama.calls[1:]} == {tuple(i) for i in ids}
    for p in doc["prompts"]:
        assert p["configs"][LLAMACPP]["greedy_equal"]  # the stand-in decodes as specviz's standard does
    assert doc["aggregate"][LLAMACPP]["greedy_equal_prompts"] == "2/2"
    text = capsys.readouterr().out
    assert "llamacpp (plain decoding of the same GGUF)" in text and "2/2 prompts" in text
    # the rate after the first token, each run's prompt pass left out (the stand-in: 10 ms a token, the first alike)
    agg = doc["aggregate"]
    assert agg[LLAMACPP]["decode_tok_s"]["median"] == pytest.approx(100.0)
    assert agg[LLAMACPP]["first_token_share"] == pytest.approx(1 / 6)
    assert 0 < agg["standard"]["first_token_share"] < 1 and agg["standard"]["decode_tok_s"]["median"] > 0
    assert all("decode_tok_s" in r for r in doc["prompts"][0]["runs"][LLAMACPP])
    line = next(t for t in text.splitlines() if t.startswith("after the prompt's pass"))
    assert "17% of llama.cpp's time" in line and "llamacpp 100.00 [100.00-100.00] tok/s" in line


def test_compare_llamacpp_is_refused_clearly(prompts_file, monkeypatch, capsys):  # noqa: F811
    monkeypatch.setattr(bench_llamacpp, "available", lambda: False)
    with pytest.raises(SystemExit):
        bench.main(["--preset", "tiny", "--prompts", str(prompts_file), "--compare-llamacpp"])
    assert "pip install --no-binary llama-cpp-python" in capsys.readouterr().err
    monkeypatch.setattr(bench_llamacpp, "available", lambda: True)
    with pytest.raises(SystemExit):
        bench.main(["--preset", "tiny", "--prompts", str(prompts_file), "--compare-llamacpp", "--temperature", "1"])
    assert "greedy" in capsys.readouterr().err
    # the tiny pair has no GGUF file: a clear error, exit status 2
    assert bench.main(["--preset", "tiny", "--prompts", str(prompts_file), "--compare-llamacpp",
                       "--repeats", "1", "--max-new-tokens", "2"]) == 2
    assert "offline pack" in capsys.readouterr().err


def test_every_llamacpp_run_pays_its_prompt_pass(monkeypatch):
    """llama-cpp-python's generate() reuses the longest cached prefix of the ids it is given: without a
    reset, a prompt's repeat skipped the prompt pass every specviz run pays (its rate came out ~30 % high)."""
    events = []

    class Llama:  # the binding's interface as LlamaCpp uses it
        def __init__(self, **kwargs):
            self.n_tokens = 0

        def reset(self):
            events.append("reset")
            self.n_tokens = 0

        def eval(self, ids):
            events.append(("eval", list(ids)))
            self.n_tokens += len(ids)

        def generate(self, ids, **kwargs):
            events.append(("generate", self.n_tokens, kwargs.get("reset")))
            self.n_tokens = len(ids)
            yield from [7, 8, 9]

    import sys
    import types

    monkeypatch.setitem(sys.modules, "llama_cpp", types.SimpleNamespace(Llama=Llama, __version__="fake"))
    monkeypatch.setattr(bench_llamacpp, "available", lambda: True)
    runner = bench_llamacpp.LlamaCpp(Path("x.gguf"), threads=2)
    for _ in range(2):
        new, _, _ = runner.greedy([1, 2, 3], 3, eos=set())
        assert new == [7, 8, 9]
    assert events == ["reset", ("generate", 0, True), "reset", ("generate", 0, True)]
    # The chat template's head, which specviz keeps across runs: evaluated before the clock starts, every run
    # (generate then keeps that cached prefix and feeds the rest); a prompt not beginning with it: nothing kept.
    events.clear()
    runner.greedy([1, 2, 3, 4], 3, eos=set(), keep=(1, 2))
    runner.greedy([5, 2, 3, 4], 3, eos=set(), keep=(1, 2))
    assert events == ["reset", ("eval", [1, 2]), ("generate", 2, True), "reset", ("generate", 0, True)]
