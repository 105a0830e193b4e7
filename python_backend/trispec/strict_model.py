"""The base of every config object: unknown keys are an error (a typo never passes silently) and a
loaded config cannot change under the code that reads it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
