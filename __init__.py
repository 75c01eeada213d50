"""clarify: answer ambiguous questions offline, at batch scale.

Subpackages: `clarify.index` (local Wikipedia retrieval), `clarify.local_llm` (vLLM engine and cache),
`clarify.batch` (Tree of Clarifications, its schedulers, run directories, CLI), `clarify.eval` (ASQA, QuoteSum).
"""

__version__ = "0.1.0"
