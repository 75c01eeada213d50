"""Extractive QA reader for ASQA's Disambig-F1, with the official SQuAD 2.0 settings.

The ASQA scorer (google-research/language `language/asqa/eval.sh`) runs transformers'
`examples/pytorch/question-answering/run_qa.py` with a RoBERTa-large SQuAD 2.0 checkpoint and
`--version_2_with_negative --max_seq_length 384 --null_score_diff_threshold 0` (defaults: doc_stride 128,
n_best_size 20, max_answer_length 30); the context of every disambiguated question is the predicted long
answer (`convert_to_roberta_format.py::qa_format`). transformers 5 no longer has a "question-answering"
pipeline, so this module does the same two steps itself:

- features as run_qa.py::prepare_validation_features: tokenizer(question.lstrip(), context,
  truncation="only_second", max_length=384, stride=128, return_overflowing_tokens=True,
  return_offsets_mapping=True); offsets of non-context tokens are set to None;
- answers as utils_qa.py::postprocess_qa_predictions with version_2_with_negative=True (`best_answer`).

A reader is any callable `(questions, contexts) -> list[str]` ("" = no answer); `ExtractiveReader` is the
one backed by a local model directory (any `AutoModelForQuestionAnswering` + fast tokenizer).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from clarify.errors import InputError

Reader = Callable[[Sequence[str], Sequence[str]], list[str]]


def best_answer(
    start_logits: Sequence[np.ndarray],
    end_logits: Sequence[np.ndarray],
    offsets: Sequence[Sequence[tuple[int, int] | None]],
    context: str,
    *,
    n_best_size: int = 20,
    max_answer_length: int = 30,
    null_score_diff_threshold: float = 0.0,
) -> str:
    """The SQuAD 2.0 answer of one example from its features' logits; "" means no answer.

    utils_qa.py::postprocess_qa_predictions (version_2_with_negative=True): per feature, the null score is
    start[0] + end[0] and the example's null score is the *minimum* over features; candidates are the top
    `n_best_size` starts × ends inside the context (offset not None), end ≥ start, length ≤
    max_answer_length, scored start + end; keep the n-best together with the null candidate; the best
    candidate with non-empty text wins unless null_score − (its start + end) > threshold.
    """
    null_score: float | None = None
    candidates: list[tuple[float, str]] = []
    for s_log, e_log, offs in zip(start_logits, end_logits, offsets):
        feature_null = float(s_log[0] + e_log[0])
        if null_score is None or feature_null < null_score:
            null_score = feature_null
        starts = np.argsort(s_log)[-1 : -n_best_size - 1 : -1].tolist()
        ends = np.argsort(e_log)[-1 : -n_best_size - 1 : -1].tolist()
        for si in starts:
            for ei in ends:
                if si >= len(offs) or ei >= len(offs) or offs[si] is None or offs[ei] is None:
                    continue
                if ei < si or ei - si + 1 > max_answer_length:
                    continue
                candidates.append((float(s_log[si] + e_log[ei]), context[offs[si][0] : offs[ei][1]]))
    if null_score is None:  # no features at all
        return ""
    # utils_qa keeps the n-best (null included) and picks the first one whose text is non-empty.
    ranked = sorted(candidates + [(null_score, "")], key=lambda c: c[0], reverse=True)[:n_best_size]
    best = next((c for c in ranked if c[1] != ""), None)
    if best is None:  # utils_qa inserts a fake "empty" answer with score 0 here
        best = (0.0, "empty")
    return "" if null_score - best[0] > null_score_diff_threshold else best[1]


class ExtractiveReader:
    """A SQuAD 2.0 reader from a local model directory, used as `reader(questions, contexts)`.

    Settings default to the ASQA scorer's (max_seq_length 384, doc_stride 128, n_best 20, max answer 30
    tokens, null threshold 0). Empty contexts get "" without running the model.
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        batch_size: int = 32,
        max_seq_length: int = 384,
        doc_stride: int = 128,
        n_best_size: int = 20,
        max_answer_length: int = 30,
        null_score_diff_threshold: float = 0.0,
        device: str | None = None,
        progress: bool = True,
    ):
        path = Path(model_dir)
        if not path.is_dir() or not (path / "config.json").is_file():
            raise InputError("not a model directory (needs config.json, weights and a tokenizer)", path=str(path))
        import torch
        from transformers import AutoModelForQuestionAnswering, AutoTokenizer

        try:
            # never the folder's own Python code (an `auto_map` in config.json), whatever transformers' default
            self.tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
            self.model = AutoModelForQuestionAnswering.from_pretrained(str(path), trust_remote_code=False)
        except (OSError, ValueError) as exc:
            raise InputError(f"cannot load a question-answering model: {exc}", path=str(path)) from exc
        if not getattr(self.tokenizer, "is_fast", False):
            raise InputError("the reader needs a fast tokenizer (tokenizer.json) for offsets", path=str(path))
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model.to(self.device).eval()
        self.batch_size = batch_size
        self.max_seq_length = max_seq_length
        self.doc_stride = doc_stride
        self.n_best_size = n_best_size
        self.max_answer_length = max_answer_length
        self.null_score_diff_threshold = null_score_diff_threshold
        self.progress = progress
        self.model_dir = str(path)

    def __call__(self, questions: Sequence[str], contexts: Sequence[str]) -> list[str]:
        import torch
        from tqdm import tqdm

        answers = [""] * len(questions)
        todo = [i for i, c in enumerate(contexts) if c and c.strip()]
        pad_on_right = self.tokenizer.padding_side == "right"
        steps = range(0, len(todo), self.batch_size)
        for lo in tqdm(steps, desc="reader", unit="batch", disable=not self.progress or len(steps) < 2 or None):
            idx = todo[lo : lo + self.batch_size]
            qs = [questions[i].lstrip() for i in idx]
            cs = [contexts[i] for i in idx]
            enc = self.tokenizer(
                qs if pad_on_right else cs,
                cs if pad_on_right else qs,
                truncation="only_second" if pad_on_right else "only_first",
                max_length=self.max_seq_length,
                stride=self.doc_stride,
                return_overflowing_tokens=True,
                return_offsets_mapping=True,
                padding="longest",
                return_tensors="pt",
            )
            sample_map = enc.pop("overflow_to_sample_mapping").tolist()
            offset_mapping = enc.pop("offset_mapping").tolist()
            context_index = 1 if pad_on_right else 0
            with torch.no_grad():
                out = self.model(**{k: v.to(self.device) for k, v in enc.items()})
            start = out.start_logits.float().cpu().numpy()
            end = out.end_logits.float().cpu().numpy()
            per_example: dict[int, list[int]] = {}
            for f, s in enumerate(sample_map):
                per_example.setdefault(s, []).append(f)
            for s, feats in per_example.items():
                offs = []
                for f in feats:
                    seq_ids = enc.sequence_ids(f)
                    offs.append([o if seq_ids[t] == context_index else None for t, o in enumerate(offset_mapping[f])])
                answers[idx[s]] = best_answer(
                    [start[f] for f in feats],
                    [end[f] for f in feats],
                    offs,
                    cs[s],
                    n_best_size=self.n_best_size,
                    max_answer_length=self.max_answer_length,
                    null_score_diff_threshold=self.null_score_diff_threshold,
                )
        return answers


def as_reader(reader: Reader | str | Path | None) -> Reader | None:
    """None → None; a path → `ExtractiveReader(path)`; a callable is used as is."""
    if reader is None:
        return None
    if isinstance(reader, str | Path):
        return ExtractiveReader(reader)
    if not callable(reader):
        raise TypeError(f"reader must be a model directory or a callable, got {type(reader).__name__}")
    return reader
