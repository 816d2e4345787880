"""ONNX export -> engine: verify the export, check the limits against the model, let the backend build, and write
``engine_manifest.json`` (backend and version, build parameters, I/O signature, precision read back from the built
graph, files with sha256, the export manifest's sha256). The engine directory appears whole or not at all.
"""

from __future__ import annotations

import logging
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from edgellm import __version__
from edgellm.backends.base import BuildParams, EngineBackend, backend_class, get_backend
from edgellm.compiler.export import EXPORT_MANIFEST, GENERATION_SETTINGS, MODEL_FILE, RUNTIME_FILES
from edgellm.compiler.files import file_table, sha256_file, staged_dir, verify_files, write_json
from edgellm.config import ModelConfig, read_json_object
from edgellm.errors import ConfigurationError, TestFailure, UnsupportedError
from edgellm.models import family_for
from edgellm.quant import check_gemm_readback
from edgellm.types import Precision

log = logging.getLogger(__name__)

# The engine manifest's file name, defined here only: the runtime and the farm's toolchains import it.
ENGINE_MANIFEST = "engine_manifest.json"


def default_params(cfg: ModelConfig, *, max_batch_size: int | None, max_input_len: int | None,
                   max_seq_len: int | None) -> BuildParams:
    """The build's limits: each given one as given (a 0 is refused by BuildParams, never replaced), the rest
    defaulted."""
    seq = min(cfg.max_position_embeddings, 4096) if max_seq_len is None else max_seq_len
    return BuildParams(
        max_batch_size=4 if max_batch_size is None else max_batch_size,
        max_input_len=min(seq, 2048) if max_input_len is None else max_input_len,
        max_seq_len=seq,
    )


def applied_precision(export_manifest: dict[str, Any], built: dict[str, Any], where: str) -> str:
    """The precision the engine really holds, read back from what the backend built; it must be the one the
    export asked for (a quantized one: every declared quantized GEMM counted by kind in the built graph)."""
    exported = export_manifest.get("precision")
    quant = export_manifest.get("quantization")
    if quant:  # quantized GEMMs counted by kind in the built graph: never a silently float engine
        check_gemm_readback(quant["quantized_gemms"], built["graph"].get("quantized_gemms", {}), where)
        return str(exported)
    if built["precision"] != exported:
        raise TestFailure(f"{where}: the built engine holds {built['precision']} weights but the export is "
                          f"{exported}: the backend did not apply the requested precision")
    return str(exported)


def build_engine(onnx_dir: Path, engine_dir: Path, backend: str = "ort", *,
                 max_batch_size: int | None = None, max_input_len: int | None = None,
                 max_seq_len: int | None = None, overwrite: bool = False) -> dict[str, Any]:
    onnx_dir = Path(onnx_dir)
    declared = backend_class(backend)
    if not onnx_dir.is_dir():
        raise ConfigurationError(f"{onnx_dir}: ONNX export directory not found")
    # what the backend builds is decided before whether it runs here: a refused precision says why on any machine
    export_manifest = read_json_object(onnx_dir / EXPORT_MANIFEST, what=EXPORT_MANIFEST, max_bytes=16 * 1024 * 1024)
    problem = declared.precision_problem(Precision.parse(str(export_manifest.get("precision")),
                                                         what="export precision"))
    if problem:
        raise UnsupportedError(f"{onnx_dir}: {problem}")
    engine = get_backend(backend)
    # The files' digests are checked (hashing ~all the export's bytes) beside the backend's build; a mismatch
    # fails the build before anything is published, and is reported in preference to what it may have caused.
    verifier = ThreadPoolExecutor(max_workers=1)
    verified = verifier.submit(verify_files, onnx_dir, EXPORT_MANIFEST)
    verifier.shutdown(wait=False)
    try:
        return _build(onnx_dir, engine_dir, engine, export_manifest, verified, max_batch_size=max_batch_size,
                      max_input_len=max_input_len, max_seq_len=max_seq_len, overwrite=overwrite)
    except BaseException:
        verified.result()  # raises the verification error, if there is one
        raise


def _build(onnx_dir: Path, engine_dir: Path, engine: EngineBackend, export_manifest: dict[str, Any],
           verified: Future[dict[str, Any]], *, max_batch_size: int | None, max_input_len: int | None,
           max_seq_len: int | None, overwrite: bool) -> dict[str, Any]:
    cfg = ModelConfig.load(onnx_dir)
    family = family_for(cfg)
    params = default_params(cfg, max_batch_size=max_batch_size, max_input_len=max_input_len,
                            max_seq_len=max_seq_len)
    if params.max_seq_len > cfg.max_position_embeddings:
        raise ConfigurationError(f"max_seq_len {params.max_seq_len} exceeds the model's max_position_embeddings "
                                 f"{cfg.max_position_embeddings}")
    held = export_manifest.get("rotary_positions", cfg.max_position_embeddings)  # older exports: the config's
    if isinstance(held, int) and params.max_seq_len > held:
        raise ConfigurationError(f"max_seq_len {params.max_seq_len} exceeds the {held} positions the export's RoPE "
                                 f"tables hold; valid: 1..{held} (export with a larger max_positions)")
    from edgellm.models.rope import length_limit as rope_length_limit  # torch: only where an engine is built

    limit = rope_length_limit(cfg)
    if limit is not None and params.max_seq_len > limit[0]:
        raise UnsupportedError(f"{family.name}: max_seq_len {params.max_seq_len}: {limit[1]}; build with "
                               f"max_seq_len <= {limit[0]}")
    started = time.perf_counter()
    with staged_dir(Path(engine_dir), overwrite=overwrite) as out:
        built = engine.build(onnx_dir / MODEL_FILE, out, params)
        if verified.result() != export_manifest:
            raise ConfigurationError(f"{onnx_dir / EXPORT_MANIFEST}: changed during the build")
        for name in (*RUNTIME_FILES, GENERATION_SETTINGS):
            if (onnx_dir / name).is_file():
                shutil.copyfile(onnx_dir / name, out / name)
        exported = export_manifest.get("precision")
        quant = export_manifest.get("quantization")
        built["precision"] = applied_precision(export_manifest, built, f"{engine.backend} build of {onnx_dir}")
        # Files the backend took unchanged from the export (hard links): their digests were just verified.
        known = {name: export_manifest["files"][src]["sha256"] for name, src in built.get("reused_files", {}).items()
                 if src in export_manifest["files"]}
        manifest = {
            "format": "edgellm-engine/1",
            "edgellm_version": __version__,
            "backend": engine.backend,
            "backend_version": engine.version(),
            "build_params": {"max_batch_size": params.max_batch_size, "max_input_len": params.max_input_len,
                             "max_seq_len": params.max_seq_len},
            "precision": built["precision"],
            "export_precision": exported,
            **({"quantization": {"method": quant["method"], "declared_gemms": quant["quantized_gemms"],
                                 "emulated": quant["emulated"]}} if quant else {}),
            "model": export_manifest.get("model", {}),
            "io": built["io"],
            "graph": built["graph"],
            "backend_options": built["options"],
            "source_export": {"path": str(onnx_dir.resolve()),
                              "manifest_sha256": sha256_file(onnx_dir / EXPORT_MANIFEST),
                              "checkpoint_sha256": export_manifest.get("checkpoint", {}).get("sha256")},
            "build_seconds": round(time.perf_counter() - started, 3),
            "created_unix": int(time.time()),
            "files": file_table(out, known=known),
        }
        write_json(out / ENGINE_MANIFEST, manifest)
    log.info("built %s engine %s in %.1f s", engine.backend, engine_dir, manifest["build_seconds"])
    return manifest
