"""The step's third phase (schedule -> run -> postprocess), EngineCore's collaborator: account each
chunk's tokens, verify drafts (sampling/speculative.py), mask constrained rows
(constrain/step_masks.py), sample every row at once (engine/sample_step.py), advance constraints,
fast-forward forced ids (constrain/fast_forward.py) and emit; a request whose part raises fails
alone (the core's `fail`); a request that ends goes to the core's `finish`."""

from __future__ import annotations

from collections.abc import Callable

import torch

from agentrt.config import EngineConfig
from agentrt.constrain.fast_forward import fast_forward
from agentrt.constrain.step_masks import mask_row
from agentrt.engine.clock import Clock
from agentrt.engine.device_tail import NaNLogits, StepFetch, choose
from agentrt.engine.executor import Executor
from agentrt.engine.sample_step import finish_reason, sample_rows
from agentrt.engine.stats import Counters
from agentrt.kv.kv_manager import KVManager
from agentrt.model.batch import SeqChunk
from agentrt.records.request import Request, State, TokenEvent
from agentrt.sampling.penalties import penalize
from agentrt.sampling.speculative import accept_greedy, verify


def verify_draft(r: Request, logits: torch.Tensor, argmax) -> list[int]:
    """Tokens r accepts this step from logits [1 + len(draft), V] (1 .. len(draft) + 1), counted
    for r's acceptance rate (which caps its next drafts)."""
    return counted(r, verify(logits, r.draft, r.params, constraint=r.constraint, generator=r.generator, argmax=argmax))


def counted(r: Request, accepted: list[int]) -> list[int]:
    """`accepted` (from r's draft), counted for r's acceptance rate; returned."""
    r.spec_proposed += len(r.draft)
    r.spec_accepted += len(accepted) - 1
    return accepted


class Postprocess:
    """EngineCore's post-processing, told what it uses: the config (fast-forward's caps), the
    model's context, the counters, clock, executor (argmax, device tail) and KV manager (a
    rejected draft's rollback), and the core's two exits: `fail(r, exc)` and `finish(r, reason,
    last)`."""

    def __init__(self, cfg: EngineConfig, context: int, counters: Counters, clock: Clock, executor: Executor,
                 kvm: KVManager, fail: Callable[[Request, BaseException], None],
                 finish: Callable[..., None]):
        self.cfg, self.context, self.counters, self.clock = cfg, context, counters, clock
        self.executor, self.kvm, self.fail, self.finish = executor, kvm, fail, finish

    def __call__(self, plan: list[tuple[Request, int]], chunks: list[SeqChunk], rows) -> None:
        """Account, verify drafts, mask, sample and emit; one request's failure fails it only."""
        if self.executor.device_tail:
            return self._on_device(plan, chunks, rows)
        plain, plain_rows = self._split(plan, chunks, rows, lambda r, ch, lg: self._accept(
            r, ch, verify_draft(r, lg, self.executor.argmax)))
        if plain:
            self._sample_and_emit(plain, torch.cat(plain_rows))

    def _on_device(self, plan: list[tuple[Request, int]], chunks: list[SeqChunk], rows) -> None:
        """The same decisions with the rows on the model's device (engine/device_tail.py): a
        greedy draft's argmax and every plain row's token chosen there, fetched with the rows of
        host-verified drafts (sampled or constrained) in one wait; then accepted and emitted in
        the host path's order (drafts, then plain rows)."""
        fetch, drafts = StepFetch(), []

        def draft(r: Request, ch: SeqChunk, lg) -> None:
            on_device = r.constraint is None and r.params.greedy
            drafts.append((r, ch, on_device, fetch.add(self.executor.argmax(lg) if on_device else lg)))
        plain, plain_rows = self._split(plan, chunks, rows, draft)
        picks = fetch.add(choose(torch.cat(plain_rows), plain, self.executor.argmax)) if plain else None
        fetch.run()
        self.counters.host_syncs += fetch.syncs
        for r, ch, on_device, h in drafts:
            try:
                self._accept(r, ch, counted(r, accept_greedy(fetch[h].tolist(), r.draft)) if on_device else
                             verify_draft(r, fetch[h], lambda x: torch.argmax(x, dim=-1)))
            except Exception as e:
                self.fail(r, e)
        if picks is not None:
            self._emit_sampled(plain, [None if t < 0 else t for t in fetch[picks].tolist()], NaNLogits)

    def _split(self, plan, chunks: list[SeqChunk], rows, draft) -> tuple[list[Request], list]:
        """Account every chunk; a drafting request goes to `draft(r, chunk, rows)`; the others'
        rows that want a token come back shaped (`_shape_row`), with their requests."""
        plain, plain_rows = [], []
        for (r, _), ch, lg in zip(plan, chunks, rows):
            try:
                self._account(r, ch)
                if r.draft:
                    draft(r, ch, lg)
                    continue
                r.forced = 0
                r.seq.tokens.extend(ch.tokens)
                if ch.want_logits:  # (shaped first: a raising grammar fails r, never pairs rows wrongly)
                    plain_rows.append(self._shape_row(r, lg))
                    plain.append(r)
            except Exception as e:
                self.fail(r, e)
        return plain, plain_rows

    def _shape_row(self, r: Request, lg):
        """r's row [1, V] before its token is chosen: its penalties, then its constraint's mask
        (a raising grammar fails r only), in place where they apply."""
        if r.params.penalized:
            lg = penalize(lg, r.params, r.output, r.prompt)
        return mask_row(r, lg, self.counters) if r.constraint is not None else lg

    def _accept(self, r: Request, ch: SeqChunk, accepted: list[int]) -> None:
        """Keep the KV of the tokens fed before the draft and of the accepted draft; roll back
        the rest."""
        r.seq.tokens.extend(ch.tokens[:len(ch.tokens) - len(r.draft) - 1 + len(accepted)])
        self.kvm.truncate(r.seq, r.seq.num_cached)
        self.counters.spec_proposed += len(r.draft)
        self.counters.spec_accepted += len(accepted) - 1
        r.draft, r.forced = [], 0
        self.emit_tokens(r, self._jump(r, accepted))

    def _account(self, r: Request, ch: SeqChunk) -> None:
        in_prompt = max(0, min(len(r.prompt), ch.start + len(ch.tokens)) - ch.start)
        r.computed_prompt += in_prompt
        self.counters.prompt_computed += in_prompt
        self.counters.decode_tokens += len(ch.tokens) - in_prompt

    def _sample_and_emit(self, reqs: list[Request], logits) -> None:
        """Sample every row (engine/sample_step.py), then advance constraints and emit. A
        request's first sampled token ends its prefill (Usage.prefill_s)."""
        self._emit_sampled(reqs, sample_rows(reqs, logits, self.executor.argmax, self.fail))

    def _emit_sampled(self, reqs: list[Request], toks: list[int | None], missing=None) -> None:
        """Advance constraints and emit one chosen token per request (None: none was chosen; the
        request failed already, or fails now with `missing()` when given)."""
        now = self.clock.now()
        for r, t in zip(reqs, toks):
            if t is None and missing is not None and r.state is not State.FINISHED:
                self.fail(r, missing())
            if t is None or r.state is State.FINISHED:
                continue
            r.first_token_s = r.first_token_s or now
            try:
                if r.constraint is not None:
                    r.constraint.advance(t)
                self.emit_tokens(r, self._jump(r, [t]))
            except Exception as e:
                self.fail(r, e)

    def _jump(self, r: Request, toks: list[int]) -> list[int]:
        return fast_forward(r, toks, self.cfg, self.context, self.counters)

    def emit_tokens(self, r: Request, toks: list[int]) -> None:
        """Append sampled (or forced) tokens, stopping at the first that finishes the request."""
        for i, t in enumerate(toks):
            r.output.append(t)
            if r.ngrams is not None:
                r.ngrams.extend([t])
            reason = finish_reason(r, t, i == len(toks) - 1, self.context)
            if reason is not None:
                return self.finish(r, reason, last=tuple(toks[:i + 1]))
        r.emit(TokenEvent(r.rid, tuple(toks)))
