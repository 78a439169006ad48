"""Token trees: the tree drafter and the rule that verifies its tree.

structure.py  DraftTree (what a tree round drafted) and `verify`, the lossless multi-candidate
              acceptance rule, with the tree attention mask
drafter.py    TreeDrafter: the draft model grows the tree (iid, best-first or unique children)

One tree round (draft, one target pass, the rule, both caches keep the accepted path) is
specviz.core.tree_round.
"""

from .drafter import TreeDrafter
from .structure import ROOT, DraftTree, verify

__all__ = ["ROOT", "DraftTree", "TreeDrafter", "verify"]
