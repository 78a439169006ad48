"""A tiny random draft/target pair built in-process (no downloads, well under a second).

Used by tests and as the "tiny-random (tests)" preset.  The text is gibberish, but everything else is
real: Qwen2 architecture (the same code path as the default offline pair), KV caches, a fast HF
tokenizer with an EOS token and a chat template.

Why the draft is correlated with the target: two independent random models disagree almost
everywhere, so every draft would be rejected and the visualisation would show nothing interesting.
With ``correlated=True`` the draft is the target's first layer(s), embeddings, final norm and output
head plus Gaussian noise, which gives intermediate acceptance rates, like a real small/large pair.
Why the head is scaled up (``sharpness``): at the default init (std 0.02) a 64-wide model's logits are
nearly flat, so p and q would both be ~uniform and everything would be accepted.

This module imports only :mod:`.pair` and :mod:`.presets`, so the loader can import it freely.
"""

from __future__ import annotations

import time

import torch

from .pair import ModelPair
from .presets import TINY_PRESET

SPECIALS = ["<pad>", "<unk>", "<eos>", "<user>", "<assistant>"]
# Characters in order of preference; the vocabulary takes as many as fit after the specials.
ALPHABET = "abcdefghijklmnopqrstuvwxyz \n.,:()=+-*/0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_'\"!?#[]{}<>;"

CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<assistant>{% else %}<user>{% endif %}{{ m['content'] }}<eos>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def build_tokenizer(vocab_size: int = 32):
    """Character-level fast tokenizer: 5 special tokens then ``vocab_size - 5`` characters."""
    from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    n_chars = vocab_size - len(SPECIALS)
    if not 3 <= n_chars <= len(ALPHABET):
        raise ValueError(f"vocab_size must be between {len(SPECIALS) + 3} and {len(SPECIALS) + len(ALPHABET)}")
    vocab = {tok: i for i, tok in enumerate(SPECIALS + list(ALPHABET[:n_chars]))}
    tk = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # one token per char
    tk.decoder = decoders.Fuse()  # join pieces without the spaces WordLevel would insert
    tk.add_special_tokens(SPECIALS)
    return PreTrainedTokenizerFast(
        tokenizer_object=tk,
        pad_token="<pad>",
        unk_token="<unk>",
        eos_token="<eos>",
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=1024,
    )


def _config(vocab_size: int, hidden: int, layers: int, tokenizer):
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )


def _model(config, seed: int, sharpness: float):
    from transformers import Qwen2ForCausalLM

    # fork_rng: building the pair must not disturb the caller's global random state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
        with torch.no_grad():
            model.lm_head.weight.normal_(0.0, sharpness / config.hidden_size**0.5)
            model.model.embed_tokens.weight.normal_(0.0, 1.0)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    return model


def build_tiny_pair(
    vocab_size: int = 32,
    seed: int = 0,
    *,
    hidden: int = 64,
    target_layers: int = 2,
    draft_layers: int = 1,
    correlated: bool = True,
    noise: float = 0.5,
    sharpness: float = 3.0,
) -> ModelPair:
    """Tiny random Qwen2-style pair (fp32, CPU) sharing a character-level tokenizer.

    ``correlated``: the draft starts as a copy of the target's embeddings, first ``draft_layers``
    layers, final norm and head, then each weight gets noise of ``noise`` times its own std (so
    ``noise=0`` gives a truncated target; larger values lower acceptance).  Otherwise the draft is an
    independent random model (seed + 1).  ``sharpness``: std of the logits, roughly.
    """
    t0 = time.perf_counter()
    if draft_layers > target_layers and correlated:
        raise ValueError("a correlated draft cannot have more layers than the target")
    tokenizer = build_tokenizer(vocab_size)
    target = _model(_config(vocab_size, hidden, target_layers, tokenizer), seed, sharpness)
    draft = _model(_config(vocab_size, hidden, draft_layers, tokenizer), seed + 1, sharpness)
    if correlated:
        target_state = target.state_dict()
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(seed + 2)
            for name, param in draft.state_dict().items():
                src = target_state[name]  # the draft's layers are a prefix of the target's
                jitter = torch.randn_like(src) * (noise * src.float().std() if src.numel() > 1 else 0.0)
                param.copy_(src + jitter)
    for m in (draft, target):
        m.requires_grad_(False)
        m.eval()
    return ModelPair(
        preset=TINY_PRESET,
        draft_name=f"tiny-draft ({draft_layers} layer{'s' * (draft_layers != 1)}, {hidden} wide)",
        target_name=f"tiny-target ({target_layers} layers, {hidden} wide)",
        draft=draft,
        target=target,
        tokenizer=tokenizer,
        device=torch.device("cpu"),
        dtype=torch.float32,
        draft_quant=None,
        eos_token_ids=[tokenizer.eos_token_id],
        context_length=1024,
        vocab_size=vocab_size,
        load_seconds=time.perf_counter() - t0,
    )
