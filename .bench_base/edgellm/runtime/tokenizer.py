"""Text <-> token ids with the checkpoint's own ``tokenizer.json`` (its post-processor adds BOS) and chat
template (rendered with jinja2, as transformers does; no transformers at run time)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgellm.config import tokenizer_size_problem
from edgellm.errors import ConfigurationError


class TextCodec:
    def __init__(self, tokenizer_file: Path, *, chat_template: str | None = None,
                 special_tokens: dict[str, str | None] | None = None) -> None:
        from tokenizers import Tokenizer

        if not Path(tokenizer_file).is_file():
            raise ConfigurationError(f"{tokenizer_file}: tokenizer file not found")
        if (too_large := tokenizer_size_problem(tokenizer_file)) is not None:
            raise ConfigurationError(too_large)
        try:
            self.tok = Tokenizer.from_file(str(tokenizer_file))
        except Exception as exc:  # the tokenizers library raises a plain Exception on bad JSON
            raise ConfigurationError(f"{tokenizer_file}: cannot load tokenizer ({exc})") from None
        self.source = Path(tokenizer_file)
        self.chat_template = chat_template
        self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if v is not None}
        self._template: Any = None

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)

    def render_chat(self, messages: list[dict[str, Any]]) -> str:
        if not self.chat_template:
            raise ConfigurationError(
                f"{self.source.parent}: the tokenizer has no chat template, so 'messages' cannot be used; "
                f"send a 'prompt' instead"
            )
        if self._template is None:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

            def raise_exception(message: str) -> None:
                raise ConfigurationError(f"chat template refused the messages: {message}")

            env.globals["raise_exception"] = raise_exception
            self._template = env.from_string(self.chat_template)
        try:
            return self._template.render(messages=messages, add_generation_prompt=True, **self.special_tokens)
        except ConfigurationError:
            raise
        except Exception as exc:  # jinja2 errors in a third-party template
            raise ConfigurationError(f"chat template failed to render ({type(exc).__name__}: {exc})") from None

    def encode_chat(self, messages: list[dict[str, Any]]) -> list[int]:
        # The rendered template already holds the special tokens (as transformers' apply_chat_template does).
        return self.encode(self.render_chat(messages), add_special_tokens=False)
