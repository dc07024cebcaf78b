"""Command line for install.sh and uninstall.sh: files in, files out, nothing changed here.

    python3 -m mosquitto_layout plan --root R --out DIR --passwd P --acl A --ca C --cert X --key K
    python3 -m mosquitto_layout restore --root R --out DIR

Both write into DIR ``edits`` (one "target<TAB>new content file" line per operator file that
changes) and the files it names; ``plan`` also ``own.conf`` (the installer's conf.d file),
``ports`` ("<its path> <loopback port> <TLS port>"), ``marked`` (the operator's files that
carry the installer's marks, one a line) and ``access`` (who can connect, before and after).
A configuration the installer cannot keep as it was exits 1 with the reason.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mosquitto_layout.access import Files, table
from mosquitto_layout.conf import ConfError, restored
from mosquitto_layout.plan import GatewayFiles, legacy_edits, make_plan, restore_edits

IF_INET6 = Path("/proc/net/if_inet6")
LOOPBACK6 = "0" * 31 + "1"


def _has_ipv6_loopback() -> bool:
    """Whether ::1 exists here (mosquitto's local only mode opens it only then)."""
    try:
        return any(line.startswith(LOOPBACK6) for line in IF_INET6.read_text().splitlines())
    except OSError:
        return False


def _legacy(path: Path | None) -> list[tuple[str, str]]:
    if path is None or not path.is_file():
        return []
    pairs = (line.split(maxsplit=1) for line in path.read_text(encoding="utf-8").splitlines())
    return [(pair[0], pair[1]) for pair in pairs if len(pair) == 2]


def _write_edits(out: Path, edits: dict[str, str]) -> None:
    lines = []
    for number, (target, text) in enumerate(sorted(edits.items())):
        source = out / f"edit-{number}"
        source.write_text(text, encoding="utf-8")
        lines.append(f"{target}\t{source}\n")
    (out / "edits").write_text("".join(lines), encoding="utf-8")


def _arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mosquitto_layout", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("plan", "restore"):
        command = commands.add_parser(name)
        command.add_argument("--root", type=Path, required=True)
        command.add_argument("--out", type=Path, required=True)
        command.add_argument("--legacy", type=Path, help="/etc/tesla-gateway/mqtt-shared")
        command.add_argument("--user", action="append", default=[], help="the gateway's users")
    plan = commands.choices["plan"]
    for name in ("passwd", "acl", "ca", "cert", "key"):
        plan.add_argument(f"--{name}", required=True)
    plan.add_argument("--ipv6", choices=("auto", "yes", "no"), default="auto")
    plan.add_argument("--owned", action="store_true", help="install.sh installed mosquitto")
    plan.add_argument("--acl-text", type=Path, help="the gateway's ACL as it will be written")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = _arguments(argv)
    root: Path = args.root
    out: Path = args.out
    try:
        legacy = legacy_edits(root, users=args.user, legacy=_legacy(args.legacy))
        if args.command == "restore":
            _write_edits(out, {**legacy, **restore_edits(root)})
            return 0
        files = GatewayFiles(args.passwd, args.acl, args.ca, args.cert, args.key)
        ipv6 = _has_ipv6_loopback() if args.ipv6 == "auto" else args.ipv6 == "yes"
        plan = make_plan(root, files, ipv6=ipv6, owned=args.owned)
    except ConfError as error:
        print(f"mosquitto_layout: {error}", file=sys.stderr)
        return 1
    legacy = {path: text for path, text in legacy.items() if path not in plan.texts}
    _write_edits(out, {**legacy, **plan.edits})
    marked = [path for path, text in sorted(plan.texts.items()) if restored(text) != text]
    (out / "marked").write_text("".join(f"{path}\n" for path in marked), encoding="utf-8")
    (out / "own.conf").write_text(plan.own_text, encoding="utf-8")
    (out / "ports").write_text(f"{plan.own_path} {plan.plain_port} {plan.tls_port}\n")
    pending = {files.passwd: "".join(f"{user}:\n" for user in args.user)}
    if args.acl_text is not None:
        pending[files.acl] = args.acl_text.read_text(encoding="utf-8")
    access = [
        "who can connect to mosquitto, before:",
        *table(Files(root, {}), plan.before),
        "and after (every listener of before unchanged, the gateway's added):",
        *table(Files(root, pending), plan.after, plan.ours),
    ]
    (out / "access").write_text("\n".join(access) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
