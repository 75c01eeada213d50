"""clarify.eval — ASQA and QuoteSum/SEMQA metrics on Polars tables (docs/evaluation.md).

Modules: `rouge` (ROUGE as each official scorer runs it, offline punkt), `asqa`, `quotesum`, `reader`
(SQuAD 2.0 reader for Disambig-F1), `summary`, `io`, `cli`; `datasets` (one adapter per dataset: what
`clarify run` / `clarify eval` ask of a question set). Answer normalisation and token F1 (`clarify.normalize`)
and the ASQA file reader (`clarify.asqa_file`) live at the top, shared with index/.
Nothing heavy is imported here.
"""
