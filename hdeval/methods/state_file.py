"""What the built-in methods' states share, as pydantic: the strict base model (unknown fields
refused, no coercion: ``"2"`` is not a number) and the fields more than one method records."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

# bounds on what a state read from an artifact may hold (it is data from whoever sent it)
MAX_ITEMS = 100_000  # criteria, features, split ids ...
MAX_NAME = 1_000  # a prompt's, criterion's or judge's name

Name = Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME)]
Digest = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]  # a sha256, hex
Seed = Annotated[int, Field(ge=0, lt=2**32)]  # what numpy and scikit-learn take
Names = Annotated[list[Name], Field(max_length=MAX_ITEMS)]
Number = int | float  # strict: an int stays an int, so a re-saved state reads as written


class StrictState(BaseModel):
    """Base of a method's state: unknown fields refused, values taken as they are."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class PromptsState(StrictState):
    """The state of a method that records only its prompts: name -> the template's sha256."""

    prompts: Annotated[dict[Name, Digest], Field(max_length=100)]


class AggregatorSpec(StrictState):
    """A learned aggregator as PairEval records it: its kind and seed (the models are a file)."""

    kind: Name
    random_state: Seed
