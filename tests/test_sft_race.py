"""bench/sft_race.py's one evaluator: its held-out loss is the token-mean NLL of the assistant
tokens, the same number transformers computes with those tokens as labels (-100 elsewhere), and
its start is a loadable HF directory with the role markers as special tokens."""

import json
import sys

import pytest
import torch

from tests.conftest import REPO

sys.path.insert(0, str(REPO))


@pytest.fixture(scope="module")
def start(tmp_path_factory):
    from bench.sft_race import make_start

    work = tmp_path_factory.mktemp("sft-race")
    return work, make_start(work, seed=0)


def test_the_start_is_the_seeded_tiny_model_with_special_role_markers(start):
    from tokenizers import Tokenizer

    from elastic.data.tokenizer import ROLE_MARKERS
    from elastic.model.hf import _seeded_state, from_pretrained

    work, hf = start
    tok = Tokenizer.from_file(str(work / "tokenizer.json"))
    special = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    assert set(ROLE_MARKERS) <= special
    model = from_pretrained(str(hf))
    drawn = _seeded_state(model.args, 0)
    got = model.state_dict()
    assert all(torch.equal(got[k], v) for k, v in drawn.items())


def test_heldout_loss_equals_transformers_loss_on_the_assistant_tokens(start):
    from transformers import AutoModelForCausalLM

    from bench.sft_race import HELDOUT, evaluator
    from bench.trl_peer import sft_rows

    work, hf = start
    got = evaluator(work / "tokenizer.json")(str(hf))
    rows = sft_rows(work / "tokenizer.json", HELDOUT)
    assert len(rows["input_ids"]) == 256 == len(HELDOUT.read_text().splitlines())
    ref = AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32).eval()
    total, count, per_row = 0.0, 0, []
    with torch.no_grad():
        for ids, mask in zip(rows["input_ids"], rows["completion_mask"]):
            x = torch.tensor([ids])
            labels = torch.where(torch.tensor([mask], dtype=torch.bool), x, torch.full_like(x, -100))
            n = int(sum(mask[1:]))  # the first token is never a target
            loss = float(ref(input_ids=x, labels=labels).loss)
            total, count = total + loss * n, count + n
            per_row.append(loss)
    assert count > 0 and got["heldout_loss"] == pytest.approx(total / count, rel=1e-5)
    se = torch.tensor(per_row).std().item() / len(per_row) ** 0.5
    assert got["se"] == pytest.approx(se, rel=1e-4)
    # an untrained model: about log(vocab) nats per token
    assert abs(got["heldout_loss"] - torch.log(torch.tensor(1024.0)).item()) < 1.0
    assert json.loads((hf / "config.json").read_text())["vocab_size"] == 1024
