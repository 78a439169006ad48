"""A bf16 model computing in float32 (specviz.models.upcast): the ready pair's execution where the CPU has no
native bf16.  Its weights stay bf16 in memory; its logits are the float32 model's (the same bf16 values held in
float32) up to float32's rounding -- on a random 3-layer model ~1e-4 where computing in bf16 is ~1e-2 off --
with the same greedy tokens, over a prompt, a step and a verify pass."""

from __future__ import annotations

import copy
import threading

import pytest
import torch
import transformers

from specviz.models import upcast


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    config = transformers.Qwen2Config(vocab_size=3000, hidden_size=256, intermediate_size=1024, num_hidden_layers=3,
                                      num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=False)
    fp32 = transformers.Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in fp32.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)  # (Qwen2's q/k/v biases: zero at init)
            p.copy_(p.to(torch.bfloat16))  # bf16 values, as a converted cache holds them
    widened = upcast.widen(copy.deepcopy(fp32).to(torch.bfloat16))
    return fp32, widened, copy.deepcopy(fp32).to(torch.bfloat16)


def test_the_weights_stay_bf16_and_the_rest_is_float32(models):
    _, widened, _ = models
    linears = [m for m in widened.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 3 * 7 + 1 and all(isinstance(m, upcast.UpcastLinear) for m in linears)
    for name, p in widened.named_parameters():
        big = name.endswith("weight") and ("proj" in name or "lm_head" in name or "embed" in name)
        assert p.dtype == (torch.bfloat16 if big else torch.float32), name


@pytest.mark.parametrize("rows_bytes", [upcast.ROWS_BYTES, 4 * 256 * 3], ids=["default", "3-row-blocks"])
def test_prompt_step_and_verify_are_float32s(models, rows_bytes, monkeypatch):
    monkeypatch.setattr(upcast, "ROWS_BYTES", rows_bytes)  # (blocks that do not divide the rows, too)
    fp32, widened, bf16 = models
    ids = torch.randint(0, 3000, (1, 61), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b, c = fp32(ids, use_cache=True), widened(ids, use_cache=True), bf16(ids, use_cache=True)
        outs = [(a.logits, b.logits, c.logits)]
        for n in (1, 4):
            more = ids[:, :n] + 7
            a = fp32(more, past_key_values=a.past_key_values, use_cache=True)
            b = widened(more, past_key_values=b.past_key_values, use_cache=True)
            c = bf16(more, past_key_values=c.past_key_values, use_cache=True)
            outs.append((a.logits, b.logits, c.logits))
    for want, got, in_bf16 in outs:
        assert got.dtype == torch.float32 and got.shape == want.shape
        off, bf16_off = (got - want).abs().max(), (in_bf16.float() - want).abs().max()
        assert off <= 1e-3 and off <= bf16_off / 20, (float(off), float(bf16_off))  # float32's rounding, not bf16's
        assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_each_thread_keeps_one_scratch(models):
    _, widened, _ = models
    ids = torch.tensor([[1, 2, 3]])
    seen = []

    def run():
        with torch.no_grad():
            widened(ids)
            first = upcast._scratch(1).data_ptr()
            widened(ids)
            seen.append((first, upcast._scratch(1).data_ptr()))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(a == b for a, b in seen) and seen[0][0] != seen[1][0]
