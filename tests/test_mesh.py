"""The data-parallel layout (elastic/train/mesh.py) and its config checks: pure arithmetic, no
cluster. That HSDP trains like one process is tests/test_fsdp_equivalence.py; that its
checkpoints load at other layouts, tests/test_reshard.py."""

import pytest

from elastic.config import ConfigError, from_dict
from elastic.config.load import validate
from elastic.train.mesh import LayoutError, layout_for


@pytest.mark.parametrize("world,asked,shape,names", [
    (4, 1, (4,), ("dp_shard",)),
    (4, 2, (2, 2), ("dp_replicate", "dp_shard")),
    (8, 4, (4, 2), ("dp_replicate", "dp_shard")),
    (4, 4, (4, 1), ("dp_replicate", "dp_shard")),   # pure DDP-style replication
    (3, 2, (3,), ("dp_shard",)),                    # an elastic world the replicas do not divide
    (6, 4, (2, 3), ("dp_replicate", "dp_shard")),   # the most replicas that divide it: gcd(6, 4)
    (1, 2, (1,), ("dp_shard",)),
])
def test_layout_of_a_world(world, asked, shape, names):
    lay = layout_for(world, asked)
    assert (lay.shape, lay.names, lay.world) == (shape, names, world)
    assert lay.reduced == (lay.dp_replicate != asked)


def test_layout_says_what_it_is_and_why_it_has_fewer_replicas():
    assert layout_for(4).describe() == "FSDP 4 shards"
    assert layout_for(8, 2, 2).describe() == "HSDP 2 replicas x 2 shards x TP 2"
    assert layout_for(4, 1, 2).describe() == "FSDP 2 shards x TP 2"
    assert layout_for(4, 2).describe() == "HSDP 2 replicas x 2 shards"
    assert layout_for(3, 2).describe() == "FSDP 3 shards (parallel.dp_replicate 2 does not divide 3 data-parallel ranks)"
    with pytest.raises(ValueError):
        layout_for(0, 1)
    with pytest.raises(LayoutError):
        layout_for(3, 1, 2)


def test_tp_peers_are_consecutive_ranks_of_one_data_parallel_rank():
    lay = layout_for(8, 2, 2)
    assert (lay.shape, lay.names, lay.dp) == ((2, 2, 2), ("dp_replicate", "dp_shard", "tp"), 4)
    assert [lay.dp_rank(r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]


@pytest.mark.parametrize("parallel,scaling,key", [
    ({"dp_replicate": 0}, {}, "parallel.dp_replicate"),
    ({"tp": 2}, {"min_workers": 3, "max_workers": 4}, "parallel.tp"),     # a group of 3 has a rank without its peer
    ({"tp": 3}, {"min_workers": 3, "max_workers": 3}, "parallel.tp"),     # 4 heads do not split over 3
    ({"tp": 0}, {}, "parallel.tp"),
    ({"tp": 2, "dp_replicate": 2}, {"min_workers": 2, "max_workers": 2}, "parallel.dp_replicate"),
    ({"dp_replicate": 4}, {"min_workers": 2, "max_workers": 2}, "parallel.dp_replicate"),
    ({"dp_replicat": 2}, {}, "parallel.dp_replicat"),
    ({"pp": 3}, {"min_workers": 3, "max_workers": 3}, "parallel.pp=3"),             # 3 stages of 4 layers
    ({"pp": 4}, {"min_workers": 2, "max_workers": 2}, "parallel.pp"),               # more stages than workers
    ({"pp": 2}, {"min_workers": 2, "max_workers": 3}, "parallel.pp"),               # 3 workers: a stage without its pipeline
    ({"pp": 2, "pp_microbatches": 1}, {"min_workers": 2, "max_workers": 2}, "parallel.pp_microbatches=1"),
    ({"pp": 2, "pp_virtual_stages": 2}, {"min_workers": 2, "max_workers": 2}, "parallel.pp_virtual_stages=2"),
    ({"pp": 2, "pp_schedule": "zigzag"}, {"min_workers": 2, "max_workers": 2}, "parallel.pp_schedule"),
    ({"pp": 2, "pp_microbatches": 3}, {"min_workers": 2, "max_workers": 2}, "parallel.pp_microbatches"),  # 4-row micro-batches
    ({"pp": 2, "tp": 2}, {"min_workers": 2, "max_workers": 4}, "parallel.pp"),  # 2 workers: half a pp x tp unit
])
def test_bad_parallel_config_is_one_line_naming_the_key(parallel, scaling, key):
    with pytest.raises(ConfigError) as e:
        validate(from_dict({"parallel": parallel, "scaling": scaling}))
    assert key in str(e.value) and "\n" not in str(e.value)


def test_pipeline_stages_with_tensor_parallelism_validate():
    validate(from_dict({"parallel": {"pp": 2, "tp": 2}, "scaling": {"min_workers": 4, "max_workers": 8}}))


@pytest.mark.parametrize("job", ["grpo", "dpo", "reward_model"])
def test_jobs_that_do_not_pipeline_refuse_pp_naming_the_key(job):
    with pytest.raises(ConfigError, match=r"^parallel.pp: .* does not run pipelined"):
        validate(from_dict({"parallel": {"pp": 2}, "scaling": {"min_workers": 2, "max_workers": 2}}, job=job), job=job)


def test_pipeline_layout_ranks_and_config():
    lay = layout_for(8, 1, 2, 2)  # pp 2 x dp 2 x tp 2: pp outermost, tp peers consecutive
    assert (lay.names, lay.shape, lay.dp, lay.unit) == (("pp", "dp_shard", "tp"), (2, 2, 2), 2, 4)
    assert [lay.pp_rank(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [lay.dp_rank(r) for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert [lay.tp_rank(r) for r in range(8)] == [0, 1] * 4
    assert layout_for(4, 2, 1, 2).describe() == "PP 2 x HSDP 2 replicas x 1 shard"
    with pytest.raises(LayoutError, match="parallel.pp 2 x parallel.tp 2"):
        layout_for(6, 1, 2, 2)
    validate(from_dict({"parallel": {"pp": 2, "pp_microbatches": 2}, "scaling": {"min_workers": 2, "max_workers": 4},
                        "train": {"global_batch_size": 8, "micro_batch_size": 4}}))


def test_hsdp_config_is_accepted():
    validate(from_dict({"parallel": {"dp_replicate": 2}, "scaling": {"min_workers": 2, "max_workers": 2},
                        "train": {"global_batch_size": 16, "micro_batch_size": 4}}))
