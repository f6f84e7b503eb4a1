"""Simulated juries: judges of known quality on the simulated pointwise data of
``tests/simjudge.py`` (the latent hidden in each sample's text). Each judge is a fake LLM with its
own identity (so its own cache keys) that reads the latent plus noise of its own size, or, as
pure noise, nothing; every judge counts its calls."""

from __future__ import annotations

from simjudge import _prompt, declared, latents, sample_key, unit_normal

from hdeval.llm.backends.base import Completion, CompletionRequest
from hdeval.llm.backends.fake import RESPONDERS, FakeBackend


class SimJudge(FakeBackend):
    """A judge named ``name`` whose layer-1 score reads the latent plus ``noise``; ``noise=None``:
    pure noise. Deeper criteria read the latent with twice the noise. ``broken``: no reply holds
    a score."""

    def __init__(self, name: str, noise: float | None, broken: bool = False, **kw):
        import hdeval.methods.hdeval  # noqa: F401  (registers the fake's decompose responder)

        self.name, self.noise, self.broken = name, noise, broken
        # broken: a server that does not honour answer constraints, as one asked only by the prompt
        super().__init__(logprobs=False, responders={**RESPONDERS, "score": self._reply},
                         honour_constraints=not broken, **kw)

    @property
    def identity(self) -> str:
        return f"simjury:{self.name}"

    def _reply(self, request: CompletionRequest, fake) -> Completion:
        prompt = _prompt(request)
        if self.broken:  # a judge that answers, but nothing a score can be read from
            return Completion("I cannot help with that.", None, len(prompt) // 4, 6)
        crit, sample = declared(request, "criterion_name"), sample_key(request)
        q = latents(sample)
        if self.noise is None or not q:
            v = 3 + 1.2 * unit_normal(self.name, "pure-noise", crit, sample)
        else:
            noise = self.noise * (1 if crit.count(":") == 0 else 2)
            v = q[0] + noise * unit_normal(self.name, crit, sample)
        return Completion(str(int(min(5, max(1, round(v))))), None, len(prompt) // 4, 1)


def jury(*noises: float | None) -> dict[str, SimJudge]:
    """Judges j1, j2, ... with these noise sizes (None: pure noise)."""
    return {f"j{i + 1}": SimJudge(f"j{i + 1}", n) for i, n in enumerate(noises)}


def calls_of(judges: dict[str, SimJudge]) -> dict[str, int]:
    return {n: j.calls for n, j in judges.items()}


