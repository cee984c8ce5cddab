"""Curate raw documents into Parquet for pretraining: `python jobs/curate.py [--config FILE] [--set curate.key=value ...]`.

Language ID, Gopher / C4 / FineWeb quality rules, word-list toxicity, PII redaction, exact and
MinHash near-duplicate removal, on Ray Data (docs/curate.md). With no --config it curates the
embedded default: the docstrings of the Python standard library's modules (English prose, no
download) into runs/curated. The output's data/ directory is a `data.source` for
jobs/pretrain.py (format parquet, text_field text).
Rerunning with the same config resumes: finished blocks are not redone.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from elastic.config import ConfigError, load_config  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", help="YAML config with a `curate` section (default: the embedded stdlib-docstrings default)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config value, e.g. --set curate.workers=4 (repeatable)")
    args = ap.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        from elastic.data.curate import check_curate_config

        check_curate_config(cfg.curate)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    from elastic.launch.curate import run_curation
    from jobs.pretrain import run_or_exit_code

    res, code = run_or_exit_code(run_curation, cfg.curate)
    if res is None:
        return code
    r = res.report
    print(f"[curate] done in {res.wall_s:.0f}s: {r['docs_in']:,} -> {r['docs_out']:,} documents "
          f"({r['bytes_in'] / 1e6:.1f} -> {r['bytes_out'] / 1e6:.1f} MB), {r['docs_per_s']:.0f} docs/s")
    if r["removed_by_stage"]:
        print("[curate] removed: " + ", ".join(f"{k} {v:,}" for k, v in r["removed_by_stage"].items()))
    pii = {k: v for k, v in r["pii_redactions"].items() if v and k != "docs"}
    if pii:
        print("[curate] PII redacted: " + ", ".join(f"{k} {v:,}" for k, v in sorted(pii.items())))
    bad = r["bad_rows"]
    if bad.get("counts"):
        print(f"[curate] skipped {sum(bad['counts'].values())} bad rows; first: {'; '.join(bad['examples'][:3])}")
    print(f"[curate] data:    {res.data_dir}  (data.source, data.format parquet)")
    print(f"[curate] report:  {res.report_path}")
    print(f"[curate] funnel:  {res.funnel_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
