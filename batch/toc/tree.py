"""One question's Tree of Clarifications, as a state machine that the scheduler steps.

The tree never calls a model or a searcher: it says which node to expand next, takes parsed
clarifications and verdicts, and keeps the breadth-first bookkeeping of the official code
(gankim/tree-of-clarifications `run_toc.py` main loop):

    while restarts < max_restarts and valid nodes < max_nodes and expansions <= max_expansions:
        expansions += 1
        if queue is empty: queue = [root] + valid nodes; restarts += 1      # restart from the root
        node = queue.pop(0)
        if node is too deep: continue
        expand node → candidates; keep the unique ones the verifier calls True (when pruning)
        if some were kept: add them to the queue; continue
        if pruning and (restarts >= max_restarts or expansions >= 10): restarts = 0; pruning = False

Depth here counts from 0 at the root (the official code starts at 1), so nodes at depth >= max_depth
are not expanded. All state is plain data and round-trips through JSON (`to_dict` / `from_dict`), which
is what a wave checkpoint stores.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum

from clarify.batch.config import Duplicates, TocConfig
from clarify.batch.toc.format import Disambiguation
from clarify.normalize import normalize_answer as normalize  # SQuAD-style, as dsp's normalize_text
from clarify.schemas import NodeRow

ROOT = "0"


class Status(StrEnum):
    """A node's status (the `status` column of the nodes table, schemas.NODES)."""

    ROOT = "root"  # the ambiguous question itself
    PENDING = "pending"  # a candidate waiting for its verification
    VALID = "valid"  # kept: verified, or added while pruning is off
    PRUNED = "pruned"  # the verifier said False
    DUPLICATE = "duplicate"  # repeats the tree (TocConfig.duplicates)


def official_unique(valid: list[Node], pair: Disambiguation) -> bool:
    """toc/pruning.py:7-15 check_unique: a candidate is a duplicate only when an earlier valid node has
    the same question (raw `==`) AND its whole DA string, as written (quotes and spaces kept), is a raw
    substring of the candidate's. It is called only while pruning (run_toc.py:233-236) and against
    `toc.valid_qas`, which grows after the expansion (run_toc.py:247): siblings are never compared with
    each other, nor with the root."""
    return not any(v.question == pair.question and v.pair.da in pair.da for v in valid)


def strict_duplicate(pair: Disambiguation, seen_q: set[str], seen_a: set[str]) -> bool:
    """clarify's rule (toc.duplicates = "strict"): the normalised question repeats one in the tree (root,
    valid and pending nodes, earlier siblings included), or every answer is already covered by a valid
    node or an earlier sibling."""
    nq = normalize(pair.question)
    na = {normalize(a) for a in pair.answers} - {""}
    return nq in seen_q or not nq or (bool(na) and na <= seen_a)


@dataclass
class Node:
    node_id: str
    parent_id: str | None
    depth: int
    question: str
    answers: list[str]
    status: str  # a Status (plain text when read back from a checkpoint: the two compare equal)
    wave: int
    evidence_passage_id: str | None = None
    verdict_text: str | None = None
    n_children: int = 0
    answer_text: str = ""  # the DA string as written (Disambiguation.text)

    @property
    def pair(self) -> Disambiguation:
        return Disambiguation(self.question, tuple(self.answers), self.answer_text)


@dataclass
class Tree:
    qid: str
    question: str
    nodes: list[Node] = field(default_factory=list)
    queue: list[str] = field(default_factory=list)
    valid: list[str] = field(default_factory=list)
    n_expansions: int = 0
    n_restarts: int = 0
    pruning: bool = True
    done: bool = False
    seen_passages: list[str] = field(default_factory=list)  # every passage shown in a prompt, in order
    exhausted_passages: list[str] = field(default_factory=list)  # run_toc.py remove_dup_psgs
    removed_demos: list[str] = field(default_factory=list)  # run_toc.py remove_dup_demos
    # the question's own retrieval, best first: with retrieval.node_passages = "pool" the pool every node
    # reranks (run_toc.py:198 all_passages); with "search" the root's own hits
    root_passages: list[str] = field(default_factory=list)
    searched: bool = False  # the question's own retrieval is done (it may have found nothing)

    @classmethod
    def new(cls, qid: str, question: str, *, verify: bool = True) -> Tree:
        root = Node(ROOT, None, 0, question, [], Status.ROOT, 0)
        return cls(qid=qid, question=question, nodes=[root], queue=[ROOT], pruning=verify)

    # -- lookups ---------------------------------------------------------------------------------
    def node(self, node_id: str) -> Node:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise KeyError(f"{self.qid}: no node {node_id}")

    def valid_nodes(self) -> list[Node]:
        return [self.node(i) for i in self.valid]

    # -- stepping --------------------------------------------------------------------------------
    def next_node(self, cfg: TocConfig) -> Node | None:
        """The node to expand in this step, or None when the tree is finished (then `done` is set)."""
        while not self.done:
            if not (self.n_restarts < cfg.max_restarts and len(self.valid) < cfg.max_nodes
                    and self.n_expansions <= cfg.max_expansions):
                self.done = True
                break
            self.n_expansions += 1
            if not self.queue:
                self.queue = [ROOT] + list(self.valid)
                self.n_restarts += 1
            node = self.node(self.queue.pop(0))
            if node.depth >= cfg.max_depth:
                continue
            return node
        return None

    def add_candidates(self, parent: Node, pairs: list[Disambiguation], wave: int,
                       duplicates: Duplicates = Duplicates.OFFICIAL) -> list[Node]:
        """Children of `parent` from one clarification: `duplicate` when `duplicates` (TocConfig) says so,
        else `pending` while pruning is on (to be verified), `valid` at once when it is off."""
        valid_before = self.valid_nodes()
        seen_q = {normalize(n.question) for n in self.nodes if n.status in (Status.ROOT, Status.VALID, Status.PENDING)}
        seen_a = {normalize(a) for n in valid_before for a in n.answers}
        out = []
        for pair in pairs:
            parent.n_children += 1
            if duplicates == Duplicates.OFFICIAL:
                dup = self.pruning and not official_unique(valid_before, pair)
            else:
                dup = strict_duplicate(pair, seen_q, seen_a)
            status = Status.DUPLICATE if dup else (Status.PENDING if self.pruning else Status.VALID)
            child = Node(f"{parent.node_id}.{parent.n_children}", parent.node_id, parent.depth + 1,
                         pair.question, list(pair.answers), status, wave, answer_text=pair.text)
            self.nodes.append(child)
            out.append(child)
            if not dup:
                # strict: a later sibling is compared with earlier siblings whether or not pruning is on
                seen_q.add(normalize(pair.question))
                seen_a |= {normalize(a) for a in pair.answers} - {""}
                if status == Status.VALID:
                    self._keep(child)
        return out

    def settle(self, children: list[Node], verdicts: dict[str, tuple[bool, str | None, str | None]],
               cfg: TocConfig) -> None:
        """Apply verdicts {node_id: (keep, verdict_text, evidence_passage_id)} to pending children and
        do the end-of-expansion bookkeeping (pruning undo)."""
        kept = 0
        for child in children:
            if child.status == Status.PENDING:
                keep, text, evidence = verdicts[child.node_id]
                child.verdict_text, child.evidence_passage_id = text, evidence
                child.status = Status.VALID if keep else Status.PRUNED
                if keep:
                    self._keep(child)
            if child.status == Status.VALID:
                kept += 1
        if kept == 0 and self.pruning and (self.n_restarts >= cfg.max_restarts
                                           or self.n_expansions >= cfg.undo_pruning_after):
            self.n_restarts = 0
            self.pruning = False

    def _keep(self, child: Node) -> None:
        self.valid.append(child.node_id)
        self.queue.append(child.node_id)

    def node_rows(self) -> list[NodeRow]:
        """The tree's nodes as rows of the nodes table (schemas.NODES), in the order they were made."""
        return [NodeRow(qid=self.qid, node_id=n.node_id, parent_id=n.parent_id, depth=n.depth, question=n.question,
                        answers=tuple(n.answers), status=n.status, wave=n.wave,
                        evidence_passage_id=n.evidence_passage_id, verdict_text=n.verdict_text) for n in self.nodes]

    def note_passages(self, passage_ids: list[str]) -> None:
        for pid in passage_ids:
            if pid not in self.seen_passages:
                self.seen_passages.append(pid)

    # -- (de)serialisation -------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Tree:
        d = dict(d)
        d["nodes"] = [Node(**n) for n in d["nodes"]]
        return cls(**d)
