"""The algorithm: speculative decoding itself, with no UI, no server and no files.

settings.py    DecodeSettings and its validation (and the names of drafters, policies, tree modes)
sampling.py    logits -> probabilities (Warp), the chain's acceptance rule (`verdicts`), the residual
kv.py          CachedLM: a model with its KV cache (feed, prefill, crop = the rollback, tree-masked feed)
policy.py      draft-length policies (constant, heuristic, confidence, adaptive) and why drafting stops
engine.py      the speculative and standard decoding loops -> events and traces
tree_round.py  one round of a tree drafter (the engine dispatches to it)

Nothing is imported here: the drafters import this package's lower modules and the engine imports
the drafters, so an eager import of the engine here would be a circle.
"""
