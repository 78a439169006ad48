"""The drafters: everything that proposes tokens for the target to verify.

(Placeholder registry; the contract lands with the engine restructure.)
"""

DRAFTERS: dict[str, str] = {"model": "draft model", "prompt-lookup": "prompt lookup"}
from .prompt_lookup import PromptLookupDrafter  # noqa: E402  (temporary, until the contract lands)
