"""Model catalog: a model name (as used in matrices and test lists) -> where its checkpoint comes from."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from edgefarm.vocabulary.model import ModelShape
from edgellm import ASSETS_DIR
from edgellm.config import QuantConfig
from edgellm.errors import ConfigurationError, EdgeLLMError
from edgellm.thresholds import FIELDS, Thresholds
from edgellm.types import Precision, QuantMethod
from edgellm.yamlio import read_yaml

if TYPE_CHECKING:
    from edgefarm.registries import Registries

CATALOG_FILE = Path(__file__).resolve().parent / "models.yml"
OVERRIDABLE = tuple(f for f in FIELDS if f != "tokenizer_match")  # the numeric limits `edgellm eval` takes as flags
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class _Synthetic(BaseModel):
    model_config = ConfigDict(extra="allow")
    family: str
    seed: int = 0
    dtype: str = "fp32"


class _SynthQuant(BaseModel):
    """A checkpoint ``edgellm.synth_quant`` writes from the entry's ``base`` (round-to-nearest, ModelOpt's layout)."""

    model_config = ConfigDict(extra="forbid")
    method: str
    group_size: int = Field(default=128, ge=1)


class _SynthVariant(BaseModel):
    """A tiny checkpoint of a variant ``edgellm.synth_variants`` writes (random weights, the layouts NVIDIA's
    exporter reads): an EAGLE3 draft or a LoRA adapter or a reduced vocabulary for the entry's ``base``, or a
    vision-language checkpoint (no base)."""

    model_config = ConfigDict(extra="forbid")
    writes: str  # one of VARIANT_WRITERS
    seed: int = 0
    rank: int | None = Field(default=None, ge=1, le=256)  # lora_adapter
    size: int | None = Field(default=None, ge=8)  # reduced_vocab

    @model_validator(mode="after")
    def _fields(self) -> _SynthVariant:
        if self.writes not in VARIANT_WRITERS:
            raise ValueError(f"writes {self.writes!r} is not one of {', '.join(VARIANT_WRITERS)}")
        if (self.rank is not None) != (self.writes == "lora_adapter"):
            raise ValueError("rank is given for writes: lora_adapter, and only for it")
        if (self.size is not None) != (self.writes == "reduced_vocab"):
            raise ValueError("size is given for writes: reduced_vocab, and only for it")
        return self


# what a synth_variant entry writes -> whether it needs a base (the model it is made for)
VARIANT_WRITERS = {"eagle3_draft": True, "lora_adapter": True, "reduced_vocab": True, "qwen2_5_vl": False}


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    bundled: str | None = None
    synthetic: _Synthetic | None = None
    path: str | None = None
    synth_quant: _SynthQuant | None = None
    synth_variant: _SynthVariant | None = None
    # the float catalog model a pre-quantized checkpoint was quantized from: its checkpoint gives the accuracy
    # reference (transformers reads no ModelOpt checkpoint) and its shape
    base: str | None = None
    chat_template: str | None = None  # a Jinja file (relative to the catalog) for checkpoints that ship none
    # accuracy thresholds over the library's defaults, per precision: {int4_awq: {top1_min_agreement: 0.0}}
    thresholds: dict[str, dict[str, float]] | None = None
    # rows of the shipped calibration text a quantizer runs (None: the quantizer's own default)
    calibration_samples: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _exactly_one(self) -> _Entry:
        given = [k for k in SOURCE_KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of {', '.join(SOURCE_KINDS)} (got {', '.join(given) or 'none'})")
        if self.synth_quant is not None and self.base is None:
            raise ValueError("synth_quant quantizes the entry's base: give base (a float catalog model)")
        if self.synth_variant is not None and VARIANT_WRITERS.get(self.synth_variant.writes) and self.base is None:
            raise ValueError(f"synth_variant writes {self.synth_variant.writes} for the entry's base: give base")
        return self


SOURCE_KINDS = ("bundled", "synthetic", "path", "synth_quant", "synth_variant")
# what a catalog entry is to a row: a checkpoint rows run, or a part a variant names (vocabulary.variant)
ROLES = ("checkpoint", "eagle3_draft", "lora_adapter", "reduced_vocab")


@dataclass(frozen=True)
class ModelSource:
    name: str
    kind: str  # bundled | synthetic | path
    spec: dict[str, Any] = field(default_factory=dict)
    chat_template: Path | None = None  # what export supplies when the checkpoint has no chat template
    thresholds: dict[Precision, dict[str, float]] = field(default_factory=dict)  # accuracy limits over the defaults
    calibration_samples: int | None = None  # rows of calibration text its quantization runs (None: the quantizer's)
    base: ModelSource | None = None  # the float model a pre-quantized checkpoint was quantized from (catalog ``base``)

    @property
    def role(self) -> str:
        """What the entry is to a row (:data:`ROLES`): a checkpoint, or an EAGLE3 draft / LoRA adapter / reduced
        vocabulary a variant names. Known from a synth_variant's entry, from a path's files when they are here."""
        if self.kind == "synth_variant":
            writes = self.spec["writes"]
            return "checkpoint" if writes == "qwen2_5_vl" else writes
        if self.kind != "path":
            return "checkpoint"
        try:
            directory = self._path_dir()
        except ConfigurationError:
            return "checkpoint"
        if (directory / "adapter_config.json").is_file():
            return "lora_adapter"
        if (directory / "vocab_map.safetensors").is_file():
            return "reduced_vocab"
        try:
            config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return "checkpoint"
        if any("Eagle3" in str(a) for a in config.get("architectures") or []) or "draft_vocab_size" in config:
            return "eagle3_draft"
        return "checkpoint"

    def lora_rank(self) -> int | None:
        """A LoRA adapter's rank (its entry's, else its adapter_config.json's r); None when unknown here."""
        return self._part_number("rank", "adapter_config.json", "r")

    def vocab_size(self) -> int | None:
        """A reduced vocabulary's size (its entry's, else its reduced_vocab.json's); None when unknown here."""
        return self._part_number("size", "reduced_vocab.json", "reduced_vocab_size")

    def _part_number(self, spec_key: str, file: str, key: str) -> int | None:
        """A variant part's number: a synth_variant entry's ``spec_key``, else ``key`` of its directory's ``file``."""
        if self.kind == "synth_variant":
            return self.spec.get(spec_key)
        try:
            return int(json.loads((self._path_dir() / file).read_text(encoding="utf-8"))[key])
        except (ConfigurationError, OSError, ValueError, KeyError, TypeError):
            return None

    def describe(self) -> str:
        if self.kind == "synth_variant":
            of = f" of {self.base.name}" if self.base is not None else ""
            return f"synth_variant {self.spec['writes']}{of} (seed {self.spec.get('seed', 0)})"
        if self.kind == "bundled":
            return f"bundled {self.spec['bundled']}"
        if self.kind == "synthetic":
            return f"synthetic {self.spec['family']} (seed {self.spec.get('seed', 0)})"
        if self.kind == "synth_quant":
            return f"synth_quant {self.spec['method']} of {self.base.name if self.base else '?'}"
        return f"path {self.spec['path']}"

    def check(self) -> None:
        """Raise ConfigurationError when the checkpoint cannot be had, without materializing anything."""
        if self.kind == "path":
            self._path()
        elif self.kind == "bundled" and not (ASSETS_DIR / self.spec["bundled"] / "config.json").is_file():
            raise ConfigurationError(f"model {self.name!r}: bundled checkpoint {self.spec['bundled']!r} is missing")
        if self.base is not None:
            self.base.check()

    def quantization(self) -> QuantConfig | None:
        """The quantization the checkpoint already carries, read from its ``hf_quant_config.json`` or its
        ``config.json``'s ``quantization_config`` (``edgellm.config.QuantConfig``: no weights read); a
        ``QuantConfig`` whose ``is_quantized`` is False for a float checkpoint; None when the checkpoint cannot be read
        here (a path checkpoint absent on this host). A synthetic model is float; a ``synth_quant`` one is what its
        entry declares, known without writing it. Raises ConfigurationError when the checkpoint declares a
        quantization edgellm does not know (naming it and the known ones)."""
        if self.kind in ("synthetic", "synth_variant"):
            return QuantConfig.none()
        if self.kind == "synth_quant":
            from edgellm.synth_quant import MODELOPT_WRITTEN

            base = self.base.name if self.base is not None else "?"
            modelopt = self.spec["method"] in MODELOPT_WRITTEN  # else Hugging Face's layout (GPTQ)
            where = "hf_quant_config.json" if modelopt else "config.json: quantization_config"
            return QuantConfig(method=QuantMethod(self.spec["method"]), group_size=self.spec.get("group_size"),
                               source=f"{where} (edgellm.synth_quant of {base})", modelopt=modelopt)
        try:
            directory = ASSETS_DIR / self.spec["bundled"] if self.kind == "bundled" else self._path()
        except ConfigurationError:
            return None
        if not (directory / "config.json").is_file():
            return None
        try:
            return QuantConfig.load(directory)
        except EdgeLLMError as exc:
            raise ConfigurationError(f"model {self.name!r}: {exc}") from None

    def checkpoint_precision(self) -> Precision | None:
        """The precision a pre-quantized checkpoint carries (what its rows run at); None for a float checkpoint or
        one that cannot be read here (see :meth:`quantization`)."""
        found = self.quantization()
        return None if found is None or not found.is_quantized else Precision(found.method.value)

    def _expanded(self) -> Path:
        """A path entry's path with its ``${VAR}`` expanded (ConfigurationError naming an unset one)."""
        raw = self.spec["path"]
        missing = [v for v in _ENV_REF.findall(raw) if not os.environ.get(v)]
        if missing:
            raise ConfigurationError(
                f"model {self.name!r}: checkpoint path {raw!r} needs environment variable(s) {', '.join(missing)}"
            )
        return Path(_ENV_REF.sub(lambda m: os.environ[m.group(1)], raw)).expanduser()

    def _path(self) -> Path:
        path = self._expanded()
        if not (path / "config.json").is_file():
            raise ConfigurationError(f"model {self.name!r}: no checkpoint at {path} (config.json not found)")
        return path

    def shape(self) -> ModelShape | None:
        """What a toolchain's kernels ask of the model (``ToolchainDriver.model_problem``), read without its weights:
        a synthetic model's family ``tiny_config`` with the entry's overrides (what ``edgellm.synth`` writes), a
        bundled or path checkpoint's ``config.json`` (a multimodal one's ``text_config``). None when that cannot be
        read here (a path checkpoint absent on this host, a config without the keys): the plan then decides the
        model's rows without its limits. A ``synth_quant`` model has its base's shape."""
        if self.kind == "synth_quant":
            return self.base.shape() if self.base is not None else None
        if self.kind == "synth_variant":
            return None  # a draft, adapter or vocabulary has no kernel shape of its own; a VLM's is read once written
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

    def config(self) -> dict[str, Any] | None:
        """The model's Hugging Face config as a mapping, read without its weights (what ``shape`` reads; a
        synthetic model's is its family's ``tiny_config`` with the entry's overrides, named by the family's first
        model_type and architecture); None when it cannot be read here."""
        if self.kind == "synth_quant":
            return self.base.config() if self.base is not None else None
        if self.kind == "synth_variant":
            return None
        if self.kind == "synthetic":
            from edgellm.models.base import family_named

            try:
                family = family_named(self.spec["family"])
            except ConfigurationError:
                return None
            spec = {k: v for k, v in self.spec.items() if k not in ("family", "seed", "dtype")}
            return {"model_type": family.model_types[0], "architectures": [family.architectures[0]],
                    **family.tiny_config, **spec}
        try:
            directory = ASSETS_DIR / self.spec["bundled"] if self.kind == "bundled" else self._path()
            config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
        except (ConfigurationError, OSError, ValueError):
            return None
        return config if isinstance(config, dict) else None

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
            return _materialize(self, data_dir, lambda tmp: _write_synthetic(self, tmp))
        if self.kind == "synth_quant":
            assert self.base is not None  # the catalog refuses synth_quant without a base
            base = self.base.locate(data_dir)
            return _materialize(self, data_dir, lambda tmp: _write_synth_quant(self, base, tmp))
        if self.kind == "synth_variant":
            made_for = None if self.base is None else self.base.locate(data_dir)
            return _materialize(self, data_dir, lambda tmp: _write_synth_variant(self, made_for, tmp),
                                marker="config.json" if self.role in ("checkpoint", "eagle3_draft") else ".complete")
        return self._path()

    def _path_dir(self) -> Path:
        """A path entry's directory, whatever it holds (an adapter or vocabulary has no config.json)."""
        path = self._expanded()
        if not path.is_dir():
            raise ConfigurationError(f"model {self.name!r}: no directory {path}")
        return path


def row_precision(source: ModelSource, requested: Precision | None,
                  stages: tuple[str, ...] | list[str] = ()) -> Precision:
    """The precision a test row of ``source`` runs at, decided here for ``edgefarm lists validate`` and the plan
    alike: a checkpoint that is already quantized gives its own (a row that asks another is refused, naming the
    model and both precisions; so is one that lists the quantize stage); a float checkpoint takes the requested one
    (which must then be given). ConfigurationError otherwise."""
    found = source.quantization()
    if found is not None and found.is_quantized:
        carried = Precision(found.method.value)
        if requested is not None and requested != carried:
            raise ConfigurationError(
                f"model {source.name!r}: its checkpoint is already quantized at precision {carried.value} "
                f"({found.source}), but the row asks for precision {requested.value}: a pre-quantized checkpoint's "
                f"precision is read from it, never requested (give precision {carried.value}, or leave it out)")
        if "quantize" in stages:
            raise ConfigurationError(f"model {source.name!r}: its checkpoint is already quantized at precision "
                                     f"{carried.value} ({found.source}); stage quantize would quantize it again: "
                                     f"leave quantize out of stages")
        return carried
    if requested is None:
        why = ("its checkpoint cannot be read here to take the precision from" if found is None
               else "its checkpoint is not quantized")
        raise ConfigurationError(f"model {source.name!r}: no precision given, and {why}; give precision (one of "
                                 f"{', '.join(p.value for p in Precision)})")
    return requested


def prequantized_evidence(source: ModelSource) -> str | None:
    """What a run records of a pre-quantized checkpoint's precision (None: the checkpoint is float): the precision
    and where it was read."""
    found = source.quantization()
    if found is None or not found.is_quantized:
        return None
    producer = f", made by {found.producer}" if found.producer else ""
    return f"pre-quantized checkpoint: precision {found.method.value} read from {found.source}{producer}"


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


def _write_synthetic(src: ModelSource, out: Path) -> None:
    from edgellm.synth import make_checkpoint

    spec = dict(src.spec)
    family, seed, dtype = spec.pop("family"), spec.pop("seed", 0), spec.pop("dtype", "fp32")
    make_checkpoint(out, family, dtype=dtype, seed=seed, **spec)


def _write_synth_quant(src: ModelSource, base: Path, out: Path) -> None:
    from edgellm.synth_quant import calibration_ids, quantize_rtn

    quantize_rtn(base, out, src.spec["method"], calibration_ids(base), group_size=int(src.spec["group_size"]))


def _write_synth_variant(src: ModelSource, base: Path | None, out: Path) -> None:
    from edgellm import synth_variants

    writes, seed = src.spec["writes"], int(src.spec.get("seed", 0))
    if writes == "qwen2_5_vl":
        synth_variants.make_qwen2_5_vl(out, seed=seed)
        return
    assert base is not None  # the catalog refuses these without a base
    if writes == "eagle3_draft":
        synth_variants.make_eagle3_draft(base, out, seed=seed)
    elif writes == "lora_adapter":
        synth_variants.make_lora_adapter(base, out, rank=int(src.spec["rank"]), seed=seed)
    else:
        synth_variants.make_reduced_vocab(base, out, size=int(src.spec["size"]))


def _materialize(src: ModelSource, data_dir: Path, write: Callable[[Path], None], *,
                 marker: str = "config.json") -> Path:
    """The checkpoint ``write`` makes, once under ``data_dir`` (written aside, then moved into place; ``marker``
    is the file whose presence says it is complete)."""
    dest = Path(data_dir) / "checkpoints" / src.name.replace("/", "--")
    if (dest / marker).is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}."))
    try:
        write(tmp)
        if marker != "config.json":
            (tmp / marker).touch()
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


def _synth_quant_method(name: str, where: str, problems: list[str]) -> None:
    from edgellm.synth_quant import WRITTEN

    if name not in WRITTEN:
        problems.append(f"{where}: {name!r} is not written by edgellm.synth_quant; valid: {', '.join(WRITTEN)}")


class Catalog:
    def __init__(self, sources: dict[str, ModelSource], path: Path) -> None:
        self.sources = sources
        self.path = path

    @classmethod
    def load(cls, path: Path = CATALOG_FILE, *, registries: Registries | None = None) -> Catalog:
        """The catalog of ``path``; the shipped one with the site directory's ``catalog/`` files over it, those of
        ``registries`` (default: the farm's, ``registries.current()``)."""
        data = read_yaml(Path(path)) or {}
        models = data.get("models") if isinstance(data, dict) else None
        if not isinstance(models, dict):
            raise ConfigurationError(f"{path}: expected a mapping 'models: {{NAME: SOURCE}}'")
        files = {name: Path(path) for name in models}
        if Path(path) == CATALOG_FILE:  # the shipped catalog, with the site directory's catalog/ files over it
            models = dict(models)
            for site_file, site_models in _site_catalogs(registries):
                models.update(site_models)
                files.update(dict.fromkeys(site_models, site_file))
        problems, sources = [], {}
        bases: dict[str, str] = {}
        for name, raw in models.items():
            src = files[name]  # each model's messages name the file that gave it
            try:
                entry = _Entry.model_validate(raw)
            except ValidationError as exc:
                for err in exc.errors():
                    loc = ".".join(str(x) for x in err["loc"])
                    problems.append(f"{src}: model {name!r}{(' ' + loc) if loc else ''}: {err['msg']}")
                continue
            template = None
            if entry.chat_template is not None:
                template = (src.parent / entry.chat_template).resolve()
                if not template.is_file():
                    problems.append(f"{src}: model {name!r} chat_template: no file {template}")
            limits = _thresholds(entry.thresholds or {}, f"{src}: model {name!r} thresholds", problems)
            if entry.bundled is not None:
                kind, spec = "bundled", {"bundled": entry.bundled}
            elif entry.synthetic is not None:
                kind, spec = "synthetic", entry.synthetic.model_dump()
            elif entry.synth_quant is not None:
                kind, spec = "synth_quant", entry.synth_quant.model_dump()
                _synth_quant_method(spec["method"], f"{src}: model {name!r} synth_quant.method", problems)
            elif entry.synth_variant is not None:
                kind, spec = "synth_variant", entry.synth_variant.model_dump(exclude_none=True)
            else:
                kind, spec = "path", {"path": entry.path}
            sources[name] = ModelSource(name, kind, spec, template, limits, entry.calibration_samples)
            if entry.base is not None:
                bases[name] = entry.base
        for name, base in bases.items():
            found = sources.get(base)
            where = f"{path}: model {name!r} base"
            if found is None:
                problems.append(f"{where}: unknown model {base!r}; known: {', '.join(sorted(sources))}")
            elif base == name or base in bases:
                problems.append(f"{where}: {base!r} must be a float model without a base of its own")
            else:
                sources[name] = dataclasses.replace(sources[name], base=found)
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


def _site_catalogs(registries: Registries | None) -> list[tuple[Path, dict[str, Any]]]:
    """The site directory's ``catalog/*.yml`` files (``registries``'; None: the farm's) and the models each gives, in
    name order: a model there adds to the shipped catalog or replaces the shipped model of its name."""
    if registries is None:
        from edgefarm.registries import current

        registries = current()
    out = []
    for file in registries.files("catalog", None).values():
        data = read_yaml(file) or {}
        models = data.get("models") if isinstance(data, dict) else None
        if not isinstance(models, dict):
            raise ConfigurationError(f"{file}: expected a mapping 'models: {{NAME: SOURCE}}'")
        out.append((file, models))
    return out
