"""What a question's tree reads of a run's settings: `TreeSettings`, built from the run config in one place
(`TreeSettings.of`). The tree program (program.py), its grammars (constraints.py) and the drivers of
batch/run/scheduler.py get this and nothing else of the run config: the dataset, paths, engine, cluster and
scheduler settings are the run machinery's, and a tree cannot come to depend on them unseen.
"""

from __future__ import annotations

from dataclasses import dataclass

from clarify.batch.config import AnswerStyle, NodePassages, RunConfig, TocConfig


@dataclass(frozen=True)
class TreeSettings:
    toc: TocConfig  # the whole [toc] table: the loop's limits, its sampling and the fidelity switches
    answer_style: AnswerStyle
    constrain_quotes: bool  # [answer] constrain_quotes
    node_passages: NodePassages  # [retrieval] node_passages, pool and top_k: which passages a node is shown
    pool: int
    top_k: int
    seed: int  # the base of every sampling seed (program.seed_for)
    stop: tuple[str, ...] = ()  # [model] stop: the model's extra stop strings, added to every step's own

    @classmethod
    def of(cls, cfg: RunConfig) -> TreeSettings:
        """The tree's part of a run config."""
        r = cfg.retrieval
        return cls(toc=cfg.toc, answer_style=cfg.answer_style, constrain_quotes=cfg.answer.constrain_quotes,
                   node_passages=r.node_passages, pool=r.pool, top_k=r.top_k, seed=cfg.seed, stop=cfg.model.stop)
