"""The base of every spec section: frozen, unknown keys refused, finite numbers. Its own module
so that target modules (pipeline/targets/) can declare their ``[build.<target>]`` section
without importing the spec."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_serializer


class Frozen(BaseModel):
    # Every number the build computes with is finite (a NaN 'low' passed the 'high > low' check).
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
    # Keys added after specs were first hashed (content hash, cache keys, the manifest): left out
    # of dumps while at their default, so a spec that does not use them hashes as before.
    _LATE_KEYS: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _omit_unused_late_keys(self, handler: Any) -> Any:
        data = handler(self)
        for key in self._LATE_KEYS:
            if isinstance(data, dict) and key in data and getattr(self, key) == type(self).model_fields[key].default:
                del data[key]
        return data
