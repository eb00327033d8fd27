"""Chat templating as token deltas: the prompt is rendered once, each observation is rendered
as the exact tokens the chat template puts after an assistant turn, and nothing already in
the sequence is ever re-tokenised.

Why deltas: re-templating and re-tokenising the whole history after every turn can change
the tokens of earlier turns (BPE merges across a boundary, templates that rewrite old
assistant messages), and then the logprobs vLLM gave no longer belong to the tokens the
learner trains on. Appending deltas keeps the sequence exactly what the model saw.

How the observation delta is found: render a fixed base conversation that ends with an
assistant turn, then the same conversation plus the observation messages with the
generation prompt; the delta is every token after the EOS that closes the base's assistant
turn (for the Qwen/Hermes format: `\\n<|im_start|>user\\n<tool_response>\\n...` up to and
including the next `<|im_start|>assistant\\n`). The EOS is a special token, so what follows
it tokenises the same whatever came before; `ChatTemplate` checks that the template renders
the base identically in both, and refuses templates for which that is not so.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any, Protocol

# A fixed conversation ending with an assistant turn; only its rendering's shape matters. Its
# assistant turn reasons first, so that a template which drops past reasoning once a new
# query follows (Qwen3's, demo/family_templates.py) shows it in `observation_ids`' check.
_BASE_CONVERSATION = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "U"},
    {"role": "assistant", "content": "<think>\nT\n</think>\n\nA"},
]
NOT_PREFIX_STABLE = (
    "the chat template renders earlier turns differently once these observations follow "
    "(it rewrites the history: e.g. drops past <think> reasoning once a new user query "
    "comes, or moves the tools and system prompt to the newest user message): a token-in/"
    "token-out episode would train on a history the model does not see at inference. "
    "Send the environment's results as role 'tool' messages (most such templates keep the "
    "history then), use a template that keeps earlier turns as they were, or make each "
    "turn an episode of its own (single-turn tasks)"
)


# Prompts rendered lately, by their messages and tools: a group's episodes (and an agent's
# episodes of one task) all start from the same prompt, and rendering it (Jinja, then BPE)
# is most of what an episode costs the replica outside the engine. Small: a template that
# reads the clock (strftime_now) sees at most a few seconds' old time.
PROMPT_CACHE_SIZE = 64


class Tokenizer(Protocol):
    """The part of a HF tokenizer (transformers' `PreTrainedTokenizerFast`) used here."""

    eos_token_id: int | None

    def apply_chat_template(self, conversation: list[dict], **kwargs: Any) -> Any: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class ChatTemplate:
    """Token-level rendering of prompts and observations with a tokenizer's chat template."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no EOS token; the assistant turn end is unknown")
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat_template")
        self.tokenizer = tokenizer
        self.eos_token_id: int = tokenizer.eos_token_id
        # Ids at or past this have no token (a model's embedding may have more rows than its
        # tokenizer has entries: Qwen2.5 151,936 against 151,665); None: not known.
        self.num_tokens: int | None = len(tokenizer) if hasattr(tokenizer, "__len__") else None
        base = self._render(_BASE_CONVERSATION, tools=None, add_generation_prompt=False)
        if self.eos_token_id not in base:
            raise ValueError(
                "the chat template does not close an assistant turn with the EOS token "
                f"{self.eos_token_id}; observation deltas cannot be cut after it"
            )
        # Tokens of the base up to and including the EOS closing its assistant turn.
        self._base_head = base[: len(base) - base[::-1].index(self.eos_token_id)]
        self._prompts: OrderedDict[str, list[int]] = OrderedDict()

    def _render(
        self, messages: list[dict], *, tools: list[dict] | None, add_generation_prompt: bool
    ) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            messages,
            tools=tools or None,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
        )
        # The template's text already holds any BOS it wants; add no more special tokens.
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if getattr(self.tokenizer, "is_fast", False) and backend is not None:
            # The Rust tokenizer itself: the same ids without transformers' per-call wrapping
            # (a third of an encode's time for a short delta).
            return backend.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """The prompt as the model sees it before its first turn (ends with the generation
        prompt, e.g. `<|im_start|>assistant\\n`)."""
        _check_messages(messages, "prompt")
        if not messages:
            raise ValueError("the prompt has no messages")
        key = json.dumps([messages, tools], sort_keys=True, default=repr)
        ids = self._prompts.pop(key, None)
        if ids is None:
            ids = self._render(messages, tools=tools, add_generation_prompt=True)
        self._prompts[key] = ids
        if len(self._prompts) > PROMPT_CACHE_SIZE:
            self._prompts.popitem(last=False)
        return list(ids)

    def observation_ids(self, observations: list[dict]) -> list[int]:
        """Tokens to append after an assistant turn that ended with EOS: whatever the template
        puts after that EOS, the observation messages, and the next generation prompt."""
        _check_messages(observations, "observation")
        full = self._render(
            _BASE_CONVERSATION + list(observations), tools=None, add_generation_prompt=True
        )
        head = self._base_head
        if full[: len(head)] != head:
            raise ValueError(NOT_PREFIX_STABLE)
        return full[len(head) :]

    def num_undecodable(self, token_ids: list[int]) -> int:
        """How many of `token_ids` the tokenizer has no token for (they decode to nothing)."""
        limit = self.num_tokens
        return 0 if limit is None else sum(1 for t in token_ids if t >= limit)

    def assistant_text(self, generated_ids: list[int]) -> str:
        """The assistant message text of one generated turn, as the environment should see it:
        without the closing EOS, other special tokens kept (they are what the model wrote)."""
        ids = list(generated_ids)
        if ids and ids[-1] == self.eos_token_id:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False)


def _check_messages(messages: Any, what: str) -> None:
    """Messages come from env servers and prompt tasks: reject malformed ones clearly."""
    if not isinstance(messages, list | tuple):
        raise ValueError(f"{what} messages must be a list, got {type(messages).__name__}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError(f"{what} message {i} must be a dict with a string 'role': {m!r}")
        if not isinstance(m.get("content"), str):
            raise ValueError(f"{what} message {i} must have a string 'content': {m!r}")
