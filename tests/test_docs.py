"""The documentation holds: every command shown in a ```bash block of README.md or docs/*.md is
either run by a named existing test (REGISTRY), run here (DIRECT: cheap ones), or marked with a
`# needs: <what>` comment (a GPU, a Kubernetes cluster, ...); every relative link resolves, to a
file and, for Markdown targets, to an anchor; README's Quickstart is the line CI runs.

A command's key is its program: `jobs/sft.py`, `-m elastic.report`, `bench/gpu_check.py`,
`scripts/local_cluster.sh`, `ray job submit`, ... A marker comment applies to the commands after
it in its block (`# needs: gpu` on its own line), or to its own line (`cmd ...  # needs: gpu`).
Adding a page or a command: give it a key here, or a marker there.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))

# Pages others are writing in parallel (issue 33's brief): linked already, allowed to be missing.
PENDING: set = set()

NEEDS = {"gpu", "kubernetes", "cluster", "docker"}

# program -> the existing tests that run it (through its entry point or the function it calls)
REGISTRY: Dict[str, List[str]] = {
    "scripts/setup.sh": ["ci:.ci/run"],
    "-m pytest": ["ci:.ci/run"],
    "jobs/pretrain.py": ["tests/test_launch.py::test_job_beside_another_programs_private_ray_starts_its_own_and_keeps_a_quiet_console",
                         "tests/test_config.py::test_entry_point_rejects_bad_key_before_ray_starts"],
    "jobs/sft.py": ["tests/test_sft.py::test_code_opt_sft_lowers_heldout_loss_and_resumes_exactly",
                    "tests/test_sft.py::test_sft_starts_from_a_hugging_face_directory",
                    "tests/test_lora_run.py::test_lora_sft_then_lora_dpo_resume_export_and_peft"],
    "jobs/dpo.py": ["tests/test_dpo.py::test_dpo_trains_resumes_exactly_at_another_world_size_and_precomputes",
                    "tests/test_fit_gpus.py::test_dpo_chain_reports_a_cluster_too_small_in_one_line"],
    "jobs/grpo.py": ["tests/test_grpo.py::test_grpo_end_to_end_and_exact_resume",
                     "tests/test_grpo.py::test_grpo_on_a_task_file_with_a_weighted_verifier_sum_and_pass_at_k",
                     "tests/test_reward_model.py::test_ppo_killed_mid_run_resumes_at_another_world_size_with_the_same_values"],
    "jobs/reward_model.py": ["tests/test_reward_model.py::test_reward_model_job_learns_a_preference"],
    "jobs/export_hf.py": ["tests/test_hf_export.py::test_sharded_and_bf16_exports",
                          "tests/test_lora_run.py::test_lora_sft_then_lora_dpo_resume_export_and_peft"],
    "jobs/eval.py": ["tests/test_eval_run.py::test_jobs_eval_shards_resumes_scores_code_and_plots",
                     "tests/test_eval_run.py::test_eval_config_errors_stop_before_any_work"],
    "jobs/elastic_drill.py": ["tests/test_elastic.py::test_scale_up_down_and_worker_kill_in_one_run"],
    "-m elastic.report": ["tests/test_report_render.py::test_cli"],
    "-m elastic.reward": ["tests/test_reward_cli.py::test_cli_json_and_human"],
    "-m elastic.config": ["tests/test_config_reference.py::test_command_line_prints_the_reference"],
    "-m elastic.plan": ["tests/test_plan.py::test_cli_lists_the_8b_layouts_that_fit_eight_80gb_gpus"],
    "ray job submit": ["tests/test_job_submit.py::test_submit_tiny_pretraining_succeeds_with_a_checkpoint"],
    "scripts/local_cluster.sh": ["tests/test_job_submit.py::test_submit_tiny_pretraining_succeeds_with_a_checkpoint"],
    "scripts/scale_trainers.sh": ["tests/test_scale_trainers.py::test_dry_run_changes_nothing_and_rayjob_is_resolved"],
    "bench/gpu_check.py": ["tests/test_bench_smoke.py::test_gpu_check_smoke",
                           "tests/test_bench_smoke.py::test_gpu_check_within_smoke"],
    "bench/generate_throughput.py": ["tests/test_generate.py::test_generate_benchmark_smoke"],
    "bench/data_throughput.py": ["tests/test_bench_smoke.py::test_data_throughput_smoke"],
    "bench/curate_throughput.py": ["tests/test_bench_smoke.py::test_curate_throughput_smoke"],
    "bench/trl_peer.py": ["tests/test_bench_smoke.py::test_trl_peer_smoke"],
    "jobs/curate.py": ["tests/test_curate_run.py::test_each_planted_doc_removed_for_its_reason",
                       "tests/test_curate_run.py::test_bad_config_and_input_are_one_line_before_work"],
    "jobs/ladder.py": ["tests/test_scaling_ladder.py::test_smoke_ladder_runs_fits_and_plots",
                       "tests/test_scaling_ladder.py::test_bad_ladder_config_is_one_line_before_any_run"],
    "bench/eval_throughput.py": ["tests/test_bench_smoke.py::test_eval_throughput_smoke"],
    "bench/python_tests_throughput.py": ["tests/test_bench_smoke.py::test_python_tests_throughput_smoke"],
    "bench/rollout_buffer_stall.py": ["tests/test_bench_smoke.py::test_rollout_buffer_stall_smoke"],
    "bench/train_throughput.py": ["tests/test_bench_smoke.py::test_gpu_check_smoke"],  # runs its --smoke
}

# Commands cheap enough to run here: they must exit 0.
DIRECT = {
    ".venv/bin/python -m elastic.config reference",
    ".venv/bin/python -m elastic.config --help",
}

QUICKSTART = ("bash scripts/setup.sh && .venv/bin/python jobs/pretrain.py        # set up + run the default job\n"
              "bash scripts/setup.sh && .venv/bin/python -m pytest               # set up + run the whole test suite\n")


def rel(p: Path) -> str:
    return str(p.relative_to(REPO))


def bash_blocks(path: Path) -> List[Tuple[int, List[str]]]:
    """(line of the opening fence, lines) of every ```bash / ```sh / ```shell block."""
    out, cur, start, lang = [], None, 0, None
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = re.match(r"^\s*(```+|~~~+)\s*([\w-]*)", line)
        if m and cur is None and lang is None:
            lang, start = m.group(2), i
            cur = [] if lang in ("bash", "sh", "shell", "console") else None
            continue
        if m and lang is not None:
            if cur is not None:
                out.append((start, cur))
            cur, lang = None, None
            continue
        if cur is not None:
            cur.append(line)
    return out


def _needs(comment: str) -> Optional[str]:
    m = re.search(r"#\s*needs:\s*([\w-]+)", comment)
    return m.group(1) if m else None


def commands(lines: List[str]) -> List[Tuple[str, Optional[str]]]:
    """(command, needs) for each command of a block; continuation lines joined."""
    out, block_needs, buf = [], None, ""
    for raw in lines:
        line = raw.rstrip()
        if not buf and line.lstrip().startswith("#"):
            block_needs = _needs(line) or block_needs
            continue
        if not line.strip():
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        cmd = (buf + line).strip()
        buf = ""
        out.append((cmd, _needs(cmd) or block_needs))
    return out


def _strip_comment(cmd: str) -> str:
    try:
        lex = shlex.shlex(cmd, posix=True, punctuation_chars=False)
        lex.commenters = "#"
        lex.whitespace_split = True
        return " ".join(shlex.quote(t) if " " in t else t for t in lex)
    except ValueError:
        return cmd.split(" #", 1)[0]


def programs(cmd: str) -> List[str]:
    """Registry keys of the programs a command line runs (`a && b` gives two)."""
    keys = []
    for part in re.split(r"&&|\|\||;", _strip_comment(cmd)):
        toks = part.strip().split()
        while toks and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", toks[0]):  # VAR=value prefixes
            toks = toks[1:]
        if not toks:
            continue
        if toks[0] in ("export", "cd"):
            continue
        if toks[0] == "eval":  # eval "$(scripts/x.sh env)"
            inner = re.search(r"\$\((\S+)", part)
            keys.append(inner.group(1) if inner else "eval")
            continue
        if toks[0] == "bash" and len(toks) > 1:
            toks = toks[1:]
        if re.search(r"(^|/)python[0-9.]*$", toks[0]):
            toks = toks[1:]
            if toks and toks[0] == "-m" and len(toks) > 1:
                keys.append(f"-m {toks[1]}")
                continue
        if toks and toks[0] == "ray" and len(toks) > 2:
            keys.append(" ".join(toks[:3]))
            continue
        if toks:
            keys.append(toks[0])
    return keys


def all_commands():
    for page in PAGES:
        for start, lines in bash_blocks(page):
            for cmd, needs in commands(lines):
                yield page, start, cmd, needs


def _test_exists(test_id: str) -> bool:
    if test_id.startswith("ci:"):
        return (REPO / test_id[3:]).exists()
    path, _, name = test_id.partition("::")
    p = REPO / path
    return p.exists() and re.search(rf"^def {re.escape(name)}\(", p.read_text(), re.M) is not None


def test_readme_quickstart_is_what_ci_runs():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert "## Quickstart\n" in text
    quick = text.split("## Quickstart\n", 1)[1]
    assert "```bash\n" + QUICKSTART + "```" in quick.split("\n## ", 1)[0]
    ci = (REPO / ".ci" / "run").read_text()
    assert "bash scripts/setup.sh && .venv/bin/python -m pytest\n" in ci
    assert len(text.splitlines()) <= 160, "README.md is the short entry point: move detail into docs/"


def test_registry_names_existing_tests():
    missing = [t for ids in REGISTRY.values() for t in ids if not _test_exists(t)]
    assert not missing, f"REGISTRY names tests that do not exist: {missing}"


def test_every_command_is_tested_run_here_or_marked():
    found, problems = 0, []
    for page, start, cmd, needs in all_commands():
        found += 1
        where = f"{rel(page)}:{start} `{cmd[:90]}`"
        if needs is not None:
            if needs not in NEEDS:
                problems.append(f"{where}: unknown marker 'needs: {needs}' (known: {sorted(NEEDS)})")
            continue
        if _strip_comment(cmd) in DIRECT or cmd.split("  #")[0].strip() in DIRECT:
            continue
        keys = programs(cmd)
        if not keys:
            problems.append(f"{where}: no program found")
        for k in keys:
            if k not in REGISTRY:
                problems.append(f"{where}: `{k}` is run by no test in tests/test_docs.py REGISTRY, not in DIRECT "
                                f"and not marked `# needs: gpu|kubernetes|cluster|docker`")
    assert found > 20, f"only {found} commands found: is the block parser broken?"
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("cmd", sorted(DIRECT))
def test_direct_commands_run(cmd):
    shown = {c.split("  #")[0].strip() for _, _, c, _ in all_commands()}
    assert cmd in shown, f"{cmd!r} is no longer shown in the docs: drop it from DIRECT"
    argv = shlex.split(cmd)
    argv[0] = sys.executable if argv[0].endswith("python") else argv[0]
    r = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "data.build_ahead" in r.stdout


# ---------------------------------------------------------------- links

def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    h = re.sub(r"<[^>]+>", "", heading).strip().lower()
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def anchors(path: Path) -> set:
    out, seen, fence = set(), {}, False
    for line in path.read_text(encoding="utf-8").splitlines():
        if re.match(r"^\s*(```|~~~)", line):
            fence = not fence
            continue
        if fence:
            continue
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if m:
            s = _slug(m.group(2))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
        out.update(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", line))
    return out


def links(path: Path):
    """(line, target) of every Markdown link outside code."""
    fence = False
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if re.match(r"^\s*(```|~~~)", line):
            fence = not fence
            continue
        if fence:
            continue
        line = re.sub(r"`[^`]*`", "", line)
        for m in re.finditer(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", line):
            yield i, m.group(1)


def test_every_relative_link_resolves():
    problems, n = [], 0
    for page in PAGES:
        for line, target in links(page):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            n += 1
            file_part, _, anchor = target.partition("#")
            dest = (page.parent / file_part).resolve() if file_part else page
            where = f"{rel(page)}:{line} -> {target}"
            try:
                key = rel(dest)
            except ValueError:
                problems.append(f"{where}: points outside the repository")
                continue
            if not dest.exists():
                if key not in PENDING:
                    problems.append(f"{where}: no such file")
                continue
            if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{where}: no heading or anchor #{anchor} in {key}")
    assert n > 50, f"only {n} relative links found"
    assert not problems, "\n".join(problems)


def test_readme_links_every_page():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    index = (REPO / "docs" / "README.md").read_text(encoding="utf-8")
    for p in sorted((REPO / "docs").glob("*.md")) + [REPO / d for d in PENDING]:
        if p.name == "README.md":
            continue
        assert f"({p.name})" in index, f"docs/README.md does not link {p.name}"
    assert "(docs/README.md)" in readme and "(docs/config.md)" in readme
