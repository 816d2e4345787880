"""Model catalog: a model name (as used in matrices and test lists) -> where its checkpoint comes from."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from edgellm import ASSETS_DIR
from edgellm.errors import ConfigurationError
from edgellm.thresholds import FIELDS, Thresholds
from edgellm.types import Precision
from edgellm.yamlio import read_yaml
from toolchains.base import ModelShape

CATALOG_FILE = Path(__file__).resolve().parent / "models.yml"
OVERRIDABLE = tuple(f for f in FIELDS if f != "tokenizer_match")  # the numeric limits `edgellm eval` takes as flags
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class _Synthetic(BaseModel):
    model_config = ConfigDict(extra="allow")
    family: str
    seed: int = 0
    dtype: str = "fp32"


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    bundled: str | None = None
    synthetic: _Synthetic | None = None
    path: str | None = None
    chat_template: str | None = None  # a Jinja file (relative to the catalog) for checkpoints that ship none
    # accuracy thresholds over the library's defaults, per precision: {int4_awq: {top1_min_agreement: 0.0}}
    thresholds: dict[str, dict[str, float]] | None = None
    # rows of the shipped calibration text a quantizer runs (None: the quantizer's own default)
    calibration_samples: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _exactly_one(self) -> _Entry:
        given = [k for k in ("bundled", "synthetic", "path") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of bundled, synthetic, path (got {', '.join(given) or 'none'})")
        return self


@dataclass(frozen=True)
class ModelSource:
    name: str
    kind: str  # bundled | synthetic | path
    spec: dict[str, Any] = field(default_factory=dict)
    chat_template: Path | None = None  # what export supplies when the checkpoint has no chat template
    thresholds: dict[Precision, dict[str, float]] = field(default_factory=dict)  # accuracy limits over the defaults
    calibration_samples: int | None = None  # rows of calibration text its quantization runs (None: the quantizer's)

    def describe(self) -> str:
        if self.kind == "bundled":
            return f"bundled {self.spec['bundled']}"
        if self.kind == "synthetic":
            return f"synthetic {self.spec['family']} (seed {self.spec.get('seed', 0)})"
        return f"path {self.spec['path']}"

    def check(self) -> None:
        """Raise ConfigurationError when the checkpoint cannot be had, without materializing anything."""
        if self.kind == "path":
            self._path()
        elif self.kind == "bundled" and not (ASSETS_DIR / self.spec["bundled"] / "config.json").is_file():
            raise ConfigurationError(f"model {self.name!r}: bundled checkpoint {self.spec['bundled']!r} is missing")

    def _path(self) -> Path:
        raw = self.spec["path"]
        missing = [v for v in _ENV_REF.findall(raw) if not os.environ.get(v)]
        if missing:
            raise ConfigurationError(
                f"model {self.name!r}: checkpoint path {raw!r} needs environment variable(s) {', '.join(missing)}"
            )
        path = Path(_ENV_REF.sub(lambda m: os.environ[m.group(1)], raw)).expanduser()
        if not (path / "config.json").is_file():
            raise ConfigurationError(f"model {self.name!r}: no checkpoint at {path} (config.json not found)")
        return path

    def shape(self) -> ModelShape | None:
        """What a toolchain's kernels ask of the model (``ToolchainDriver.model_problem``), read without its weights:
        a synthetic model's family ``tiny_config`` with the entry's overrides (what ``edgellm.synth`` writes), a
        bundled or path checkpoint's ``config.json`` (a multimodal one's ``text_config``). None when that cannot be
        read here (a path checkpoint absent on this host, a config without the keys): the plan then decides the
        model's rows without its limits."""
        if self.kind == "synthetic":
            from edgellm.models.base import family_named

            try:
                config = {**family_named(self.spec["family"]).tiny_config, **self.spec}
            except ConfigurationError:
                return None
            return _shape(config)
        try:
            directory = ASSETS_DIR / self.spec["bundled"] if self.kind == "bundled" else self._path()
            config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
        except (ConfigurationError, OSError, ValueError):
            return None
        return _shape(config)

    def locate(self, data_dir: Path) -> Path:
        """The checkpoint directory, materializing synthetic checkpoints once under ``data_dir``.

        Raises ConfigurationError when a path checkpoint is absent (naming the path and the env var it uses).
        """
        if self.kind == "bundled":
            path = ASSETS_DIR / self.spec["bundled"]
            if not (path / "config.json").is_file():
                raise ConfigurationError(f"model {self.name!r}: bundled checkpoint {path} is missing")
            return path
        if self.kind == "synthetic":
            return _materialize_synthetic(self, data_dir)
        return self._path()


def _shape(config: Any) -> ModelShape | None:
    """A Hugging Face config's attention shape (head_dim defaults to hidden_size // num_attention_heads and
    num_key_value_heads to num_attention_heads, as transformers does); None when it lacks the keys."""
    if isinstance(config, dict) and "num_attention_heads" not in config and isinstance(config.get("text_config"), dict):
        config = config["text_config"]
    if not isinstance(config, dict):
        return None
    try:
        hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        kv = config.get("num_key_value_heads")
        head_dim = config.get("head_dim")
        return ModelShape(hidden_size=hidden, num_attention_heads=heads,
                          num_key_value_heads=heads if kv is None else int(kv),
                          head_dim=hidden // heads if head_dim is None else int(head_dim),
                          num_hidden_layers=int(config["num_hidden_layers"]), vocab_size=int(config["vocab_size"]))
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


def _materialize_synthetic(src: ModelSource, data_dir: Path) -> Path:
    from edgellm.synth import make_checkpoint

    spec = dict(src.spec)
    family, seed, dtype = spec.pop("family"), spec.pop("seed", 0), spec.pop("dtype", "fp32")
    dest = Path(data_dir) / "checkpoints" / src.name.replace("/", "--")
    if (dest / "config.json").is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}."))
    try:
        make_checkpoint(tmp, family, dtype=dtype, seed=seed, **spec)
        os.replace(tmp, dest)
    except FileExistsError:  # another process won the race; its checkpoint is identical
        shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def _thresholds(raw: dict[str, dict[str, float]], where: str,
                problems: list[str]) -> dict[Precision, dict[str, float]]:
    """Per precision, limits the library's eval takes as overrides (each problem appended to ``problems``)."""
    out: dict[Precision, dict[str, float]] = {}
    for key, limits in raw.items():
        try:
            precision = Precision.parse(key, what="precision")
        except ConfigurationError as exc:
            problems.append(f"{where}: {exc}")
            continue
        unknown = sorted(set(limits) - set(OVERRIDABLE))
        if unknown:
            problems.append(f"{where}.{key}: unknown threshold(s) {', '.join(unknown)}; valid: "
                            f"{', '.join(OVERRIDABLE)}")
            continue
        try:
            Thresholds(**limits)  # the library's own checks of each value (finite, >= 0, fractions <= 1)
        except ConfigurationError as exc:
            problems.append(f"{where}.{key}: {exc}")
            continue
        out[precision] = dict(limits)
    return out


class Catalog:
    def __init__(self, sources: dict[str, ModelSource], path: Path) -> None:
        self.sources = sources
        self.path = path

    @classmethod
    def load(cls, path: Path = CATALOG_FILE) -> Catalog:
        data = read_yaml(Path(path)) or {}
        models = data.get("models") if isinstance(data, dict) else None
        if not isinstance(models, dict):
            raise ConfigurationError(f"{path}: expected a mapping 'models: {{NAME: SOURCE}}'")
        problems, sources = [], {}
        for name, raw in models.items():
            try:
                entry = _Entry.model_validate(raw)
            except ValidationError as exc:
                for err in exc.errors():
                    loc = ".".join(str(x) for x in err["loc"])
                    problems.append(f"{path}: model {name!r}{(' ' + loc) if loc else ''}: {err['msg']}")
                continue
            template = None
            if entry.chat_template is not None:
                template = (Path(path).parent / entry.chat_template).resolve()
                if not template.is_file():
                    problems.append(f"{path}: model {name!r} chat_template: no file {template}")
            limits = _thresholds(entry.thresholds or {}, f"{path}: model {name!r} thresholds", problems)
            if entry.bundled is not None:
                kind, spec = "bundled", {"bundled": entry.bundled}
            elif entry.synthetic is not None:
                kind, spec = "synthetic", entry.synthetic.model_dump()
            else:
                kind, spec = "path", {"path": entry.path}
            sources[name] = ModelSource(name, kind, spec, template, limits, entry.calibration_samples)
        if problems:
            raise ConfigurationError("\n".join(problems))
        return cls(sources, Path(path))

    def get(self, name: str) -> ModelSource:
        if name not in self.sources:
            raise ConfigurationError(
                f"unknown model {name!r} (not in {self.path}); known: {', '.join(sorted(self.sources))}"
            )
        return self.sources[name]

    def __contains__(self, name: object) -> bool:
        return name in self.sources
