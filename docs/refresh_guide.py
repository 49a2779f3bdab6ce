"""Rerun every example in docs/guide.md and paste its real output back in.

    python docs/refresh_guide.py            # rewrite docs/guide.md in place
    python docs/refresh_guide.py --check    # exit 1 if an example fails (nothing written)

The examples run in order, in one scratch folder, so later ones can use the files earlier ones
wrote:

- a ```python block whose first line is ``# file: NAME`` is written to NAME and not run;
- any other ```python block runs as a script; a ```text block right after it gets its output;
- in a ```console block, each ``$ command`` line runs in a shell and its output follows it.

Paths of the scratch folder are printed as ``.``. A command that exits non-zero keeps its
output and gets an ``[exit N]`` line, which the guide may mean to show (exit codes are part of
the interface); `--check` reports the examples that fail unexpectedly (exit 4, a traceback).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

GUIDE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "guide.md")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)
TIMEOUT = 600


def _run(cmd: list[str] | str, cwd: str, shell: bool = False) -> tuple[str, int]:
    env = dict(os.environ, COLUMNS="120", NO_COLOR="1", TERM="dumb")
    p = subprocess.run(cmd, cwd=cwd, shell=shell, capture_output=True, text=True, env=env,
                       timeout=TIMEOUT)
    out = (p.stdout + p.stderr).replace(cwd + os.sep, "./").replace(cwd, ".")
    out = "\n".join(line.rstrip() for line in out.splitlines())
    return out, p.returncode


def _console(body: str, cwd: str, problems: list[str]) -> str:
    out = []
    for line in body.splitlines():
        if not line.startswith("$ "):
            continue  # an old output line
        cmd = line[2:]
        text, rc = _run(cmd, cwd, shell=True)
        out.append(line)
        if text:
            out.append(text)
        if rc:
            out.append(f"[exit {rc}]")
        if rc == 4 or "Traceback (most recent call last)" in text:
            problems.append(f"{cmd}: exit {rc}\n{text[-2000:]}")
    return "\n".join(out) + "\n"


def refresh(text: str, cwd: str, problems: list[str]) -> str:
    """`text` with every example's output replaced by what it prints now."""
    pieces, pos, last_output = [], 0, None
    blocks = list(FENCE.finditer(text))
    for i, m in enumerate(blocks):
        lang, body = m.group(1), m.group(2)
        gap = text[pos:m.start()]
        pieces.append(gap)
        pos = m.end()
        if lang == "python" and body.startswith("# file: "):
            name = body.splitlines()[0][len("# file: "):].strip()
            with open(os.path.join(cwd, name), "w", encoding="utf-8") as f:
                f.write(body)
            last_output = None
        elif lang == "python":
            script = os.path.join(cwd, f"_example_{i}.py")
            with open(script, "w", encoding="utf-8") as f:
                f.write(body)
            last_output, rc = _run([sys.executable, script], cwd)
            if rc:
                problems.append(f"python block {i}: exit {rc}\n{last_output[-2000:]}")
        elif lang == "console":
            body = _console(body, cwd, problems)
            last_output = None
        elif lang != "text":
            last_output = None
        elif lang == "text" and last_output is not None and not gap.strip():
            body = last_output + "\n" if last_output else "(no output)\n"
            last_output = None
        pieces.append(f"```{lang}\n{body}```\n")
    pieces.append(text[pos:])
    return "".join(pieces)


def main(argv: list[str]) -> int:
    """Refresh the guide (or, with --check, only report failing examples)."""
    with open(GUIDE, encoding="utf-8") as f:
        text = f.read()
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="opwarden_guide_") as cwd:
        new = refresh(text, os.path.realpath(cwd), problems)
    for p in problems:
        print(p, file=sys.stderr)
    if "--check" in argv:
        return 1 if problems else 0
    with open(GUIDE, "w", encoding="utf-8") as f:
        f.write(new)
    print(f"{GUIDE}: refreshed; {len(problems)} example(s) failed", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
