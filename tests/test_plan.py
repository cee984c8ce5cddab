"""The memory planner (elastic/plan): its parameter counts are the model's, its activation
term is what a block really saves for backward (counted on CPU through autograd's saved-tensor
hooks, fp32), its terms add up by hand, and the CLI lists layouts that fit."""

import pytest
import torch

from elastic.model import ModelArgs, Transformer
from elastic.plan.memory import GIB, LayoutSpec, activation_elements_per_token, footprint, layouts_for, shape_params
from elastic.plan.__main__ import main as plan_main

SHAPES = [dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=128, tie_embeddings=True),
          dict(dim=96, n_layers=3, n_heads=6, n_kv_heads=3, ffn_hidden=256, tie_embeddings=False)]


def _saved_bytes(model: Transformer, tokens: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd saves in one forward, parameters excluded."""
    seen = {}

    def pack(t):
        st = t.untyped_storage()
        seen[st.data_ptr()] = max(seen.get(st.data_ptr(), 0), st.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(tokens, None, torch.zeros_like(tokens))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(v for k, v in seen.items() if k not in params)


@pytest.mark.parametrize("shape", SHAPES)
def test_parameter_counts_are_the_models(shape):
    vocab = 300
    m = Transformer(ModelArgs(vocab_size=vocab, max_seq_len=64, **shape))
    p = shape_params(shape, vocab)
    assert p["N"] == sum(x.numel() for x in m.parameters())
    assert p["B"] == sum(x.numel() for x in m.layers[0].parameters())


@pytest.mark.parametrize("shape", SHAPES)
def test_activation_term_is_what_the_blocks_save_for_backward(shape):
    """Per token and block, fp32 on CPU with the per-document backend (no T x T matrix, as flash
    and flex on a GPU): the difference between 2 and 1 blocks' saved bytes, over the tokens,
    is the planner's element count x 4 bytes."""
    vocab, b, s = 300, 2, 64
    saved = {}
    for L in (1, 2):
        torch.manual_seed(0)
        m = Transformer(ModelArgs(vocab_size=vocab, max_seq_len=s, **{**shape, "n_layers": L}), attention_backend="sdpa_docs")
        saved[L] = _saved_bytes(m, torch.randint(0, vocab, (b, s)))
    per_token_block = (saved[2] - saved[1]) / (b * s)
    assert per_token_block == 4 * activation_elements_per_token(shape)


def test_terms_by_hand_for_one_layout():
    s = SHAPES[0]
    p = shape_params(s, 300)  # N = 2 blocks + embeddings + final norm
    fp = footprint(s, 300, LayoutSpec(dp_replicate=2, dp_shard=2, tp=2), seq_len=64, micro_batch=2, compute_bytes=2)
    t = 128
    assert fp.parts["state"] == 16 * p["N"] / 4
    assert fp.parts["gathered"] == 2 * (2 * p["B"] + p["E"]) / 2
    assert fp.parts["block_grads"] == 4 * p["B"] / 2
    assert fp.parts["activations"] == 2 * (2 * t * (8 * 64 + 2 * 32 + 4 * 128 + 4 * 16 + 4 + 2) / 2)
    assert fp.parts["logits"] == t * 300 * 10 / 2  # vocabulary shards (loss parallelism)
    ac = footprint(s, 300, LayoutSpec(2, 2, 2, ac=True), seq_len=64, micro_batch=2, compute_bytes=2)
    assert ac.parts["activations"] == 2 * 2 * t * 64 / 2 + 2 * t * (8 * 64 + 2 * 32 + 4 * 128 + 4 * 16 + 4 + 2) / 2
    assert fp.total == pytest.approx(sum(fp.parts.values()) * 1.1 + GIB)


def test_layouts_keep_tp_to_what_the_heads_split_into():
    s = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=128)
    lays = list(layouts_for(s, 8))
    assert {lay.tp for lay in lays} == {1, 2}  # 4 and 8 do not split 2 key/value heads
    assert all(lay.gpus == 8 for lay in lays) and len(lays) == 2 * (4 + 3)  # (dp 8: 4 splits; dp 4: 3) x AC off/on
    assert {lay.pp for lay in lays} == {1}  # no pipeline unless asked (max_pp)


def test_cli_lists_the_8b_layouts_that_fit_eight_80gb_gpus(capsys):
    assert plan_main(["--preset", "8b", "--gpus", "8", "--gpu-gib", "80"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("8b (vocab 128256) on 8 x 80 GiB") and "| 1 | 8 | 1 | off |" in out
    assert plan_main(["--preset", "70b", "--gpus", "8", "--gpu-gib", "80"]) == 1  # 16 B/param of 70B > 8 x 80 GB


@pytest.mark.parametrize("tied", [False, True])
def test_pipeline_terms_are_the_end_stage_of_the_real_split(tied):
    """With pp, the state and gathered terms count the largest stage of elastic/model/stages.py's
    split (an end stage: its blocks and the embedding or the output with the final norm; a tied
    model's last stage holds its own copy of the embedding); activations stay L blocks' worth
    (1F1B keeps pp micro-batches of L/pp blocks in flight); p2p is one activation in, one out."""
    from elastic.model.stages import split_stages

    s = dict(dim=64, n_layers=4, n_heads=4, n_kv_heads=2, ffn_hidden=128, tie_embeddings=tied)
    vocab, pp = 300, 2
    m = Transformer(ModelArgs(**s, vocab_size=vocab, max_seq_len=64))
    stages = split_stages(m, pp, list(range(pp)))
    biggest = max(sum(p.numel() for p in st.parameters()) for st in stages)
    p = shape_params(s, vocab)
    lay = LayoutSpec(dp_shard=2, tp=2, ac=False, pp=pp)
    fp = footprint(s, vocab, lay, seq_len=64, micro_batch=2, compute_bytes=2)
    assert fp.parts["state"] == 16 * biggest / 4
    assert fp.parts["gathered"] == 2 * (2 * p["B"] + vocab * 64 + 64) / 2
    assert fp.parts["activations"] == footprint(s, vocab, LayoutSpec(dp_shard=4, tp=2), 64, 2).parts["activations"]
    assert fp.parts["p2p"] == 2 * 2 * 128 * 64 / 2 and lay.gpus == 8
    with pytest.raises(ValueError, match="pp=3 does not divide 4 layers"):
        footprint(s, vocab, LayoutSpec(pp=3), 64, 2)


def test_plan_reaches_for_pp_only_when_nothing_without_it_fits(capsys):
    s = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=128)
    assert {lay.pp for lay in layouts_for(s, 8, max_pp=8)} == {1, 2}  # pp divides the 2 layers
    # 70B on 64 x 80 GB: layouts without pp fit, and every one of them ranks before any with pp
    assert plan_main(["--preset", "70b", "--gpus", "64", "--gpu-gib", "80", "--seq-len", "8192"]) == 0
    rows = [r.split("|")[1:-1] for r in capsys.readouterr().out.splitlines() if r.startswith("| ") and "yes" in r]
    pps = [int(r[4]) for r in rows]
    assert pps[0] == 1 and pps == sorted(pps) and {8, 16} <= set(pps)
    # FSDP kept inside each node (8 HSDP replicas of tp 8) does not fit; 8 stages of tp 8 do
    pp8 = next(r for r in rows if [x.strip() for x in r[:5]] == ["1", "1", "8", "on", "8"])
    assert float(pp8[10]) < 40
    assert plan_main(["--preset", "70b", "--gpus", "64", "--gpu-gib", "80", "--seq-len", "8192", "--all"]) == 0
    out = capsys.readouterr().out
    assert "| 8 | 1 | 8 | on | 1 |" in out and "| 8 | 1 | 8 | on | 1 | 131.4 |" in out
