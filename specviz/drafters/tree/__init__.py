"""Token trees: the tree drafter and the rule that verifies its tree.

structure.py  DraftTree (what a tree round drafted); the lossless multi-candidate acceptance rule
              that verifies it is specviz.core.verify.verify_tree, beside the chain's
drafter.py    TreeDrafter: the draft model grows the tree (iid, best-first or unique children)

One tree round (draft, one target pass, the rule, both caches keep the accepted path) is
specviz.core.tree_round.
"""

from .drafter import TreeDrafter
from .structure import ROOT, DraftTree

__all__ = ["ROOT", "DraftTree", "TreeDrafter"]
