"""Pipeline stages (elastic/model/stages.py) and schedules (elastic/train/pipeline.py): a stage
keeps the full model's parameter names, the stages run in order equal the whole model, and a
pipelined step over 2 gloo ranks (GPipe, 1F1B, interleaved 1F1B with 2 virtual stages per rank,
looped BFS) gives the unsplit model's token-mean loss and gradients, tied embeddings included."""

import copy
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from elastic.data.packing import IGNORE
from elastic.model.llama import ModelArgs, Transformer
from elastic.model.stages import TransformerStage, split_stages, stage_ranges
from elastic.train.pipeline import check_layout, full_names, rank_stages

VOCAB, B, T = 64, 8, 16


def _args(tied: bool) -> ModelArgs:
    return ModelArgs(dim=32, n_layers=4, n_heads=4, n_kv_heads=2, ffn_hidden=64, vocab_size=VOCAB, max_seq_len=T,
                     tie_embeddings=tied)


def _model(tied: bool) -> Transformer:
    m = Transformer(_args(tied))
    m.init_weights(seed=3)
    return m


def _batch():
    """Packed rows of two documents each (positions restart, doc ids differ), labels with IGNORE
    at each document's last token and on an unlearned prompt part of row 0."""
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (B, T), generator=g)
    cut = torch.randint(3, T - 3, (B,), generator=g)
    ar = torch.arange(T).expand(B, T)
    doc_ids = (ar >= cut[:, None]).long()
    positions = torch.where(doc_ids == 0, ar, ar - cut[:, None])
    labels = torch.full((B, T), IGNORE)
    same = doc_ids[:, 1:] == doc_ids[:, :-1]
    labels[:, :-1] = torch.where(same, tokens[:, 1:], torch.full_like(tokens[:, 1:], IGNORE))
    labels[0, :6] = IGNORE
    return tokens, labels, positions, doc_ids


def _reference(model: Transformer):
    tokens, labels, positions, doc_ids = _batch()
    logits = model(tokens, positions=positions, doc_ids=doc_ids)
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_stage_ranges_and_bad_layouts_name_the_keys():
    assert stage_ranges(4, 2) == [range(0, 2), range(2, 4)]
    with pytest.raises(ValueError, match="4 layers do not split into 3"):
        stage_ranges(4, 3)
    assert check_layout(4, 2, 1, 4, "1f1b") is None and check_layout(4, 2, 2, 4, "interleaved_1f1b") is None
    assert "parallel.pp=2 x parallel.pp_virtual_stages=2 = 4 stages" not in (check_layout(4, 2, 2, 4, "looped_bfs") or "")
    assert "do not divide the model's 6 layers" in check_layout(6, 2, 2, 4, "interleaved_1f1b")
    assert "parallel.pp_microbatches=1 is fewer than parallel.pp=2" in check_layout(4, 2, 1, 1, "1f1b")
    assert "parallel.pp_schedule" in check_layout(4, 2, 1, 4, "zigzag")
    assert "needs a schedule with several stages per rank" in check_layout(4, 2, 2, 4, "1f1b")
    assert rank_stages(1, 2, 2) == [1, 3]


@pytest.mark.parametrize("tied", [False, True])
def test_stages_keep_the_full_names_and_compose_to_the_whole_model(tied):
    model = _model(tied)
    ref = copy.deepcopy(model)
    tokens, _, positions, doc_ids = _batch()
    want = ref(tokens, positions=positions, doc_ids=doc_ids)
    stages = split_stages(model, 4, [0, 1, 2, 3])
    names = [n for s in stages for n, _ in s.named_parameters()]
    assert sorted(names) == sorted(full_names(ref))
    assert "layers.3.attention.wq.weight" in dict(stages[3].named_parameters())
    x = tokens
    for s in stages:
        x = s(x, positions, doc_ids)
    assert torch.equal(x, want)
    assert isinstance(stages[0], TransformerStage) and stages[0].tok_embeddings is not None and stages[0].output is None


def _worker(rank: int, world: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    torch.manual_seed(0)
    from elastic.train.pipeline import Pipeline

    try:
        res = {}
        for tied in (False, True):
            want_loss, want_grads = _reference(_model(tied))
            for schedule, virtual, mbs in (("gpipe", 1, 4), ("1f1b", 1, 4), ("1f1b", 1, 2),
                                           ("interleaved_1f1b", 2, 4), ("looped_bfs", 2, 2)):
                pipe = Pipeline.of_model(_model(tied), dist.group.WORLD, torch.device("cpu"), virtual=virtual,
                                microbatches=mbs, schedule=schedule)
                loss = pipe.step(*_batch())
                grads = {n: p.grad for n, p in pipe.named_parameters()}
                if tied and "output.weight" in grads:  # the last stage's copy of the tied weight
                    grads["tok_embeddings.weight@output"] = grads.pop("output.weight")
                err = max(float((g - want_grads[n.split("@")[0]]).abs().max()) for n, g in grads.items())
                res[(tied, schedule, mbs)] = {"names": sorted(grads), "err": err,
                                              "loss": None if loss is None else float(loss), "want": float(want_loss)}
        torch.save(res, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def test_pipelined_step_equals_the_unsplit_model_over_two_gloo_ranks():
    world = 2
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_worker, args=(world, f"file://{os.path.join(d, 'rdzv')}", os.path.join(d, "res")), nprocs=world,
                 join=True)
        got = [torch.load(os.path.join(d, f"res.{r}")) for r in range(world)]
    for key in got[0]:
        tied = key[0]
        names = sorted(set(got[0][key]["names"]) | set(got[1][key]["names"]))
        want_names = sorted(n.replace("output.weight", "tok_embeddings.weight@output") if tied else n
                            for n in full_names(_model(tied)))
        assert names == want_names, key
        for r in range(world):
            assert got[r][key]["err"] < 1e-5, (key, r, got[r][key]["err"])
        last = got[world - 1][key]
        assert got[0][key]["loss"] is None and last["loss"] == pytest.approx(last["want"], rel=1e-5), key
