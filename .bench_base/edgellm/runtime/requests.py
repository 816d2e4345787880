"""Generation requests and results, and the strict reader/writer of the ``edgellm infer`` JSON files.

Request file: ``{"requests": [{"id": "r1", "prompt": "...", "max_new_tokens": 64, "temperature": 0.0, ...}]}``
(one of ``prompt`` / ``messages`` / ``input_ids``; optional ``top_k``, ``top_p``, ``seed``, ``stop``).
Response file: ``{"responses": [{"id", "output_ids", "text", "finish_reason", "timings": {ttft_ms, ms_per_token}}]}``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgellm.errors import ConfigurationError
from edgellm.files import write_json_atomic

MAX_REQUEST_FILE_BYTES = 64 * 1024 * 1024
# Smallest sampling temperature: logits / T must stay finite in float64 (1e-310 made every probability NaN).
MIN_TEMPERATURE = 1e-3
MAX_TEMPERATURE = 100.0
FINISH_REASONS = ("length", "stop", "eos")


@dataclass
class GenerationRequest:
    id: str
    prompt: str | None = None
    messages: list[dict] | None = None
    input_ids: list[int] | None = None
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0 -> greedy
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        """Every invalid value, named (empty when valid)."""
        out: list[str] = []
        given = [k for k in ("prompt", "messages", "input_ids") if getattr(self, k) is not None]
        if len(given) != 1:
            out.append(f"needs exactly one of prompt, messages, input_ids (got {', '.join(given) or 'none'})")
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) \
                or self.max_new_tokens < 1:
            out.append(f"max_new_tokens {self.max_new_tokens!r} must be an integer >= 1")
        if not isinstance(self.temperature, (int, float)) or not (
            self.temperature == 0.0 or MIN_TEMPERATURE <= self.temperature <= MAX_TEMPERATURE
        ):
            out.append(
                f"temperature {self.temperature!r} must be 0 (greedy) or a number in "
                f"[{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}]"
            )
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            out.append(f"top_k {self.top_k!r} must be an integer >= 0 (0 = off)")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            out.append(f"top_p {self.top_p!r} must be a number in (0, 1]")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or self.seed < 0):
            out.append(f"seed {self.seed!r} must be null or an integer >= 0")
        if self.input_ids is not None and (not self.input_ids or not all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.input_ids)):
            out.append("input_ids must be a non-empty list of integers >= 0")
        if self.prompt is not None and not self.prompt:
            out.append("prompt must be a non-empty string")
        if self.messages is not None and not self.messages:
            out.append("messages must be a non-empty list")
        if any(not isinstance(s, str) or not s for s in self.stop):
            out.append("stop must be a list of non-empty strings")
        out += _text_problems(self)
        return [f"request {self.id!r}: {p}" for p in out]


def _text_problems(req: GenerationRequest) -> list[str]:
    """Text that is not valid Unicode (a lone surrogate such as JSON's "\\ud800") cannot be tokenized."""
    texts: list[tuple[str, object]] = [("prompt", req.prompt)]
    texts += [(f"messages[{i}].content", m.get("content")) for i, m in enumerate(req.messages or [])
              if isinstance(m, dict)]
    texts += [(f"stop[{i}]", s) for i, s in enumerate(req.stop)]
    out = []
    for where, text in texts:
        if isinstance(text, str):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                out.append(f"{where} has a lone surrogate {text[exc.start]!r} at index {exc.start}: "
                           "not valid Unicode text")
    return out


@dataclass
class GenerationResult:
    id: str
    output_ids: list[int]  # generated tokens only
    text: str
    finish_reason: str  # "length" | "stop" | "eos"
    ttft_ms: float
    ms_per_token: float

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "output_ids": self.output_ids, "text": self.text, "finish_reason": self.finish_reason,
                "timings": {"ttft_ms": round(self.ttft_ms, 3), "ms_per_token": round(self.ms_per_token, 3)}}


def _pydantic_models() -> Any:
    from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr

    class Message(BaseModel):
        model_config = ConfigDict(extra="allow")
        role: StrictStr
        content: StrictStr

    class Req(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        id: StrictStr = Field(min_length=1)
        prompt: StrictStr | None = None
        messages: list[Message] | None = None
        input_ids: list[StrictInt] | None = None
        max_new_tokens: StrictInt = 64
        temperature: StrictFloat | StrictInt = 0.0
        top_k: StrictInt = 0
        top_p: StrictFloat | StrictInt = 1.0
        seed: StrictInt | None = None
        stop: list[StrictStr] = Field(default_factory=list)

    class RequestFile(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        requests: list[Req] = Field(min_length=1)

    return RequestFile


def parse_request_file(path: Path) -> list[GenerationRequest]:
    """Read and validate a request file; every problem is named in one ConfigurationError."""
    from pydantic import ValidationError

    path = Path(path)
    if not path.is_file():
        raise ConfigurationError(f"{path}: request file not found")
    if path.stat().st_size > MAX_REQUEST_FILE_BYTES:
        raise ConfigurationError(f"{path}: request file is over {MAX_REQUEST_FILE_BYTES} bytes")
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigurationError(f"{path}: request file is not valid JSON ({exc})") from None
    try:
        parsed = _pydantic_models().model_validate(data)
    except ValidationError as exc:
        problems = [f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}" for e in exc.errors()]
        raise ConfigurationError(f"{path}: invalid request file: " + "; ".join(problems)) from None
    requests = [GenerationRequest(
        id=r.id, prompt=r.prompt, messages=None if r.messages is None else [m.model_dump() for m in r.messages],
        input_ids=r.input_ids, max_new_tokens=r.max_new_tokens, temperature=float(r.temperature), top_k=r.top_k,
        top_p=float(r.top_p), seed=r.seed, stop=list(r.stop),
    ) for r in parsed.requests]
    problems = check_requests(requests)
    if problems:
        raise ConfigurationError(f"{path}: invalid request file: " + "; ".join(problems))
    return requests


def check_requests(requests: list[GenerationRequest]) -> list[str]:
    problems: list[str] = []
    seen: set[str] = set()
    for r in requests:
        if r.id in seen:
            problems.append(f"duplicate request id {r.id!r}")
        seen.add(r.id)
        problems += r.problems()
    return problems


def write_response_file(path: Path, results: list[GenerationResult], extra: dict[str, Any] | None = None) -> None:
    """``{"responses": [...]}``, with ``extra`` keys beside it (the run's peak memory: ``edgellm infer``)."""
    write_json_atomic(Path(path), {"responses": [r.to_json() for r in results], **(extra or {})})
