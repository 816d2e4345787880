"""``edgefarm nightly -k EXPR``: a subset of the plan, chosen like pytest's ``-k``: words matched (case-insensitive
substrings) against a job's row name (``<model> <precision> @<platform>``), its test id and its toolchain, combined
with ``and``, ``or``, ``not`` and parentheses. A bad expression, or one that keeps no job, is bad input (exit 2)."""

from __future__ import annotations

import re
from dataclasses import replace

from edgefarm.flows.plan import Job, Plan
from edgellm.errors import ConfigurationError

_TOKEN = re.compile(r"\s*(\(|\)|[^\s()]+)")
_WORDS = ("and", "or", "not")


def _haystack(job: Job) -> str:
    return " ".join((job.model, job.precision.value, f"@{job.platform}", job.platform, job.key, job.toolchain,
                     job.entry.variant or "")).lower()


def matches(expr: str, job: Job) -> bool:
    """Whether ``job`` is selected by ``expr`` (a ConfigurationError for a malformed one)."""
    tokens = _TOKEN.findall(expr)
    if not tokens:
        raise ConfigurationError(f"-k {expr!r}: empty; give words to match, e.g. -k 'stories260K and not fp16'")
    hay = _haystack(job)
    pos = 0

    def bad() -> ConfigurationError:
        return ConfigurationError(f"-k {expr!r}: not an expression of words with and / or / not and parentheses "
                                  f"(e.g. 'qwen and x86-cpu and not fp16')")

    def peek() -> str | None:
        return tokens[pos].lower() if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise bad()
        pos += 1
        return tokens[pos - 1]

    def either() -> bool:
        value = both()
        while peek() == "or":
            take()
            value = both() or value
        return value

    def both() -> bool:
        value = negated()
        while peek() == "and":
            take()
            value = negated() and value
        return value

    def negated() -> bool:
        if peek() == "not":
            take()
            return not negated()
        token = take()
        if token == "(":
            value = either()
            if take() != ")":
                raise bad()
            return value
        if token == ")" or token.lower() in _WORDS:
            raise bad()
        return token.lower() in hay

    value = either()
    if pos != len(tokens):
        raise bad()
    return value


def subset(plan: Plan, expr: str | None) -> Plan:
    """The plan with the jobs ``expr`` selects (the plan itself with no ``expr``)."""
    if expr is None:
        return plan
    kept = [j for j in plan.jobs if matches(expr, j)]
    if not kept:
        rows = sorted({f"{j.model} {j.precision.value} @{j.platform}" for j in plan.jobs})
        raise ConfigurationError(f"-k {expr!r} selects no job of the plan {plan.name}; its rows: "
                                 f"{', '.join(rows[:20])}{' ...' if len(rows) > 20 else ''}")
    return replace(plan, jobs=kept)
