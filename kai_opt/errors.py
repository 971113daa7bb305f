"""Errors a user can cause, rendered as one line naming the file, the object and the field.

Everything the CLI catches as `KaiOptError` is printed with `str(err)` and exits with code 2.
"""

from __future__ import annotations


class KaiOptError(Exception):
    """Base of every error caused by user input (files, objects, config, arguments)."""

    exit_code = 2


class InputError(KaiOptError):
    """A bad value in an input: names where (file, line), what (object), and which field."""

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        line: int | None = None,
        obj: str | None = None,
        field: str | None = None,
    ) -> None:
        self.message = message
        self.source = source
        self.line = line
        self.obj = obj
        self.field = field
        super().__init__(self.render())

    def render(self) -> str:
        parts: list[str] = []
        if self.source:
            parts.append(f"{self.source}:{self.line}" if self.line else self.source)
        if self.obj:
            parts.append(self.obj)
        if self.field:
            parts.append(f"field {self.field}")
        head = ": ".join(parts)
        text = " ".join(self.message.split())  # always a single line
        return f"{head}: {text}" if head else text

    def at(self, *, source: str | None = None, line: int | None = None, obj: str | None = None,
           field_prefix: str | None = None) -> InputError:
        """A copy with missing location parts filled in (inner code knows the field, outer code the file)."""
        field = self.field
        if field_prefix:
            field = f"{field_prefix}.{field}" if field else field_prefix
        return type(self)(
            self.message,
            source=self.source or source,
            line=self.line or line,
            obj=self.obj or obj,
            field=field,
        )

    def __str__(self) -> str:
        return self.render()


class ConfigError(InputError):
    """Invalid kai-opt configuration file."""


class MissingExtraError(KaiOptError):
    """An optional feature whose packages are not installed (an extra of the kai-opt package)."""

    def __init__(self, feature: str, module: str, extra: str) -> None:
        super().__init__(f"{feature} needs {module}, which is not installed: pip install 'kai-opt[{extra}]'")


class NotFoundError(KaiOptError):
    """A named pod, podgroup or queue does not exist in the snapshot."""
