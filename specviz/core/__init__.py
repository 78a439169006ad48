"""The algorithm: speculative decoding itself, with no UI, no server and no files.

settings.py    DecodeSettings and its validation (and the names of drafters, policies, tree modes)
sampling.py    logits -> probabilities (Warp), the chain's acceptance rule (`verdicts`), the residual
kv.py          CachedLM: a model with its KV cache (feed, prefill, crop = the rollback, tree-masked feed)
policy.py      draft-length policies (constant, heuristic, confidence, adaptive) and why drafting stops
engine.py      the speculative and standard decoding loops -> events and traces
tree_round.py  one round of a tree drafter (the engine dispatches to it)

verify.py      the chain's and the tree's acceptance rules; drafting.py: the Drafter contract; text.py: tokens' text

Nothing is imported here (the engine pulls in torch and transformers).  The core imports nothing above
it: no model backend, drafter or machine; the caller hands the engine its drafter.
"""
