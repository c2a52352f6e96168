"""
The docs' shell walk-throughs as data: each ``sh`` block of a section of a page (README.md or a
page under docs/), with the host it runs on (its first line, ``# on <host>: ...``,
``# on <host>, <host>: ...`` for the same script on each in turn, or ``# on every host: ...``),
so that the tests run exactly what the docs print.
"""

import dataclasses
import pathlib
import re

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
_BLOCK = re.compile(r"^```sh\n(.*?)^```$", re.S | re.M)
_ON = re.compile(r"^# on (every host|[A-Za-z0-9_.-]+(?:, [A-Za-z0-9_.-]+)*)(?=:)")


@dataclasses.dataclass
class Block:
    host: str  # a host name, names joined by ", ", or "every host"
    script: str

    @property
    def hosts(self):
        """
        The hosts the block runs on, in order (``["every host"]`` for the bootstrap block).
        """
        return self.host.split(", ")


def section(title, page="README.md"):
    """
    The text of the section ``## <title>`` of ``page`` (a path relative to the repository root)
    up to the next ``## `` heading.
    """
    text = (REPO_ROOT / page).read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def blocks(title, page="README.md"):
    """
    The ``sh`` blocks of that section, in order; a block that names no host is an error.
    """
    found = []
    for match in _BLOCK.finditer(section(title, page)):
        script = match.group(1)
        on = _ON.match(script)
        if not on:
            raise ValueError(f"{page} {title!r}: a sh block does not start with '# on <host>'")
        found.append(Block(on.group(1), script))
    return found
