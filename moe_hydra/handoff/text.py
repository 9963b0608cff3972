"""The hand-off's text: the command export prints and ingest reads back.

What export prints (``python -m moe_hydra.export megatron-lm DIR``)::

    # moe_hydra: model=qwen3_30b_a3b hardware=h100_sxm expert_mesh=ep16 dispatcher=deepep
    torchrun --nnodes=2 --nproc-per-node=8 pretrain_gpt.py \\
        --tensor-model-parallel-size 1 \\
        ...
        --mock-data

The first line carries what no flag can: the moe_hydra overrides of the run that the flags below do not set (the
model and hardware presets by name, the other group choices, the measurement window, ...). Then the launcher line,
then one flag per line. Values that the shell would read otherwise are single-quoted.

Ingest reads the same text from a file, or as words on its command line, including the words the shell makes of
``$(cat FILE)`` (no quotes removed, no line breaks, ``#`` and ``\\`` kept as words): the comment's words run up to the
first word that is not an override, continuation backslashes are dropped, and words that still carry the quotes of
the printed text are split again as the shell would have.

Pure: standard library only.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

MARK = "moe_hydra:"
# a moe_hydra override (group=option, key.path=value, +key=..., ~key): what the comment line holds
_OVERRIDE = re.compile(r"^(~[a-z_][\w./@-]*(=.*)?|\+{0,2}[a-z_][\w./@-]*=.*)$", re.DOTALL)
_ENV = re.compile(r"^[A-Z_][A-Z0-9_]*=")
LAUNCHERS = ("torchrun", "python", "python3", "srun", "uv")


@dataclass
class Command:
    """A command split into its parts: the ``# moe_hydra:`` overrides (``None`` when the command has no such line),
    the launcher's words, the script, and the words after it."""

    header: list[str] | None
    launcher: list[str] = field(default_factory=list)
    script: str | None = None
    args: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=list)


def _unquote(words: list[str]) -> list[str]:
    """Words that still carry the printed text's quotes (``$(cat FILE)``) read as the shell would have: a word
    quoted whole loses its quotes; anything else quoted is split again (the printed text has no spaces in words)."""
    if not any("'" in w or '"' in w for w in words):
        return words
    out = []
    for w in words:
        if len(w) >= 2 and w[0] == w[-1] and w[0] in "'\"" and w[0] not in w[1:-1] and (
                w[0] == "'" or not any(c in w[1:-1] for c in '$`\\')):
            out.append(w[1:-1])
        elif "'" in w or '"' in w:
            try:
                return shlex.split(" ".join(words), comments=False)
            except ValueError:
                return words
        else:
            out.append(w)
    return out


def from_text(text: str) -> Command:
    """A command as a file holds it: the comment line, then the command (shell quoting, ``\\`` continuations)."""
    header, body = None, []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            rest = stripped.lstrip("#").strip()
            if rest.startswith(MARK):
                header = (header or []) + shlex.split(rest[len(MARK):])
            continue
        body.append(line)
    words = shlex.split(re.sub(r"\\[ \t]*\n", " ", "\n".join(body)), comments=True)
    return _split(header, words)


def from_words(words: list[str]) -> Command:
    """A command as words on a command line (possibly the shell's split of the printed text)."""
    words = _unquote([w for w in words if w != "\\"])
    while words and words[0].startswith("#") and words[:2] != ["#", MARK] and words[0] != "#" + MARK:
        # another comment line first (the layout search's "# rank 1 ..."): up to the next comment or the launcher
        words.pop(0)
        while words and not words[0].startswith("#") and words[0] not in LAUNCHERS:
            words.pop(0)
    header = None
    if words[:2] == ["#", MARK] or words[:1] == ["#" + MARK]:
        words = words[2:] if words[0] == "#" else words[1:]
        header = []
        while words and _OVERRIDE.match(words[0]):
            header.append(words.pop(0))
    return _split(header, words)


def _split(header: list[str] | None, words: list[str]) -> Command:
    words = [w for w in words if w != "\\"]
    cmd = Command(header)
    while words and _ENV.match(words[0]):
        cmd.env.append(words.pop(0))
    script = next((i for i, w in enumerate(words) if w.endswith(".py") and not w.startswith("-")), None)
    if script is not None:
        cmd.launcher, cmd.script, cmd.args = words[:script], words[script], words[script + 1:]
    elif words and words[0] in LAUNCHERS:
        raise ValueError(f"{words[0]} without a script: expected pretrain_gpt.py (or run_recipe.py) after its options")
    else:
        cmd.args = words
    return cmd


def parse_flags(words: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """``--flag v ...`` and ``--flag=v`` words as ``{flag: [values]}`` (a later occurrence replaces an earlier one,
    as argparse does), and the words that belong to no flag."""
    out: dict[str, list[str]] = {}
    stray: list[str] = []
    current = None
    for w in words:
        if w.startswith("--") and len(w) > 2:
            name, eq, v = w.partition("=")
            out[name] = [v] if eq else []
            current = None if eq else name
        elif current is not None:
            out[current].append(w)
        else:
            stray.append(w)
    return out, stray


def quote(word: str) -> str:
    """``word`` as one shell word: bare when it can be, else in single quotes, else (a Hydra override holding a
    quoted value) in double quotes where the shell would change nothing inside them."""
    q = shlex.quote(word)
    if q == word or "'" not in word:
        return q
    if not any(c in word for c in '$`"\\!'):
        return f'"{word}"'
    return q


def render(header: list[str], launcher: list[str], lines: list[list[str]], env: dict[str, str] | None = None,
           indent: str = "    ") -> str:
    """The comment line, the environment (``NAME=value ... \\``), the launcher line and one flag (or override) per
    line, continued with backslashes."""
    out = [f"# {MARK} " + " ".join(quote(h) for h in header) if header else f"# {MARK}"]
    if env:
        out.append(" ".join(f"{k}={shlex.quote(str(v))}" for k, v in env.items()) + " \\")
    body = [" ".join(quote(w) for w in line) for line in lines]
    out.append(" ".join(quote(w) for w in launcher) + (" \\" if body else ""))
    out += [indent + b + (" \\" if i < len(body) - 1 else "") for i, b in enumerate(body)]
    return "\n".join(out) + "\n"
