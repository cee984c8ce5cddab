"""Pretrain a Llama-style model on Ray: `python jobs/pretrain.py [--config FILE] [--set key.sub=value ...]`.

Works locally (starts a local Ray when none is running) and unchanged under
`ray job submit --working-dir . -- python jobs/pretrain.py ...`. With no --config it runs the
embedded default: the `tiny` model on the Python standard library's sources.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from elastic.config import ConfigError, load_config  # noqa: E402
from elastic.data import DataError  # noqa: E402


def main(argv=None, kind: str = "pretrain", default_config: str = "", doc: str = "") -> int:
    """The command line of the language-modelling jobs (pretrain, SFT)."""
    ap = argparse.ArgumentParser(description=(doc or __doc__).splitlines()[0])
    ap.add_argument("--config", help=f"YAML config (default: {default_config or 'the embedded tiny/stdlib default'})")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config value, e.g. --set train.steps=20 (repeatable)")
    args = ap.parse_args(argv)
    try:
        cfg = load_config(args.config or default_config or None, args.overrides)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    from elastic.launch.pretrain import run_paths, run_pretraining

    paths = run_paths(cfg)
    print(f"[elastic] run directory: {paths.run_dir}")
    try:
        res = run_pretraining(cfg, kind)
    except DataError as e:
        print(f"data error: {e}", file=sys.stderr)
        return 2
    s = res.summary
    if res.stopped:
        print(f"[elastic] run stopped at its own request: {res.stopped}", file=sys.stderr)
        print(f"[elastic] last good checkpoint: {res.checkpoint}", file=sys.stderr)
        return 3
    print(f"[elastic] done in {res.wall_s:.0f}s: loss {s.get('first_loss', float('nan')):.3f} -> {s.get('last_loss', float('nan')):.3f}, "
          f"{s.get('tokens_per_s', 0):.0f} tokens/s")
    print(f"[elastic] checkpoints: {res.run_dir}  (latest: {res.checkpoint})")
    print(f"[elastic] metrics:     {os.path.join(res.records_dir or res.local_dir, 'metrics.jsonl')}")
    print(f"[elastic] summary:     {os.path.join(res.local_dir, 'summary.json')}")
    print(f"[elastic] events:      {os.path.join(res.records_dir or res.local_dir, 'events.jsonl')}")
    print(f"[elastic] logs:        {res.ray_logs} (worker output is also streamed above)")
    if s.get("restarts"):
        from elastic.launch.recovery import analyze, format_table

        print(format_table(analyze(res.records_dir or res.local_dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
