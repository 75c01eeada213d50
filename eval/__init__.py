"""clarify.eval — ASQA and QuoteSum/SEMQA metrics on Polars tables (docs/evaluation.md).

Modules: `normalize` (answer normalisation, token F1), `rouge` (ROUGE as each official scorer runs it,
offline punkt), `asqa`, `quotesum`, `reader` (SQuAD 2.0 reader for Disambig-F1), `summary`, `io`, `cli`;
`datasets` (one adapter per dataset: what `clarify run` / `clarify eval` ask of a question set).
Nothing heavy is imported here.
"""
