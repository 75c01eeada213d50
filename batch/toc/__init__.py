"""The Tree of Clarifications algorithm: one question's tree and the requests it makes (docs/architecture.md).

    tree.py         the tree's state (nodes, waves, pruning status), official ToC semantics
    program.py      a tree as a program of requests (search, embed, clarify, verify, answer) and their results
    settings.py     what a tree reads of the run config (TreeSettings), and nothing else of it
    prompts.py      the prompts' wording, put around the layout
    format.py       the DQ/DA layout: labels, rendering, stop strings, parser, grammar
    demos.py        few-shot demo pools chosen by kNN (ASQA clarification demos, SEMQA quoted demos)
    match.py        answer matching inside the tree (dsp's rules or SQuAD's)
    quotes.py       SEMQA `[k span]` answers checked against their sources
    constraints.py  which grammar each step decodes under; the quotes grammar

It knows nothing of run directories, schedulers or engines beyond the `Engine` contract: the run machinery
(batch/run/pipeline.py, batch/run/scheduler.py, batch/run/cluster.py) drives many trees at once.
"""
