"""`ScriptedEngine`: a deterministic stand-in for unit tests of code that drives an Engine.

`responder(prompt, params) -> str` decides each text. Calls and prompts are counted, so a test can
assert how many `generate` calls a stage made (e.g. one per wave). Token counts are whitespace
word counts: good enough for accounting tests, not real tokenizer counts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from clarify.local_llm.engine import Completion, GenParams, NoEngineInfo, Request

Responder = Callable[[str, GenParams], str]


class ScriptedEngine(NoEngineInfo):
    def __init__(self, model_id: str, responder: Responder):
        self.model_id = model_id
        self.responder = responder
        self.calls = 0  # generate calls
        self.prompts_seen: list[str] = []
        self.batch_sizes: list[int] = []

    def generate(self, prompts: Sequence[str], params: Sequence[GenParams]) -> list[Completion]:
        if len(prompts) != len(params):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} params")
        self.calls += 1
        self.batch_sizes.append(len(prompts))
        out = []
        for prompt, gp in zip(prompts, params):
            self.prompts_seen.append(prompt)
            texts = tuple(self.responder(prompt, gp) for _ in range(gp.n))
            if gp.choices is not None:
                bad = [t for t in texts if t not in gp.choices]
                if bad:  # a real engine could never return these: the responder is wrong
                    raise ValueError(f"responder returned {bad[0]!r}, not one of the choices {gp.choices}")
            words = sum(len(t.split()) for t in texts)
            finish = "length" if any(len(t.split()) >= gp.max_tokens for t in texts) else "stop"
            out.append(Completion(texts=texts, finish_reason=finish, prompt_tokens=len(prompt.split()), output_tokens=words))
        return out


class ScriptedStepEngine(ScriptedEngine):
    """A scripted engine with a step loop (local_llm/engine.py StepEngine), as vLLM's: a request comes
    back after as many `step()` calls as its completion has words (at least one), so requests submitted
    together finish at different steps and out of order. `in_flight` logs, at each step, the
    (request id, prompt) pairs running; `returned` every prompt whose completion came back."""

    def __init__(self, model_id: str, responder: Responder, *, capacity: int | None = None):
        super().__init__(model_id, responder)
        self._running: list[list] = []  # [request, completion, steps left]
        self.steps = 0
        self.in_flight: list[list[tuple[str, str]]] = []
        self.returned: list[str] = []
        if capacity is not None:
            self.capacity = lambda: capacity

    def submit(self, requests: Sequence[Request]) -> None:
        comps = self.generate([r.prompt for r in requests], [r.params for r in requests])
        self._running += [[r, c, max(1, c.output_tokens)] for r, c in zip(requests, comps)]

    def step(self) -> list[tuple[str, Completion]]:
        self.steps += 1
        self.in_flight.append([(r.rid, r.prompt) for r, _, _ in self._running])
        for item in self._running:
            item[2] -= 1
        done = [(r, c) for r, c, left in self._running if left <= 0]
        self._running = [item for item in self._running if item[2] > 0]
        self.returned += [r.prompt for r, _ in done]
        return [(r.rid, c) for r, c in done]

    def pending(self) -> int:
        return len(self._running)

    def cancel(self) -> None:
        self._running = []
