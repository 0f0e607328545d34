"""The YAML config file, in BentoML's shape, and the precedence of the config layers.

```yaml
runners:
  batching:              # global: every runner
    enabled: true
    max_batch_size: 64
    max_latency_ms: 20
  scorer:                # one runner, by name
    batching:
      strategy: fixed
      max_latency_ms: 5
  tinylm:                # a runner's generative methods: vLLM's knob names
    generation:
      max_num_seqs: 64
      max_num_batched_tokens: 1024
```

A ``generation`` section is kept as written here and validated by the runner that uses it,
over each generative method's declared settings; its errors name the file and the key too.

Precedence, highest first: live ``configure()`` > ``Runner(...)`` arguments > the runner's
section of the file > the method's decorator > the file's global section > defaults.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from labserve.base.errors import ConfigError
from labserve.config.batching import BatchingLayer

__all__ = ["ENV_VAR", "ConfigFile", "load_config_file"]

ENV_VAR = "LABSERVE_CONFIG"
_EMPTY = BatchingLayer()


@dataclass(frozen=True)
class ConfigFile:
    """A parsed, validated config file: the global batching section and one per runner."""

    source: str | None = None
    global_batching: BatchingLayer = field(default_factory=BatchingLayer)
    runners: Mapping[str, BatchingLayer] = field(default_factory=dict)
    generation: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Each runner's ``generation`` section (its generative methods' settings), as written."""

    def for_runner(self, name: str) -> BatchingLayer:
        """The runner's own batching section (an empty layer when the file has none)."""
        return self.runners.get(name, _EMPTY)

    def generation_for(self, name: str) -> Mapping[str, Any]:
        """The runner's ``generation`` section (empty when the file has none)."""
        return self.generation.get(name, {})

    def check_runners(self, names: Iterable[str]) -> None:
        """Refuse a runner section that names none of ``names`` (the runners there are).

        A typo in a runner's name would otherwise leave its settings unused, silently.
        Raises ConfigError naming the file, the section and ``names``.
        """
        there = list(names)
        for name in self.runners:
            if name not in there:
                listed = ", ".join(repr(n) for n in there) or "none"
                rule = f"a section for a runner there is (the runners there are: {listed})"
                raise ConfigError(f"runners.{name}", name, rule, source=self.source)


def _mapping(value: Any, key: str, source: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(key, value, "a mapping (key: value lines)", source=source)
    return value


def _batching_section(value: Any, path: str, source: str) -> BatchingLayer:
    section = _mapping(value, path, source)
    settings = {str(k): v for k, v in section.items()}
    return BatchingLayer.from_mapping(settings, path=f"{path}.", source=source)


def parse_config(data: Any, source: str) -> ConfigFile:
    """Validate an already-loaded YAML document; every error names ``source`` and the key."""
    top = _mapping(data, "<top level>", source)
    for key in top:
        if key != "runners":
            raise ConfigError(str(key), top[key], "a known section (only 'runners')", source=source)
    runners_section = _mapping(top.get("runners"), "runners", source)
    global_batching = _EMPTY
    runners: dict[str, BatchingLayer] = {}
    generation: dict[str, Mapping[str, Any]] = {}
    for name, value in runners_section.items():
        if name == "batching":
            global_batching = _batching_section(value, "runners.batching", source)
            continue
        runner = _mapping(value, f"runners.{name}", source)
        for key in runner:
            if key not in ("batching", "generation"):
                raise ConfigError(
                    f"runners.{name}.{key}",
                    runner[key],
                    "a known key ('batching' or 'generation')",
                    source=source,
                )
        runners[str(name)] = _batching_section(
            runner.get("batching"), f"runners.{name}.batching", source
        )
        section = _mapping(runner.get("generation"), f"runners.{name}.generation", source)
        if section:
            generation[str(name)] = {str(k): v for k, v in section.items()}
    return ConfigFile(
        source=source, global_batching=global_batching, runners=runners, generation=generation
    )


def load_config_file(path: str | os.PathLike[str] | None = None) -> ConfigFile:
    """Load ``path``, or the file named by ``$LABSERVE_CONFIG``, or nothing (an empty config).

    Raises ConfigError for a missing file, bad YAML, an unknown key or a bad value.
    """
    if path is None:
        path = os.environ.get(ENV_VAR) or None
        if path is None:
            return ConfigFile()
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError("path", source, f"a readable file ({exc.strerror})") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError("<document>", "...", f"valid YAML ({exc})", source=source) from exc
    return parse_config(data, source)
