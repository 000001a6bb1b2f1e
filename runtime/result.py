"""The value every tape op returns: a success holding (tape, id) or gradients, or an error message.

Ops never raise for bad input; `unwrap()` turns an error into a `TapeError` for callers who want one.
"""

from __future__ import annotations

from typing import Any


class TapeError(Exception):
    """Raised by `Result.unwrap()` on an error; the message is the Result's `error`."""


class Result:
    __slots__ = ("_value", "error")

    def __init__(self, value: Any = None, error: str | None = None) -> None:
        self._value = value
        self.error = error

    @classmethod
    def ok(cls, value: Any) -> Result:
        return cls(value, None)

    @classmethod
    def err(cls, message: str) -> Result:
        return cls(None, message)

    def is_ok(self) -> bool:
        return self.error is None

    def unwrap(self) -> Any:
        if self.error is not None:
            raise TapeError(self.error)
        return self._value

    def __repr__(self) -> str:
        return f"Result.err({self.error!r})" if self.error is not None else f"Result.ok({self._value!r})"
