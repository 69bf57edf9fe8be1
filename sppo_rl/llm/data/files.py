"""Prompts with verifiable answers: the :class:`Example` record and loaders for local files.

Nothing is downloaded: every loader reads a file on disk. Supported files: ``.jsonl`` (one JSON object
per line, blank lines skipped), ``.json`` (a list of objects) and ``.parquet``. The record layout is
detected from its keys (see :data:`FORMATS`):

============  ==========================  =====================================================
format        detected by keys            prompt / answer
============  ==========================  =====================================================
``verl``      ``prompt``, ``reward_model``  chat messages / ``reward_model.ground_truth``
``gsm8k``     ``question``, ``answer``      text / the part of ``answer`` after the last ``####``
``math``      ``problem``, ``solution``     text / ``answer`` if present, else the last ``\\boxed{}``
                                            of ``solution``
``plain``     ``prompt``, ``answer``        text or chat messages / ``answer``
``trl``       ``prompt``, ``solution``      text or chat messages / ``answer`` if present, else the
                                            last ``\\boxed{}`` of ``solution`` (TRL's math data)
============  ==========================  =====================================================

``prompt_key`` and ``answer_key`` (``--prompt-key`` / ``--answer-key``; dotted paths reach into nested
objects, ``reward_model.ground_truth``) override a format's keys; error messages name the flags. A malformed record raises one :class:`DataError` naming the file and the line
(JSONL, 1-based) or row (Parquet and JSON, 0-based).

Oversized input never reaches a tokenizer: a record with a text field over ``max_chars`` characters
(default :data:`MAX_TEXT_CHARS`), or a JSONL line over :data:`MAX_LINE_BYTES` (not even read whole), is
skipped and counted, with one warning line on stderr per file. :func:`fit_prompts` drops the prompts
longer than the model can take (counted too), judging by characters first.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sppo_rl.llm.rewards.answers import extract_boxed

Message = dict[str, str]
Prompt = str | list[Message]

MAX_TEXT_CHARS = 1_000_000
"""Longest text field (a prompt's text, an answer, any string of a record) loaded; longer records are skipped."""
MAX_LINE_BYTES = 4 * MAX_TEXT_CHARS
"""Longest JSONL line read; a longer one is skipped without being held in memory whole."""
CHARS_PER_TOKEN = 8
"""A prompt of more than this many characters per allowed token is too long without tokenizing it."""
_OVERSIZED = object()  # a reader's record standing for a line too long to read


class DataError(ValueError):
    """A data file that cannot be read as examples; the message names the file and the line or row."""


@dataclass
class Example:
    """One prompt with its verifiable answer.

    Attributes:
        prompt: plain text, or chat messages ``[{"role": ..., "content": ...}, ...]``.
        answer: the ground truth the verifier compares against (a LaTeX string or an integer as text).
        source: where it comes from: the record's ``data_source``, else the file's stem, or a task name.
        index: position in its file or split (0-based).
        meta: everything else in the record (``ability`` whatever its spelling, ``extra_info``, ...), or
            task parameters such as ``{"level": 2}``.
        format: the record layout it was read from (``gsm8k``, ``math``, ...; empty for generated tasks).
        given_prompt: the prompt as the data gives it, once :func:`sppo_rl.llm.data.prompts.render_examples` has
            replaced ``prompt`` by the text the model reads (None: ``prompt`` is still the data's own).
    """

    prompt: Prompt
    answer: str
    source: str = ""
    index: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    format: str = ""
    given_prompt: Prompt | None = None

    @property
    def data_prompt(self) -> Prompt:
        """The prompt as the data gives it (text or chat messages), before any rendering."""
        return self.prompt if self.given_prompt is None else self.given_prompt


# ------------------------------------------------------------------------------------ formats


def _after_hashes(text: str) -> str:
    """GSM8K: the final answer follows the last ``####``; thousands separators dropped (``1,000``)."""
    if "####" not in text:
        return text.strip()
    return text.rsplit("####", 1)[1].strip().replace(",", "")


def _last_boxed(text: str) -> str:
    """MATH: the answer is the last ``\\boxed{}`` of the solution (the text itself if there is none)."""
    boxed = extract_boxed(text, max_scan=len(text) + 1)
    return text.strip() if boxed is None else boxed


@dataclass(frozen=True)
class Format:
    """A record layout: its default keys and how the answer is read from the answer field."""

    name: str
    prompt_key: str
    answer_key: str
    signature: tuple[str, ...]
    answer_from: Callable[[str], str] = str.strip
    answer_fallback: str | None = None  # key used when answer_key is absent


FORMATS: dict[str, Format] = {
    f.name: f
    for f in [
        Format("verl", "prompt", "reward_model.ground_truth", ("prompt", "reward_model")),
        Format("gsm8k", "question", "answer", ("question", "answer"), _after_hashes),
        Format("math", "problem", "answer", ("problem", "solution"), _last_boxed, answer_fallback="solution"),
        Format("plain", "prompt", "answer", ("prompt", "answer")),
        Format("trl", "prompt", "answer", ("prompt", "solution"), _last_boxed, answer_fallback="solution"),
    ]
}


def detect_format(keys: set[str] | list[str]) -> Format | None:
    """The first format of :data:`FORMATS` whose signature keys are all in ``keys``."""
    present = set(keys)
    for fmt in FORMATS.values():
        if set(fmt.signature) <= present:
            return fmt
    return None


# ------------------------------------------------------------------------------------ records


def _get(record: dict[str, Any], dotted: str) -> Any:
    """``record["a"]["b"]`` for ``"a.b"``; ``KeyError`` naming the missing part."""
    value: Any = record
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(part)
        value = value[part]
    return value


def _check_prompt(value: Any) -> Prompt:
    if isinstance(value, str):
        if not value.strip():
            raise ValueError("empty prompt")
        return value
    if isinstance(value, (list, tuple)) and value:
        messages = []
        for i, m in enumerate(value):
            if (
                not isinstance(m, dict)
                or not isinstance(m.get("role"), str)
                or not isinstance(m.get("content"), str)
            ):
                raise ValueError(
                    f"prompt message {i} is not a {{'role': str, 'content': str}} object: {m!r:.80}"
                )
            messages.append({"role": m["role"], "content": m["content"]})
        return messages
    raise ValueError(
        f"prompt must be a string or a non-empty list of chat messages, got {type(value).__name__}"
    )


def _check_answer(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"answer must be a string or a number, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"answer is not finite: {value!r}")
    return str(value)


def _lone_surrogate(value: Any, key: str = "", depth: int = 0) -> str | None:
    """Where the first string of a record holds a lone UTF-16 surrogate (JSON's ``"\\ud800"`` escape
    without its pair decodes to one), ``"<key> at character <i> (\\ud800)"``; None if none does. Such a
    string is no Unicode text: it cannot be encoded as UTF-8, and a tokenizer refuses it."""
    if isinstance(value, str):
        if value.isascii():
            return None
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            return f"{key or 'the record'} at character {e.start} ({ascii(value[e.start])[1:-1]})"
        return None
    if depth > 32:
        return None
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        return None
    for k, v in items:
        found = _lone_surrogate(v, f"{key}.{k}" if key else str(k), depth + 1)
        if found:
            return found
    return None


def _to_example(record: Any, fmt: Format, prompt_key: str, answer_key: str, index: int, stem: str) -> Example:
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    bad = _lone_surrogate(record)
    if bad:
        raise ValueError(
            f"a lone surrogate in {bad}: a \\uD800-\\uDFFF escape without its pair is not text; "
            "fix the string (write the character itself, or both halves of its pair)"
        )
    try:
        prompt = _check_prompt(_get(record, prompt_key))
    except KeyError:
        raise ValueError(
            f"missing key {prompt_key!r} (keys: {', '.join(sorted(record))}); --prompt-key names the prompt column"
        ) from None
    key = answer_key
    try:
        raw = _get(record, key)
    except KeyError:
        if fmt.answer_fallback is None or fmt.answer_fallback not in record:
            raise ValueError(
                f"missing key {answer_key!r} (keys: {', '.join(sorted(record))}); --answer-key names the answer "
                "column"
            ) from None
        key = fmt.answer_fallback
        raw = record[key]
    answer = fmt.answer_from(_check_answer(raw))
    if not answer:
        raise ValueError(f"empty answer in {key!r}")
    used = {prompt_key.split(".")[0], answer_key.split(".")[0], "data_source"}
    meta = {("ability" if k == "abality" else k): v for k, v in record.items() if k not in used}
    source = record.get("data_source")
    return Example(
        prompt, answer, source if isinstance(source, str) and source else stem, index, meta, fmt.name
    )


# ------------------------------------------------------------------------------------ readers


def _not_utf8(where: str, e: UnicodeDecodeError, column: int | None = None) -> DataError:
    at = f" at column {column}" if column is not None else ""
    return DataError(f"{where}: not UTF-8 text (byte {e.object[e.start]:#04x}{at}); save the file as UTF-8")


def _bounded_lines(f: Any, limit: int) -> Iterator[bytes | None]:
    """The lines of binary file ``f``; ``None`` for a line longer than ``limit`` bytes, which is read
    past in 1 MiB pieces and never held whole."""
    while line := f.readline(limit + 1):
        if len(line.rstrip(b"\r\n")) <= limit:
            yield line
            continue
        while not line.endswith(b"\n") and (line := f.readline(1 << 20)):
            pass
        yield None


def _read_jsonl(path: Path) -> Iterator[tuple[str, Any]]:
    with path.open("rb") as f:  # bytes, decoded line by line, so that bad bytes are named by line
        for lineno, raw in enumerate(_bounded_lines(f, MAX_LINE_BYTES), start=1):
            where = f"{path.name}:{lineno}"
            if raw is None:
                yield where, _OVERSIZED
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise _not_utf8(where, e, e.start + 1) from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
            except RecursionError:
                raise DataError(f"{where}: JSON nested too deeply") from None
            yield where, record


def _read_json(path: Path) -> Iterator[tuple[str, Any]]:
    raw = path.read_bytes()
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise _not_utf8(f"{path.name}:{line}", e) from None
    except json.JSONDecodeError as e:
        raise DataError(f"{path.name}:{e.lineno}: invalid JSON ({e.msg})") from None
    except RecursionError:
        raise DataError(f"{path.name}: JSON nested too deeply") from None
    if not isinstance(data, list):
        raise DataError(f"{path.name}: expected a JSON list of objects, got {type(data).__name__}")
    for row, record in enumerate(data):
        yield f"{path.name}: row {row}", record


def _read_parquet(path: Path) -> Iterator[tuple[str, Any]]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises several types for a corrupt file
        raise DataError(f"{path.name}: not a readable Parquet file ({e})") from None
    row = 0
    for batch in pf.iter_batches(batch_size=1024):
        for record in batch.to_pylist():
            yield f"{path.name}: row {row}", record
            row += 1


_READERS = {".jsonl": _read_jsonl, ".json": _read_json, ".parquet": _read_parquet}


def load_examples(
    path: str | Path,
    *,
    prompt_key: str | None = None,
    answer_key: str | None = None,
    limit: int | None = None,
    format: str | None = None,
    max_chars: int | None = MAX_TEXT_CHARS,
) -> list[Example]:
    """Read ``path`` (``.jsonl``, ``.json`` or ``.parquet``) into examples, in file order.

    Args:
        path: a local file; nothing is downloaded.
        prompt_key: the prompt field (dotted path allowed); default: the format's.
        answer_key: the answer field (dotted path allowed); default: the format's.
        limit: read at most this many examples (the file is read lazily up to there).
        format: one of :data:`FORMATS`; default: detected from the first record's keys, with the
            explicit keys counted as present.
        max_chars: records with a longer text field (and JSONL lines over :data:`MAX_LINE_BYTES`)
            are skipped, counted in one warning line on stderr; ``None``: no bound on fields.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        DataError: an unsupported extension, an unknown layout, or a malformed record (bad JSON, a
            missing key, a wrong type, an empty answer), naming file and line/row.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    reader = _READERS.get(path.suffix.lower())
    if reader is None:
        raise DataError(
            f"{path.name}: unsupported file type {path.suffix!r}; use one of {', '.join(_READERS)}"
        )
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if format is not None and format not in FORMATS:
        raise ValueError(f"unknown format {format!r}; valid: {', '.join(FORMATS)}")

    examples: list[Example] = []
    skipped: list[str] = []
    fmt: Format | None = FORMATS[format] if format else None
    for where, record in reader(path):
        if limit is not None and len(examples) >= limit:
            break
        if record is _OVERSIZED or (max_chars is not None and _longest_text(record) > max_chars):
            skipped.append(where)
            continue
        if fmt is None:
            if not isinstance(record, dict):
                raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
            keys = set(record) | {k.split(".")[0] for k in (prompt_key, answer_key) if k}
            fmt = detect_format(keys)
            if fmt is None and prompt_key and answer_key:
                fmt = FORMATS["plain"]
            if fmt is None:
                known = ", ".join(f"{f.name} ({'+'.join(f.signature)})" for f in FORMATS.values())
                raise DataError(
                    f"{where}: cannot tell the record layout from its keys ({', '.join(sorted(record))}); "
                    f"known layouts: {known}; or name the columns with --prompt-key and --answer-key"
                )
        try:
            examples.append(
                _to_example(
                    record,
                    fmt,
                    prompt_key or fmt.prompt_key,
                    answer_key or fmt.answer_key,
                    len(examples),
                    path.stem,
                )
            )
        except ValueError as e:
            raise DataError(f"{where}: {e}") from None
    _check_repeats(examples, path)
    if skipped:
        first = ", ".join(skipped[:3])
        print(
            f"[sppo-rl] warning: {path}: skipped {len(skipped)} oversized record(s) (a text field over "
            f"{max_chars or MAX_TEXT_CHARS:,} characters or a line over {MAX_LINE_BYTES:,} bytes): "
            f"{first}{', ...' if len(skipped) > 3 else ''}",
            file=sys.stderr,
        )
    return examples


def _check_repeats(examples: list[Example], path: Path) -> None:
    """Refuse (``DataError``, one line naming both records) a prompt that appears with two different
    answers, since no response can be right for both; count exact repeats (same prompt, same answer) in
    one warning line: they are kept (an evaluation file may repeat problems on purpose)."""
    first: dict[str, Example] = {}
    repeats = 0
    for e in examples:
        key = e.prompt if isinstance(e.prompt, str) else json.dumps(e.prompt, sort_keys=True)
        seen = first.setdefault(key, e)
        if seen is e:
            continue
        if seen.answer != e.answer:
            raise DataError(
                f"{path.name}: records {seen.index} and {e.index} (0-based) have the same prompt but different "
                f"answers ({seen.answer!r:.60} and {e.answer!r:.60}); keep one"
            )
        repeats += 1
    if repeats:
        print(
            f"[sppo-rl] warning: {path}: {repeats} record(s) repeat an earlier one exactly (same prompt and "
            f"answer); {len(first)} distinct prompt(s) of {len(examples)}, repeats kept",
            file=sys.stderr,
        )


def non_integer_references(examples: list[Example]) -> list[Example]:
    """The examples whose reference is not an integer (an optional sign and digits, as
    :func:`sppo_rl.llm.rewards.verify.verify_integer` reads it), which ``--reward-fn integer`` can never pay."""
    import re

    integer = re.compile(r"\s*[+-]?[0-9]{1,1000}\s*")
    return [e for e in examples if not integer.fullmatch(e.answer)]


def drop_unpayable_references(examples: list[Example], max_chars: int, where: str) -> list[Example]:
    """The examples whose reference has at most ``max_chars`` characters; the longer ones, which the
    math verifier can never pay (it scores only a boxed answer of at most that length), are dropped
    and counted in one warning line on stderr naming ``where``."""
    kept = [e for e in examples if len(e.answer) <= max_chars]
    if len(kept) < len(examples):
        print(
            f"[sppo-rl] warning: {where}: skipped {len(examples) - len(kept)} of {len(examples)} record(s) whose "
            f"reference is longer than {max_chars} characters (no boxed answer can match it)",
            file=sys.stderr,
        )
    return kept


def _longest_text(value: Any, depth: int = 0) -> int:
    """Length of the longest string in a record (nested dicts and lists included)."""
    if isinstance(value, str):
        return len(value)
    if depth > 32:
        return 0
    if isinstance(value, dict):
        return max((_longest_text(v, depth + 1) for v in value.values()), default=0)
    if isinstance(value, (list, tuple)):
        return max((_longest_text(v, depth + 1) for v in value), default=0)
    return 0


# ------------------------------------------------------------------------------------ prompts


def render_prompt(example: Example | Prompt, tokenizer: Any = None, suffix: str | None = None) -> str:
    """The text fed to the model, for a prompt that is already the run's text or that needs no run options.

    A run renders every prompt once with its options (:func:`sppo_rl.llm.data.prompts.render`: chat template,
    system prompt, instruction; a plain string becomes a user message too); what it reads afterwards is
    that text, which this function returns as is. Outside a run, use :func:`sppo_rl.llm.data.prompts.render`
    with the run's :class:`~sppo_rl.llm.data.prompts.PromptFormat` (``LLMPolicy.generate`` does).

    A plain-text prompt is returned as is, plus ``suffix``. Chat messages get ``suffix`` appended to
    the last user message, then go through ``tokenizer.apply_chat_template(messages, tokenize=False,
    add_generation_prompt=True)`` when the tokenizer has a chat template; without one, the message
    contents are joined with blank lines.
    """
    prompt = example.prompt if isinstance(example, Example) else example
    if isinstance(prompt, str):
        return prompt + (suffix or "")
    messages = [dict(m) for m in prompt]
    if suffix:
        users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        last = users[-1] if users else len(messages) - 1
        messages[last]["content"] += suffix
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "\n\n".join(m["content"] for m in messages)


def fit_prompts(
    examples: list[Example], tokenizer: Any, max_tokens: int, *, where: str, why: str = "", warn: bool = True
) -> list[Example]:
    """The examples whose rendered prompt (:func:`render_prompt`) has at most ``max_tokens`` tokens.

    A prompt of more than ``CHARS_PER_TOKEN * max_tokens`` characters is dropped without tokenizing
    it; the others are tokenized in batches (``add_special_tokens=False``, as the rollout does). The
    dropped ones are counted in one warning line on stderr naming ``where`` (the file) and the limit
    (``why`` explains it).
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    texts = [render_prompt(e, tokenizer) for e in examples]
    keep = [len(t) <= CHARS_PER_TOKEN * max_tokens for t in texts]
    todo = [i for i, k in enumerate(keep) if k]
    for lo in range(0, len(todo), 1024):
        part = todo[lo : lo + 1024]
        ids = tokenizer([texts[i] for i in part], add_special_tokens=False)["input_ids"]
        for i, row in zip(part, ids):
            keep[i] = len(row) <= max_tokens
    dropped = len(examples) - sum(keep)
    if dropped and warn:
        print(
            f"[sppo-rl] warning: {where}: skipped {dropped} of {len(examples)} prompt(s) longer than "
            f"{max_tokens} tokens{f' ({why})' if why else ''}",
            file=sys.stderr,
        )
    return [e for e, k in zip(examples, keep) if k]
