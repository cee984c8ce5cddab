"""`python -m elastic.config`: the config reference on the command line.

    python -m elastic.config --help                 usage, then every field as plain text
    python -m elastic.config reference              docs/config.md's Markdown on stdout
    python -m elastic.config reference --write      regenerate docs/config.md
    python -m elastic.config reference --check      exit 1 when docs/config.md is out of date
"""

from __future__ import annotations

import argparse
import sys

from elastic.config import reference


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m elastic.config",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="The config reference, generated from elastic/config/schema.py: every field of every "
                    "section, its type, default and comment. Jobs take these as YAML (--config FILE) and "
                    "--set key.sub=value.",
        epilog="fields (key: type = default, then the schema's comment):\n\n" + reference.render_text())
    sub = ap.add_subparsers(dest="cmd")
    ref = sub.add_parser("reference", help="print the reference as Markdown (docs/config.md)")
    ref.add_argument("--write", nargs="?", const=reference.DEFAULT_PAGE, metavar="PATH",
                     help=f"write it to PATH (default {reference.DEFAULT_PAGE})")
    ref.add_argument("--check", nargs="?", const=reference.DEFAULT_PAGE, metavar="PATH",
                     help="exit 1 when PATH (default docs/config.md) differs from the schema")
    ref.add_argument("--undocumented", action="store_true", help="list the fields that have no comment in the schema")
    args = ap.parse_args(argv)
    if args.cmd != "reference":
        ap.print_help()
        return 0
    if args.undocumented:
        keys = reference.undocumented()
        print("\n".join(keys))
        print(f"{len(keys)} of {len(reference.all_fields())} fields have no comment", file=sys.stderr)
        return 0
    if args.check:
        if reference.page_is_current(args.check):
            return 0
        print(f"{args.check} is out of date with elastic/config/schema.py; run: {reference.REGENERATE}", file=sys.stderr)
        return 1
    text = reference.render_markdown()
    if args.write:
        with open(args.write, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {args.write} ({len(reference.all_fields())} fields)", file=sys.stderr)
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
