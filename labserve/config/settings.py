"""How a config's settings are declared and checked: one mechanism for every config.

A config is a frozen dataclass that derives from :class:`Settings` and declares each setting
as ``name: type = setting(default, rule)``, followed by its attribute docstring (units in the
name). Its :class:`Rule` says what it accepts, what the error says it expected, and how the
value is normalised; the helpers below build the common ones. From those declarations the
base gives every config the same checks and the same messages ("max_batch_size must be an
integer >= 1, got 0", a :class:`~labserve.base.errors.ConfigError`): on construction, in
:meth:`Settings.replace` (which refuses an unknown key, naming the known ones), and in
:meth:`Settings.check` for a value that enters from elsewhere (a file, a layer).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from labserve.base.errors import ConfigError

__all__ = [
    "BOOLEAN",
    "Rule",
    "Settings",
    "integer_at_least",
    "is_finite_number",
    "is_integer",
    "number_at_least",
    "one_of",
    "setting",
]

_T = TypeVar("_T")
_S = TypeVar("_S", bound="Settings")


def _unchanged(value: Any) -> Any:
    return value


@dataclasses.dataclass(frozen=True)
class Rule:
    """How one setting is checked: what it accepts and the normalised value it keeps."""

    expected: str
    """What a good value is, for the error: "must be {expected}, got {value!r}"."""
    accepts: Callable[[Any], bool]
    normalise: Callable[[Any], Any] = _unchanged

    def check(self, key: str, value: Any, source: str | None = None) -> Any:
        """Return ``value`` normalised, or raise ConfigError naming ``key`` and the rule."""
        if not self.accepts(value):
            raise ConfigError(key, value, self.expected, source=source)
        return self.normalise(value)


def is_integer(value: Any) -> bool:
    """An int that is not a bool (YAML's and JSON's ``true`` is not a count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_finite_number(value: Any) -> bool:
    """An int or float, not a bool, neither NaN nor infinite."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return number and math.isfinite(value)


def integer_at_least(low: int) -> Rule:
    """An integer >= ``low``, kept as it is."""
    return Rule(f"an integer >= {low}", lambda v: is_integer(v) and v >= low)


def number_at_least(low: float, *, of: str = "") -> Rule:
    """A finite number >= ``low``, kept as a float; ``of`` names its unit in the message."""
    unit = f" of {of}" if of else ""
    return Rule(
        f"a finite number{unit} >= {low:g}", lambda v: is_finite_number(v) and v >= low, float
    )


def one_of(choices: tuple[str, ...]) -> Rule:
    """One of ``choices``, kept as a str."""
    return Rule("one of " + ", ".join(map(repr, choices)), lambda v: v in choices, str)


BOOLEAN = Rule("true or false", lambda v: isinstance(v, bool))
"""True or false (not 0 or 1)."""


def setting(default: _T, rule: Rule) -> _T:
    """Declare a config field with its default and the rule every source meets."""
    return dataclasses.field(default=default, metadata={"rule": rule})


_RULES: dict[type, dict[str, Rule]] = {}
"""Each config class's rules, read from its fields once. Filled on first use: two threads
that race there store equal dicts."""


def _rules(cls: type[Settings]) -> dict[str, Rule]:
    """``cls``'s rules, in the order of its fields (read from their metadata)."""
    rules = _RULES.get(cls)
    if rules is None:
        rules = _RULES[cls] = {f.name: f.metadata["rule"] for f in dataclasses.fields(cls)}
    return rules


@dataclasses.dataclass(frozen=True)
class Settings:
    """The base of a frozen config whose fields are declared with :func:`setting`.

    Every field is checked when the config is built; a change makes a new, checked config.
    Immutable, so thread-safe.
    """

    def __post_init__(self) -> None:
        for name, rule in _rules(type(self)).items():
            object.__setattr__(self, name, rule.check(name, getattr(self, name)))

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The settings' names, in declaration order."""
        return tuple(_rules(cls))

    @classmethod
    def check(cls, key: str, value: Any, *, source: str | None = None, path: str = "") -> Any:
        """Check one value for setting ``key``; return it normalised.

        Raises ConfigError naming ``source`` (a file), ``path`` + ``key`` and the rule; for
        a key that is no setting, the rule lists the settings there are.
        """
        rule = _rules(cls).get(key)
        if rule is None:
            allowed = ", ".join(_rules(cls))
            raise ConfigError(
                f"{path}{key}", value, f"a known setting (one of: {allowed})", source=source
            )
        return rule.check(f"{path}{key}", value, source)

    def replace(self: _S, **changes: Any) -> _S:
        """Return a checked copy with ``changes``; raises ConfigError and changes nothing."""
        return self.with_changes(changes)

    def with_changes(
        self: _S, changes: Mapping[str, Any], *, source: str | None = None, path: str = ""
    ) -> _S:
        """Like :meth:`replace`, its errors naming ``source`` and ``path`` (a file's section)."""
        checked = {
            key: self.check(key, value, source=source, path=path) for key, value in changes.items()
        }
        new = object.__new__(type(self))
        for name in _rules(type(self)):  # each value was checked when it entered: not again
            object.__setattr__(new, name, checked[name] if name in checked else getattr(self, name))
        return new

    def as_dict(self) -> dict[str, Any]:
        """The settings as a plain dict (for JSON, YAML and snapshots)."""
        return {name: getattr(self, name) for name in _rules(type(self))}
