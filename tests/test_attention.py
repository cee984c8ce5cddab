"""Document masking: a packed sample's logits equal each document's logits run alone.

Tolerance: fp32 on CPU, 1e-5 absolute on logits of magnitude ~1 (only summation order
differs between the masked packed run and the per-document runs).
"""

import numpy as np
import pytest
import torch

from elastic.model import ModelArgs, Transformer, available_backends, build_attention_metadata
from elastic.model.attention import choose_backend

ARGS = ModelArgs(vocab_size=300, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=128, max_seq_len=64)


def _model(backend: str, device="cpu") -> Transformer:
    m = Transformer(ARGS, attention_backend=backend)
    m.init_weights(seed=0)
    return m.to(device).eval()


def _packed(device="cpu"):
    g = torch.Generator().manual_seed(1)
    lens = [5, 17, 1, 9]  # three documents then padding-like tail doc
    docs = [torch.randint(0, ARGS.vocab_size, (n,), generator=g) for n in lens]
    tokens = torch.cat(docs)[None]
    doc_ids = torch.cat([torch.full((n,), i) for i, n in enumerate(lens)])[None]
    positions = torch.cat([torch.arange(n) for n in lens])[None]
    return docs, tokens.to(device), positions.to(device), doc_ids.to(device)


@pytest.mark.parametrize("backend", ["sdpa_docs", "sdpa_mask", "sdpa_loop"])
def test_packed_logits_equal_documents_alone(backend):
    model = _model(backend)
    docs, tokens, positions, doc_ids = _packed()
    with torch.no_grad():
        packed = model(tokens, positions, doc_ids)[0]
        o = 0
        for d in docs:
            n = len(d)
            alone = model(d[None], torch.arange(n)[None], torch.zeros(1, n, dtype=torch.long))[0]
            torch.testing.assert_close(packed[o:o + n], alone, atol=1e-5, rtol=0)
            o += n


def test_masking_changes_logits_when_documents_could_see_each_other():
    """Control: without the document mask, later documents' logits do change."""
    model = _model("sdpa_mask")
    docs, tokens, positions, doc_ids = _packed()
    with torch.no_grad():
        masked = model(tokens, positions, doc_ids)[0]
        unmasked = model(tokens, positions, torch.zeros_like(doc_ids))[0]
    assert (masked[5:] - unmasked[5:]).abs().max() > 1e-3


def test_backend_choice_on_cpu_and_forced_backend_refused():
    """`auto` on CPU: sdpa_docs for rows of 256 tokens or more, sdpa_mask below (measured,
    elastic/model/attention.py); a forced one is taken as it is."""
    cpu = torch.device("cpu")
    assert choose_backend("auto", cpu) == choose_backend("auto", cpu, seq_len=512) == "sdpa_docs"
    assert choose_backend("auto", cpu, seq_len=256) == "sdpa_docs"
    assert choose_backend("auto", cpu, seq_len=128) == "sdpa_mask"
    assert choose_backend("sdpa_docs", cpu, seq_len=128) == "sdpa_docs"
    assert choose_backend("sdpa_mask", cpu, seq_len=512) == "sdpa_mask"
    with pytest.raises(ValueError, match="model.attention"):
        choose_backend("flash_varlen", torch.device("cpu"))


def test_auto_on_cuda_picks_the_measured_fastest_and_compile_auto_is_cuda_only():
    """H100, 1b at seq 4096: flex + compile 41.9% MFU, torch_varlen + compile 38.7%, and
    compile itself 25.4% -> 38.7% (shared/gpu/H100-2026-11-25.md). What `auto` resolves to
    is decided from the device type, so it is checked here without a GPU."""
    from elastic.model.attention import available_backends
    from elastic.train.loop import resolve_compile

    cuda = torch.device("cuda")
    assert choose_backend("auto", cuda, compiled=True) == "flex"
    assert choose_backend("auto", cuda, compiled=False) in ("flash_varlen", "torch_varlen")
    assert available_backends(cuda, compiled=False)[-3:] == ["flex", "sdpa_mask", "sdpa_loop"]
    assert resolve_compile("auto", cuda) and not resolve_compile("auto", torch.device("cpu"))
    assert resolve_compile("true", torch.device("cpu")) and not resolve_compile("false", cuda)


def test_gradients_do_not_cross_documents():
    """The loss of document 0 has no gradient w.r.t. the embeddings of document 1's tokens."""
    model = _model("sdpa_mask").train()
    docs, tokens, positions, doc_ids = _packed()
    meta = build_attention_metadata(doc_ids, "sdpa_mask")
    emb = model.tok_embeddings(tokens).detach().requires_grad_(True)
    h = emb
    freqs = model.freqs_cis[positions]
    for layer in model.layers:
        h = layer(h, freqs, meta)
    out = model.output(model.norm(h))
    out[0, :5].sum().backward()
    assert emb.grad[0, 5:].abs().max() == 0
    assert emb.grad[0, :5].abs().max() > 0


def _rows(*lens_per_row):
    """doc_ids [B, T] from each row's document lengths (ids restart at 0 in every row)."""
    return torch.stack([torch.cat([torch.full((n,), i) for i, n in enumerate(lens)]) for lens in lens_per_row])


def _qkv_grads(backend, doc_ids, q, k, v, go, host_spans=False):
    from elastic.model.attention import attention, host_doc_spans

    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    spans = None
    if host_spans:  # the training path: boundaries computed on the host by to_device
        cu, longest = host_doc_spans(doc_ids.numpy())
        spans = (torch.from_numpy(cu), longest)
    out = attention(q, k, v, build_attention_metadata(doc_ids, backend, spans))
    (out * go).sum().backward()
    return out.detach(), q.grad, k.grad, v.grad


@pytest.mark.parametrize("hkv", [2, 4])  # GQA (4 query heads share 2 key/value heads) and MHA
@pytest.mark.parametrize("rows", [
    # many short documents of mixed buckets, a document of length 1, one whole-row document
    ((3, 7, 1, 20, 5, 9, 2, 17), (64,), (1, 40, 23)),
    ((64,), (64,)),  # every row one document: SDPA on the batch as it is
    ((1,) * 64,),    # 64 documents of one token
])
def test_sdpa_docs_equals_the_reference_in_forward_and_gradients(rows, hkv):
    """fp32 on CPU: outputs and the gradients of q, k, v agree with `sdpa_loop` (each document
    alone) and `sdpa_mask` to 1e-5; buckets pad documents, padding changes nothing."""
    doc_ids = _rows(*rows)
    B, T, H, D = doc_ids.shape[0], doc_ids.shape[1], 4, 16
    g = torch.Generator().manual_seed(0)
    # [B, T, H, D] transposed, the layout the model hands attention
    q = torch.randn(B, T, H, D, generator=g).transpose(1, 2)
    k = torch.randn(B, T, hkv, D, generator=g).transpose(1, 2)
    v = torch.randn(B, T, hkv, D, generator=g).transpose(1, 2)
    go = torch.randn(B, H, T, D, generator=g)
    got = _qkv_grads("sdpa_docs", doc_ids, q, k, v, go, host_spans=True)
    assert torch.equal(got[0], _qkv_grads("sdpa_docs", doc_ids, q, k, v, go)[0])  # device spans: the same
    for ref in ("sdpa_loop", "sdpa_mask"):
        for a, b in zip(got, _qkv_grads(ref, doc_ids, q, k, v, go)):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_sdpa_docs_buckets():
    """Four buckets per octave at most, padding under a quarter of a document (16 below 64)."""
    from elastic.model.attention import bucket_length

    assert bucket_length([1, 16, 17, 63, 64, 65, 80, 81, 129, 500, 512]).tolist() == [16, 16, 32, 64, 64, 80, 80, 96, 160, 512, 512]
    meta = build_attention_metadata(_rows((3, 7, 1, 20, 5, 9, 2, 17), (64,)), "sdpa_docs")
    assert meta.doc_buckets == [(16, 6), (32, 2), (64, 1)]
    assert build_attention_metadata(_rows((64,), (64,)), "sdpa_docs").doc_buckets is None


def test_model_loss_and_gradients_with_sdpa_docs_equal_sdpa_mask():
    """The tiny test model on two packed rows: same loss and parameter gradients (fp32)."""
    g = torch.Generator().manual_seed(3)
    doc_ids = _rows((5, 17, 1, 9, 32), (64,))
    tokens = torch.randint(0, ARGS.vocab_size, doc_ids.shape, generator=g)
    positions = torch.cat([torch.cat([torch.arange(n) for n in lens]) for lens in ((5, 17, 1, 9, 32), (64,))]).view(2, 64)
    results = []
    for backend in ("sdpa_docs", "sdpa_mask"):
        model = _model(backend).train()
        logits = model(tokens, positions, doc_ids)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (la, ga), (lb, gb) = results
    torch.testing.assert_close(la, lb, atol=1e-6, rtol=0)
    assert ga.keys() == gb.keys()
    for n in ga:
        torch.testing.assert_close(ga[n], gb[n], atol=1e-5, rtol=0, msg=n)


def test_config_names_every_backend():
    from elastic.config.load import ATTENTION_BACKENDS
    from elastic.model import BACKENDS

    assert ATTENTION_BACKENDS == ("auto", *BACKENDS)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("backend", ["flash_varlen", "torch_varlen", "flex"])
def test_cuda_backends_match_reference_in_bf16(backend):
    dev = torch.device("cuda")
    if backend not in available_backends(dev):
        pytest.skip(f"{backend} not available on this machine")
    ref = _model("sdpa_loop", dev).to(torch.bfloat16)
    test = _model(backend, dev).to(torch.bfloat16)
    _, tokens, positions, doc_ids = _packed(dev)
    with torch.no_grad():
        a = ref(tokens, positions, doc_ids).float()
        b = test(tokens, positions, doc_ids).float()
    # bf16 has ~3 significant digits; kernels differ in accumulation order.
    torch.testing.assert_close(a, b, atol=3e-2, rtol=3e-2)


def test_padding_free_micro_batch_trains_like_the_padded_rows():
    """LMJob under a per-document backend lays a micro-batch's real tokens in one row
    (train/step.py padding_free): the loss and every parameter gradient equal those of the
    padded rows, and two rows' documents stay apart (row 0 ends and row 1 starts with doc 0)."""
    from elastic.data.packing import IGNORE, PAD_DOC
    from elastic.train.step import causal_lm_loss, padding_free, to_device

    g = np.random.default_rng(0)
    rows = ((5, 11), (20,), (7, 1, 3))
    T = 32
    doc = np.full((len(rows), T), PAD_DOC, np.int64)
    pos = np.zeros_like(doc)
    for r, lens in enumerate(rows):
        o = 0
        for i, n in enumerate(lens):
            doc[r, o:o + n], pos[r, o:o + n] = i, np.arange(n)
            o += n
    tokens = g.integers(0, ARGS.vocab_size, doc.shape)
    labels = np.full_like(doc, IGNORE)
    same = (doc[:, 1:] == doc[:, :-1]) & (doc[:, 1:] >= 0)
    labels[:, :-1] = np.where(same, tokens[:, 1:], IGNORE)
    mb = {"tokens": tokens, "positions": pos, "doc_ids": doc, "labels": labels}
    flat = padding_free(mb)
    n = sum(map(sum, rows))
    assert all(v.shape == (1, n) for v in flat.values())
    assert flat["doc_ids"][0].tolist() == sum(([d] * k for d, k in enumerate(x for r in rows for x in r)), [])
    assert padding_free({k: v[1:2, :20] for k, v in mb.items()})["tokens"].shape == (1, 20)  # no padding: as is
    results = []
    for batch in (mb, flat):
        model = _model("sdpa_docs").train()
        out = causal_lm_loss(model, to_device(batch, torch.device("cpu")))
        out.loss_sum.backward()
        results.append((out.loss_sum.detach(), {k: p.grad for k, p in model.named_parameters()}))
    (la, ga), (lb, gb) = results
    torch.testing.assert_close(la, lb, atol=1e-5, rtol=1e-6)
    for k in ga:
        torch.testing.assert_close(ga[k], gb[k], atol=1e-5, rtol=1e-5, msg=k)
