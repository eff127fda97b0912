"""``supervise submit --script job.sbatch``: adopt an existing batch script. Pure (text in, text out).

A team's script keeps working as it is: its ``#SBATCH`` lines are kept (those naming a flag the supervisor owns
are refused with the one-line fix ``submit`` gives), its set-up lines (``module load``, ``source venv``,
``export``, ``cd``) still run first in the batch step, and its one ``srun`` line is wrapped: the supervisor runs
there instead (``python -m supervisor.cli run --campaign DIR``, as the shell's child: ``batchwrap``), and the command after srun's options
becomes the campaign's training command, stored as data in ``campaign.json`` like every submit's.

Because the command is data, the srun line must be a plain command: no ``$`` expansion, backticks, pipes,
redirections or ``;``/``&&`` there (a one-line error says so; set such values in an earlier line's environment,
which the ranks inherit). srun's own options on that line go to the training step's srun (``run.srun_args``),
except the layout (``-N``/``-n``/``--ntasks-per-node``: the allocation's, so they must repeat the ``#SBATCH``
value) and the ones the supervisor sets itself (``--label``, ``--job-name``, ...), which are refused with a fix.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from supervisor.errors import UsageError

_SBATCH = re.compile(r"^#SBATCH\s+(.*)$")
# srun options that take their value as the next word when written without "=".
_SRUN_VALUE_SHORT = frozenset("-A -B -c -C -d -D -e -G -i -J -L -m -n -N -o -p -q -t -w -x".split())
_SRUN_VALUE_LONG = frozenset(
    "--account --nodes --ntasks --ntasks-per-node --cpus-per-task --cpus-per-gpu --gpus --gpus-per-node "
    "--gpus-per-task --gpu-bind --mem --mem-per-cpu --mem-per-gpu --time --partition --qos --job-name "
    "--output --error --input --nodelist --exclude --constraint --distribution --cpu-bind --mpi --chdir "
    "--export --gres --reservation --hint --mem-bind --network --nice --propagate --threads-per-core "
    "--ntasks-per-core --ntasks-per-socket --ntasks-per-gpu --sockets-per-node --cores-per-socket --wckey".split()
)
_SRUN_FLAG_LONG = frozenset(  # srun options that never take a value as the next word
    "--label --exclusive --overlap --unbuffered --kill-on-bad-exit --quiet --verbose --no-kill --overcommit "
    "--spread-job --whole --disable-status --exact --multi-prog --pty --wait-all-nodes --oversubscribe "
    "--contiguous --no-allocate --preserve-env --test-only --help --usage --version".split()
)
LAYOUT = {"-N": "--nodes", "--nodes": "--nodes", "-n": "--ntasks", "--ntasks": "--ntasks",
          "--ntasks-per-node": "--ntasks-per-node"}  # fmt: skip
SRUN_OWNED = {
    "--label": "the supervisor labels every line itself", "-l": "the supervisor labels every line itself",
    "--job-name": "the supervisor names its steps", "-J": "the supervisor names its steps",
    "--kill-on-bad-exit": "the supervisor sets it", "-K": "the supervisor sets it",
    "--overlap": "the supervisor sets it", "--output": "step output goes to CAMPAIGN/logs/",
    "-o": "step output goes to CAMPAIGN/logs/", "--error": "step output goes to CAMPAIGN/logs/",
    "-e": "step output goes to CAMPAIGN/logs/", "--nodelist": "the supervisor picks the step's nodes",
    "-w": "the supervisor picks the step's nodes", "--exclude": "the supervisor excludes blamed nodes",
    "-x": "the supervisor excludes blamed nodes",
}  # fmt: skip


@dataclass(frozen=True)
class Script:
    """An adopted batch script: its directives' words, the srun line's options and command, and the text."""

    sbatch_flags: tuple[str, ...]  # the words of its #SBATCH lines, in order
    srun_args: tuple[str, ...]  # srun options kept for the training step
    command: tuple[str, ...]  # what srun ran: the training command
    shebang: str
    directive_lines: tuple[str, ...]  # the #SBATCH lines, verbatim
    before: tuple[str, ...]  # body lines before the srun line, verbatim
    srun_line: int  # 1-based line number of the srun line in the user's script


def parse(text: str, name: str = "the script") -> Script:
    """Split a batch script into what the supervisor keeps and what it wraps; UsageError on anything it cannot
    adopt faithfully. Lines end at ``\n`` only, as bash and sbatch read them (``str.splitlines`` also breaks at
    ``\r``, ``\x0b``, ``\x0c``, ``\u2028``..., which would read a line differently than bash runs it)."""
    if "\r\n" in text:
        raise UsageError(f"{name} has DOS line breaks (\\r\\n), which sbatch refuses",
                         f"convert it to Unix line breaks: dos2unix {name}")  # fmt: skip
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    shebang = lines[0] if lines and lines[0].startswith("#!") else "#!/bin/bash"
    start = 1 if lines and lines[0].startswith("#!") else 0
    directives: list[str] = []
    flags: list[str] = []
    body_at = len(lines)
    for i in range(start, len(lines)):
        stripped = lines[i].strip()
        m = _SBATCH.match(stripped)
        if m is not None:
            directives.append(lines[i])
            try:
                flags += shlex.split(m.group(1), comments=True)
            except ValueError as err:
                raise UsageError(f"{name} line {i + 1}: cannot read the #SBATCH line ({err})",
                                 "quote it as sbatch would read it") from None  # fmt: skip
            continue
        if stripped and not stripped.startswith("#"):
            body_at = i  # sbatch reads no #SBATCH line after the first command
            break
    logical = _logical_lines(lines, body_at)
    sruns = [(n, words) for n, raw, words in logical if _srun_words(raw, words, name, n) is not None]
    if len(sruns) != 1:
        found = "no srun line" if not sruns else f"{len(sruns)} srun lines (lines {', '.join(str(n) for n, _ in sruns)})"
        raise UsageError(f"{name} has {found}; the supervisor needs exactly one: the training step",
                         "keep one `srun ... CMD` line (other steps can run before it without srun)")  # fmt: skip
    at, words = sruns[0]
    rest = [raw for n, raw, _ in logical if n > at and raw.strip() and not raw.strip().startswith("#")]
    if rest:
        raise UsageError(f"{name} has commands after its srun line (line {at}), which would never run",
                         "move them before the srun line, or drop them")  # fmt: skip
    options, command = _split_srun(words[words.index("srun") + 1 :], name, at)
    kept = _srun_options(options, flags, name, at)
    before = tuple(raw for n, raw, _ in logical if n < at)
    return Script(tuple(flags), tuple(kept), tuple(command), shebang, tuple(directives), before, at)


def render(script: Script, directives: Sequence[str], run_line: Sequence[str], header: Sequence[str]) -> str:
    """The supervisor's batch script: the user's shebang and #SBATCH lines, the supervisor's own directives and
    header, the user's set-up lines, and the supervisor in place of the srun line. ``directives``,
    ``run_line`` and ``header`` are the supervisor's (checked by the caller)."""
    out = [script.shebang, *script.directive_lines]
    out += [f"#SBATCH {d}" for d in directives]
    out += [f"# {line}" if line else "#" for line in header]
    out += list(script.before)
    out.append(f"# line {script.srun_line}, the training step: run by the supervisor (the command is in campaign.json)")
    from supervisor import batchwrap

    out += batchwrap.lines(run_line)
    return "\n".join(out) + "\n"


def _logical_lines(lines: Sequence[str], start: int) -> list[tuple[int, str, list[str]]]:
    """Body lines from ``start`` with backslash continuations joined: (1-based first line, raw text, words)."""
    out: list[tuple[int, str, list[str]]] = []
    i = start
    while i < len(lines):
        first, raw = i + 1, lines[i]
        while raw.endswith("\\") and i + 1 < len(lines):
            i += 1
            raw = raw[:-1] + " " + lines[i]
        try:
            words = shlex.split(raw, comments=True)
        except ValueError:
            words = []
        out.append((first, raw, words))
        i += 1
    return out


def _srun_words(raw: str, words: list[str], name: str, line: int) -> list[str] | None:
    """The words of an srun line (``srun ...`` or ``exec srun ...``), checked to be a plain command."""
    head = words[1:2] if words[:1] == ["exec"] else words[:1]
    if head != ["srun"]:
        if "srun" in raw.split():
            raise UsageError(f"{name} line {line}: srun is not the line's command ({raw.strip()[:60]!r})",
                             "write the training step as its own line: srun [options] CMD...")  # fmt: skip
        return None
    bad = _shell_syntax(raw)
    if bad:
        raise UsageError(f"{name} line {line}: the srun line uses shell syntax ({bad}), but the supervisor keeps "
                         "the training command as data", "write the values out, or export them in an earlier "
                         "line and read them from the environment in the program")  # fmt: skip
    return words


def _shell_syntax(raw: str) -> str:
    """The first shell construct that would make the srun line more than words: expansion, operators."""
    quote = ""
    i = 0
    while i < len(raw):
        ch = raw[i]
        if quote == "'":
            quote = "" if ch == "'" else quote
        elif ch == "\\" and quote != "'":
            i += 1
        elif quote == '"' and ch == '"':
            quote = ""
        elif ch in "$`":
            return f"{ch!r} expansion"
        elif not quote and ch in "'\"":
            quote = ch
        elif not quote and ch in ";&|<>()":
            return f"{ch!r}"
        elif not quote and ch == "#" and (i == 0 or raw[i - 1].isspace()):
            break  # a comment
        i += 1
    return ""


def _split_srun(words: Sequence[str], name: str, line: int) -> tuple[list[str], list[str]]:
    options: list[str] = []
    i = 0
    while i < len(words) and words[i].startswith("-"):
        word = words[i]
        takes = (word in _SRUN_VALUE_SHORT) or (word.startswith("--") and "=" not in word and word in _SRUN_VALUE_LONG)
        unknown = word not in _SRUN_VALUE_LONG and word not in _SRUN_FLAG_LONG
        if word.startswith("--") and "=" not in word and unknown and i + 1 < len(words) \
                and not words[i + 1].startswith("-"):  # fmt: skip
            raise UsageError(f"{name} line {line}: cannot tell whether srun's {word} takes {words[i + 1]!r}",
                             f"write {word}=VALUE (or put the command first)")  # fmt: skip
        options.append(word)
        if takes:
            if i + 1 >= len(words):
                raise UsageError(f"{name} line {line}: srun's {word} has no value", f"write {word}=VALUE")
            options.append(words[i + 1])
            i += 1
        i += 1
    command = list(words[i:])
    if not command:
        raise UsageError(f"{name} line {line}: the srun line has no command", "e.g. srun python train.py")
    return options, command


def _srun_options(options: Sequence[str], sbatch_flags: Sequence[str], name: str, line: int) -> list[str]:
    """srun's options for the training step: owned ones refused, layout ones checked against #SBATCH."""
    kept: list[str] = []
    i = 0
    while i < len(options):
        word = options[i]
        opt = word.split("=", 1)[0] if word.startswith("--") else word[:2]
        value = None
        if "=" in word and word.startswith("--"):
            value = word.split("=", 1)[1]
        elif not word.startswith("--") and len(word) > 2:
            value = word[2:]
        elif i + 1 < len(options) and (opt in _SRUN_VALUE_SHORT or opt in _SRUN_VALUE_LONG):
            value = options[i + 1]
            i += 1
        if opt in SRUN_OWNED:
            raise UsageError(f"{name} line {line}: srun's {opt} is the supervisor's ({SRUN_OWNED[opt]})",
                             f"drop {opt} from the srun line")  # fmt: skip
        if opt in LAYOUT:
            wanted = _sbatch_value(sbatch_flags, LAYOUT[opt])
            if wanted != value:
                raise UsageError(f"{name} line {line}: srun's {opt} {value} differs from the allocation's "
                                 f"({LAYOUT[opt]}={wanted or 'unset'}); the training step uses the allocation's "
                                 "layout", f"put #SBATCH {LAYOUT[opt]}={value} in the script and drop it from "
                                 "the srun line")  # fmt: skip
        else:
            kept.append(f"{opt}={value}" if value is not None and opt.startswith("--") else
                        f"{opt}{value}" if value is not None else word)  # fmt: skip
        i += 1
    return kept


def _sbatch_value(flags: Sequence[str], long: str) -> str | None:
    """The last value an sbatch flag list gives ``long`` (or its short form)."""
    short = {"--nodes": "-N", "--ntasks": "-n"}.get(long)
    found = None
    for i, word in enumerate(flags):
        if word.startswith(long + "="):
            found = word.split("=", 1)[1]
        elif word == long or (short and word == short):
            found = flags[i + 1] if i + 1 < len(flags) else None
        elif short and word.startswith(short) and len(word) > 2:
            found = word[2:]
    return found
