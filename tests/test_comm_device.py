"""Collectives run on the communication device, by construction (elastic/train/comm.py).

Under NCCL a collective on a host tensor raises at run time ("No backend type associated with
device type cpu"): the first GPU run died at step 1 of every job that way. On a CPU machine
gloo accepts host tensors, so a run proves nothing; these tests guard the rule statically and
the Comm's own check dynamically:

1. no code under elastic/ or jobs/ calls a torch.distributed collective except comm.py;
2. no tensor built by a factory call without `device=` is handed to a Comm tensor method;
3. the Comm refuses a tensor on another device before any collective starts, and its
   number/object collectives give the right answers in a real 2-process gloo group.
"""

from __future__ import annotations

import ast
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from elastic.train.comm import Comm, CommDeviceError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMM = os.path.join("elastic", "train", "comm.py")
COLLECTIVES = {
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all", "all_to_all_single",
    "broadcast", "broadcast_object_list", "reduce", "reduce_scatter", "reduce_scatter_tensor", "gather",
    "gather_object", "scatter", "scatter_object_list", "barrier", "monitored_barrier", "send", "recv", "isend",
    "irecv", "batch_isend_irecv", "_all_gather_base", "_reduce_scatter_base", "all_reduce_coalesced",
}
FACTORIES = {"tensor", "zeros", "ones", "empty", "full", "arange", "as_tensor", "zeros_like", "from_numpy"}
COMM_TENSOR_METHODS = {"all_reduce_", "all_gather_", "check"}


def _sources():
    for top in ("elastic", "jobs"):
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            for f in files:
                if f.endswith(".py"):
                    yield os.path.relpath(os.path.join(d, f), ROOT)


def _dist_aliases(tree: ast.AST) -> tuple[set, set]:
    """Names bound to torch.distributed (or its functional collectives), and collective
    functions imported by name from it."""
    modules, funcs = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("torch.distributed") and "checkpoint" not in a.name and "tensor" not in a.name:
                    modules.add(a.asname or a.name)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if node.module == "torch" and a.name == "distributed":
                    modules.add(a.asname or a.name)
                elif full.startswith("torch.distributed") and a.name in ("_functional_collectives", "distributed_c10d"):
                    modules.add(a.asname or a.name)
                elif node.module.startswith("torch.distributed") and a.name in COLLECTIVES:
                    funcs.add(a.asname or a.name)
    return modules, funcs


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def direct_collectives(paths) -> list[str]:
    """`file:line call` for every torch.distributed collective called outside comm.py."""
    found = []
    for rel in paths:
        if rel == COMM:
            continue
        with open(os.path.join(ROOT, rel)) as f:
            tree = ast.parse(f.read(), rel)
        modules, funcs = _dist_aliases(tree)
        modules |= {"torch.distributed"}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            fn = node.func
            if isinstance(fn, ast.Attribute) and fn.attr in COLLECTIVES and _dotted(fn.value) in modules:
                found.append(f"{rel}:{node.lineno} {_dotted(fn)}")
            elif isinstance(fn, ast.Name) and fn.id in funcs:
                found.append(f"{rel}:{node.lineno} {fn.id}")
    return found


def deviceless_tensors_to_comm(paths) -> list[str]:
    """`file:line` where a Comm tensor method gets a freshly made tensor with no `device=`."""
    found = []
    for rel in paths:
        with open(os.path.join(ROOT, rel)) as f:
            tree = ast.parse(f.read(), rel)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in COMM_TENSOR_METHODS and node.args):
                continue
            arg = node.args[0]
            if (isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute) and arg.func.attr in FACTORIES
                    and _dotted(arg.func.value) == "torch" and not any(k.arg == "device" for k in arg.keywords)):
                found.append(f"{rel}:{node.lineno} {node.func.attr}(torch.{arg.func.attr}(...) without device=)")
    return found


def test_no_collective_outside_comm():
    bad = direct_collectives(_sources())
    assert not bad, "collectives must go through elastic/train/comm.py (Comm):\n" + "\n".join(bad)


def test_no_deviceless_tensor_handed_to_comm():
    bad = deviceless_tensors_to_comm(_sources())
    assert not bad, "\n".join(bad)


def test_scanner_finds_the_h100_bug(tmp_path):
    """The scanners are able to fail: the loop's code before this module (all_gather_into_tensor
    on host tensors, found on the H100) and a device-less tensor handed to a Comm are flagged."""
    src = tmp_path / "loop_then.py"
    src.write_text(
        "import torch\nimport torch.distributed as dist\n"
        "def f(world, tokens, s, comm):\n"
        "    gathered = torch.zeros(2 * world, dtype=torch.float64)\n"
        "    dist.all_gather_into_tensor(gathered, torch.tensor([float(tokens), s], dtype=torch.float64))\n"
        "    comm.all_reduce_(torch.zeros(3))\n"
        "    comm.all_reduce_(torch.zeros(3, device=comm.device))\n")
    rel = os.path.relpath(src, ROOT)
    assert direct_collectives([rel]) == [f"{rel}:5 dist.all_gather_into_tensor"]
    assert deviceless_tensors_to_comm([rel]) == [f"{rel}:6 all_reduce_(torch.zeros(...) without device=)"]


def test_comm_refuses_a_tensor_on_another_device():
    comm = Comm(torch.device("meta"))
    with pytest.raises(CommDeviceError, match=r"all_reduce\(sum\): tensor on cpu, but this job's collectives run on meta"):
        comm.all_reduce_(torch.zeros(2))
    with pytest.raises(CommDeviceError, match="all_gather"):
        comm.all_gather_(torch.zeros(2))
    assert comm.tensor([1.0, 2.0]).device.type == "meta"  # what comm makes lives on its device


def test_comm_device_of_a_model():
    m = torch.nn.Linear(2, 2)
    assert Comm.of(m).device == torch.device("cpu")
    with torch.device("meta"):
        assert Comm.of(torch.nn.Linear(2, 2)).device == torch.device("meta")


def _worker(rank: int, world: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        comm = Comm(torch.device("cpu"))
        res = {
            "sum": comm.sum([rank + 1.0, 10.0]),
            "max": comm.max([float(rank)]),
            "min": comm.min([float(rank)]),
            "gather": comm.gather([rank, 2.0 * rank]).tolist(),
            "objects": comm.all_gather_object({"rank": rank}),
            "bcast": comm.broadcast_object(f"from {rank}", src=1),
        }
        comm.barrier()
        torch.save(res, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def test_comm_collectives_in_a_gloo_group():
    world = 2
    with tempfile.TemporaryDirectory() as d:
        init = f"file://{os.path.join(d, 'rdzv')}"
        out = os.path.join(d, "res")
        mp.spawn(_worker, args=(world, init, out), nprocs=world, join=True)
        for rank in range(world):
            r = torch.load(f"{out}.{rank}")
            assert r["sum"] == [3.0, 20.0]
            assert r["max"] == [1.0] and r["min"] == [0.0]
            assert r["gather"] == [[0.0, 0.0], [1.0, 2.0]]
            assert r["objects"] == [{"rank": 0}, {"rank": 1}]
            assert r["bcast"] == "from 1"


def test_comm_without_a_group_is_the_identity():
    comm = Comm(torch.device("cpu"))
    assert comm.sum([1.0, 2.0]) == [1.0, 2.0]
    assert comm.gather([3.0]).tolist() == [[3.0]]
    assert comm.all_gather_object("x") == ["x"]
    assert comm.broadcast_object(5) == 5
