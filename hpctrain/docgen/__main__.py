"""python -m hpctrain.docgen DIR [--check]: write the reference pages into DIR, or (--check) exit 1
naming each page that differs from what the code generates now."""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from hpctrain.docgen.pages import generated


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpctrain.docgen", description=__doc__)
    ap.add_argument("dir", type=Path, help="where the pages go (docs/reference)")
    ap.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    args = ap.parse_args(argv)
    stale = 0
    for name, text in generated().items():
        path = args.dir / name
        old = path.read_text() if path.is_file() else ""
        if old == text:
            continue
        if args.check:
            stale += 1
            diff = difflib.unified_diff(
                old.splitlines(), text.splitlines(), str(path), "generated", lineterm=""
            )
            print("\n".join(list(diff)[:40]), file=sys.stderr)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(
            f"{stale} reference page(s) differ from the code: regenerate them with "
            f"python -m hpctrain.docgen {args.dir}",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
