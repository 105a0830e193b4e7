"""Grammar-constrained (guided) decoding on llguidance: what a request asks for (``Guide``), its
compiled grammar cached by digest (``GrammarCompiler``), and each sequence's matcher through
speculation (``GrammarState``: masks for every verify row, the tokens the grammar forces)."""

from trispec.guided.spec import GUIDE_TYPES, Guide

__all__ = ["GUIDE_TYPES", "Guide"]
