"""The commands a batch script runs under ``cellsched-launch``, as written.

Read from the script's text only: nothing is run and no variable is
expanded. A line (with its ``\\`` continuations) that runs
``cellsched-launch`` gives the command after the launcher's ``--`` (or after
its options), up to the first shell operator (``;``, ``&&``, ``|``, ...) or comment.
``"$@"`` and ``$*`` stand for the script's own arguments (those given to
``cellsched sbatch`` after the script); any other word that holds a ``$``
or a backquote is kept as written and marked unreadable (`Word.readable`).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

LAUNCHER = "cellsched-launch"
#: the script's own arguments, as a command line names them
_ALL_ARGS = frozenset({"$@", "${@}", "$*", "${*}"})
_OPERATORS = frozenset({";", ";;", "&", "&&", "|", "||", "|&", "(", ")", "<", ">", ">>", "<<", "<&", ">&"})


@dataclass(frozen=True)
class Word:
    """One word of a launched command and where it was written."""

    text: str
    where: str  #: "script line N" or "script argument N"

    @property
    def readable(self) -> bool:
        """False when the word holds a shell expansion the wrapper does not do."""
        return "$" not in self.text and "`" not in self.text


def logical_lines(text: str) -> Iterator[list[tuple[int, str]]]:
    """The lines of TEXT as the shell joins them (a backslash-newline
    continues one): each a list of (line number, its text without the backslash)."""
    parts: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.endswith("\\") and not line.endswith("\\\\"):
            parts.append((number, line[:-1]))
            continue
        parts.append((number, line))
        yield parts
        parts = []
    if parts:
        yield parts


def _located(parts: list[tuple[int, str]]) -> list[tuple[str, int]] | None:
    """The words of one joined line, each with the line it is written on (a
    quote open across a continuation: all on the first); None when it does not split."""
    located: list[tuple[str, int]] = []
    for number, part in parts:
        words = _words(part)
        if words is None:
            joined = _words(" ".join(p for _, p in parts))
            return None if joined is None else [(w, parts[0][0]) for w in joined]
        located += [(w, number) for w in words]
    return located


def _words(line: str) -> list[str] | None:
    """The shell words of LINE, operators apart; None when it does not split (open quotes)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""  # a comment starts a word, not inside one: `launched_commands` stops at it
    try:
        return list(lexer)
    except ValueError:
        return None


def launched_commands(text: str, script_args: Sequence[str] = ()) -> list[list[Word]]:
    """The command of every line of the script TEXT that runs cellsched-launch
    (module doc), in script order; `script_args` replace ``"$@"``."""
    out: list[list[Word]] = []
    for parts in logical_lines(text):
        first_text = parts[0][1].lstrip()
        if first_text.startswith("#") or not any(LAUNCHER in p for _, p in parts):
            continue
        words = _located(parts)
        at = next((i for i, (w, _) in enumerate(words or ()) if os.path.basename(w) == LAUNCHER), None)
        if words is None or at is None:
            continue
        rest = words[at + 1 :]
        while rest and rest[0][0].startswith("-"):  # the launcher's options end at "--" or the command
            rest, first = rest[1:], rest[0][0]
            if first == "--":
                break
        cmd: list[Word] = []
        for w, number in rest:
            if w in _OPERATORS or w.startswith("#"):
                break
            if w in _ALL_ARGS:
                cmd += [Word(a, f"script argument {i}") for i, a in enumerate(script_args, start=1)]
            else:
                cmd.append(Word(w, f"script line {number}"))
        if cmd:
            out.append(cmd)
    return out


def option_value(cmd: Sequence[Word], *names: str) -> tuple[str, Word] | None:
    """(option name, value word) of the last of NAMES that CMD sets (``--name
    value`` or ``--name=value``; the last one wins, as argparse reads it)."""
    found = None
    for i, w in enumerate(cmd):
        for name in names:
            if w.text == name and i + 1 < len(cmd):
                found = (name, cmd[i + 1])
            elif w.text.startswith(name + "="):
                found = (name, Word(w.text[len(name) + 1 :], w.where))
    return found


def has_flag(cmd: Sequence[Word], name: str) -> bool:
    return any(w.text == name for w in cmd)
