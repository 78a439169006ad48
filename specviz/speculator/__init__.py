"""A learned draft head: an MLP speculator trained on the target's own hidden states.

`model` holds the architecture, `data` the offline corpus and the cached target
pass, `train` the training command (`python -m specviz.speculator.train`),
`store` saving and finding weights; the drafter is specviz.drafters.speculator.
"""
