"""The directives mosquitto 2.0 reads, in its order, each tied to the listener it belongs to.

mosquitto reads its main file and, where that says ``include_dir``, every ``*.conf`` file of the
directory (sorted case-insensitively first). Inside each file a listener setting belongs to the
last ``listener`` line of that same file, and before any to the default listener: the context
does not carry over from one file to the next (mosquitto 2.0.11, src/conf.c and
src/conf_includedir.c). The installer's marks are taken out before anything is read, so a plan
is always made from the operator's own configuration.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

__all__ = [
    "BLOCK_BEGIN",
    "BLOCK_END",
    "MOVED",
    "ConfError",
    "Directive",
    "Tree",
    "include_order",
    "parse",
    "restored",
]

BLOCK_BEGIN = "# BEGIN tesla-gateway"  # lines the installer added, up to BLOCK_END
BLOCK_END = "# END tesla-gateway"
MOVED = "#tesla-gateway# "  # a line of the operator's the installer commented out


class ConfError(Exception):
    """A file mosquitto reads cannot be read here."""


@dataclass(frozen=True)
class Directive:
    """One setting: where it is, and the listener context it lands in."""

    path: str  # the file as the broker's machine names it
    index: int  # line number in that file, from 0
    key: str
    value: str  # the rest of the line, trimmed
    listener: int | None  # which `listener` line of this file it follows (from 0); None: before
    lost: bool = False  # a listener setting that reaches no listener (see Tree.directives)

    @property
    def context(self) -> tuple[str, int | None]:
        return (self.path, self.listener)


def restored(text: str) -> str:
    """``text`` without the installer's blocks, with the lines it commented out put back."""
    kept: list[str] = []
    inside = False
    for line in text.splitlines(keepends=True):
        if line.startswith(BLOCK_BEGIN):
            inside = True
        elif inside:
            inside = not line.startswith(BLOCK_END)
        elif line.startswith(MOVED):
            kept.append(line[len(MOVED) :])
        else:
            kept.append(line)
    return "".join(kept)


def parse(path: str, text: str) -> list[Directive]:
    """The directives of one file, as mosquitto splits them (a comment starts in column 0)."""
    directives: list[Directive] = []
    listener: int | None = None
    for index, line in enumerate(text.splitlines()):
        if not line or line[0] == "#":
            continue
        key, _, value = line.strip(" ").partition(" ")
        if not key:
            continue
        if key == "listener":
            listener = 0 if listener is None else listener + 1
        directives.append(Directive(path, index, key, value.strip(), listener))
    return directives


def include_order(names: Iterable[str]) -> list[str]:
    """mosquitto's order for an include_dir: case-insensitive, then upper before lower case."""

    def key(name: str) -> list[tuple[int, int]]:
        return [(b - 32 if 97 <= b <= 122 else b, b) for b in name.encode()]

    return sorted(names, key=key)


@dataclass(frozen=True)
class Tree:
    """The configuration files of one machine, read from ``root``; ``texts`` stands in for a
    file (a planned version), ``hidden`` files are not read (the installer's own)."""

    root: Path
    main: str = "/etc/mosquitto/mosquitto.conf"
    texts: Mapping[str, str] = field(default_factory=dict)
    hidden: frozenset[str] = frozenset()

    def disk(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def text(self, path: str) -> str | None:
        """The file's text with the installer's marks taken out; None if it does not exist."""
        if path in self.hidden:
            return None
        if path in self.texts:
            return self.texts[path]
        try:
            return restored(self.disk(path).read_text(encoding="utf-8"))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as error:  # mosquitto would not start on it either
            raise ConfError(f"cannot read {path} ({error.strerror}): run as root?") from error

    def listing(self, directory: str) -> list[str]:
        """The files mosquitto reads from an include_dir, in its order."""
        folder = self.disk(directory)
        names = {p.name for p in folder.iterdir()} if folder.is_dir() else set()
        prefix = directory.rstrip("/") + "/"
        names |= {p[len(prefix) :] for p in self.texts if p.startswith(prefix)}
        paths = [prefix + name for name in names if len(name) > 5 and name.endswith(".conf")]
        return include_order(p for p in paths if p not in self.hidden)

    def include_dirs(self) -> list[str]:
        text = self.text(self.main)
        directives = parse(self.main, text) if text is not None else []
        return [d.value for d in directives if d.key == "include_dir"]

    def files(self) -> list[str]:
        """Every file mosquitto reads, in order (the main file first, if there is one)."""
        text = self.text(self.main)
        if text is None:
            return []
        order = [self.main]
        for directive in parse(self.main, text):
            if directive.key == "include_dir":
                order += self.listing(directive.value)
        return order

    def directives(self) -> list[Directive]:
        """All directives in the order mosquitto reads them (include_dir only from the main
        file, its files read where the line stands).

        A listener's settings in the main file below an include_dir line whose files add
        listeners are ``lost``: mosquitto 2.0 keeps a pointer into its listener array across
        the included files, and adding listeners may move that array."""
        text = self.text(self.main)
        if text is None:
            return []
        result: list[Directive] = []
        spans = False  # the current listener of the main file reaches past a moving include
        for parsed in parse(self.main, text):
            directive = parsed
            if directive.key == "listener":
                spans = False
            elif spans and directive.listener is not None:
                directive = replace(parsed, lost=True)
            result.append(directive)
            if directive.key == "include_dir":
                included: list[Directive] = []
                for path in self.listing(directive.value):
                    included += parse(path, self.text(path) or "")
                result += included
                adds = any(d.key == "listener" for d in included)
                spans = spans or (directive.listener is not None and adds)
        return result
