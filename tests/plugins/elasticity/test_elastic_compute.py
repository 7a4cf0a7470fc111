"""``compute_elastic_config``: the config-json example and upstream's long-standing worked
example give the documented plans; the plan is checked against a brute-force reading of its
definition (every valid GPU count splits the batch into whole micro-batches of an accepted size,
and no candidate admits more GPU counts); bad configs name the key."""
import pytest

import deepspeed
from deepspeed.elasticity import (ElasticityConfig, ElasticityConfigError, ElasticityError,
                                  ElasticityIncompatibleWorldSize, compute_elastic_config)
from deepspeed.elasticity.elasticity import (HIGHLY_COMPOSITE_NUMBERS, candidate_batch_sizes,
                                             largest_highly_composite_at_most)

V = deepspeed.__version__


def _cfg(**elastic):
    section = {"enabled": True, "max_train_batch_size": 2000, "micro_batch_sizes": [2, 4, 6],
               "min_gpus": 1, "max_gpus": 10000, "min_time": 20, "version": 0.1}
    section.update(elastic)
    return {"elasticity": section}


def test_defaults_are_the_documented_ones():
    c = ElasticityConfig()
    assert (c.enabled, c.max_train_batch_size, c.micro_batch_sizes, c.min_gpus, c.max_gpus,
            c.min_time, c.version, c.ignore_non_elastic_batch_info, c.prefer_larger_batch,
            c.model_parallel_size, c.num_gpus_per_node) == \
        (False, 2000, [2, 4, 6], 1, 10000, 0, 0.2, False, True, 1, 1)


def test_highly_composite_table_is_right():
    best, expected = 0, []
    for n in range(1, 10081):
        divisors = sum(1 for d in range(1, int(n ** 0.5) + 1) if n % d == 0 for _ in {d, n // d})
        if divisors > best:
            best = divisors
            expected.append(n)
    assert list(HIGHLY_COMPOSITE_NUMBERS[:len(expected)]) == expected
    assert largest_highly_composite_at_most(11) == 6 and largest_highly_composite_at_most(12) == 12


def test_config_json_example():
    """The example in the section's own format text (max 2000, micro 2/4/6, 1..10000 GPUs)."""
    batch, gpus = compute_elastic_config(_cfg(), V)
    assert batch == 1680
    assert gpus == [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 15, 20, 21, 24, 28, 30, 35, 40, 42, 56, 60,
                    70, 84, 105, 120, 140, 168, 210, 280, 420, 840]


def test_worked_example_v01():
    cfg = _cfg(max_train_batch_size=10000, micro_batch_sizes=[8, 12, 16, 17], min_gpus=32,
               max_gpus=1500)
    batch, gpus = compute_elastic_config(cfg, V)
    assert batch == 9792 and len(gpus) == 23
    batch, gpus, micro = compute_elastic_config(cfg, V, world_size=64)
    assert micro == 17  # 9792 / 64 = 153 = 9 x 17: only 17 of the accepted sizes divides it
    with pytest.raises(ElasticityIncompatibleWorldSize, match="world size 33 is not valid"):
        compute_elastic_config(cfg, V, world_size=33)


@pytest.mark.parametrize("elastic", [
    dict(max_train_batch_size=100, micro_batch_sizes=[3, 5], min_gpus=1, max_gpus=12),
    dict(max_train_batch_size=64, micro_batch_sizes=[4], min_gpus=2, max_gpus=8,
         prefer_larger_batch=False),
    dict(max_train_batch_size=500, micro_batch_sizes=[2, 7], min_gpus=1, max_gpus=40),
])
def test_plan_matches_its_definition(elastic):
    cfg = _cfg(**elastic)
    batch, gpus = compute_elastic_config(cfg, V)
    mbs, lo, hi = elastic["micro_batch_sizes"], elastic["min_gpus"], elastic["max_gpus"]

    def fits(b):
        return [g for g in range(lo, hi + 1) if any(b % (m * g) == 0 for m in mbs)]
    assert batch <= elastic["max_train_batch_size"] and gpus == fits(batch)
    for other in candidate_batch_sizes(sorted(set(mbs)) + [max(mbs) * min(mbs)], batch):
        assert len(fits(other)) <= len(gpus)
    for g in gpus:  # every valid world size gets a micro batch that divides its share
        _, _, micro = compute_elastic_config(cfg, V, world_size=g)
        assert micro in mbs and (batch // g) % micro == 0


def test_v02_scales_by_nodes_and_trains_off_plan():
    cfg = _cfg(version=0.2, max_train_batch_size=64, micro_batch_sizes=[2, 4], min_gpus=2,
               max_gpus=16, num_gpus_per_node=2, model_parallel_size=1)
    batch, valid, micro = compute_elastic_config(cfg, V, world_size=4)
    assert all(v % 2 == 0 for v in valid) and 4 in valid and batch % (micro * 4) == 0
    batch, valid, micro = compute_elastic_config(cfg, V, world_size=14)
    assert valid == [14] and batch <= 64 and batch % (micro * 14) == 0


def test_prefer_larger_batch_false_picks_the_smaller_micro_batch():
    # 1680 over 8 GPUs is 210 per GPU, which micro-batches of 2 and 6 divide (4 does not)
    cfg = _cfg(version=0.1)
    assert compute_elastic_config(cfg, V, world_size=8)[2] == 6
    cfg["elasticity"]["prefer_larger_batch"] = False
    batch, _, micro = compute_elastic_config(cfg, V, world_size=8)
    assert micro == 2 and (batch // 8) % 6 == 0


def test_model_parallel_size_counts_data_parallel_ranks_per_node():
    # 4 GPUs a node, 2 per model replica: 2 data-parallel ranks a node, so data-parallel
    # sizes step by 2 (not 4) and 8 GPUs are 4 data-parallel ranks
    cfg = _cfg(version=0.2, max_train_batch_size=64, micro_batch_sizes=[2, 4], min_gpus=4,
               max_gpus=16, num_gpus_per_node=4, model_parallel_size=2)
    batch, valid, micro = compute_elastic_config(cfg, V, world_size=8)
    assert (batch, valid, micro) == (48, [2, 4, 6, 8], 4)  # 48 = 4 ranks x 3 steps x 4
    # (with model_parallel_size 1 the same 8 GPUs would be 8 data-parallel ranks: 64, [4, 8, 16])


def test_no_valid_batch_size_is_a_clear_error():
    with pytest.raises(ElasticityError, match="no valid batch size"):
        compute_elastic_config(_cfg(max_train_batch_size=7, micro_batch_sizes=[7], min_gpus=2,
                                    max_gpus=5), V)


@pytest.mark.parametrize("elastic,needle", [
    (dict(version=0.3), "elasticity.version"),
    (dict(micro_batch_sizes=[0, 2]), "elasticity.micro_batch_sizes"),
    (dict(min_gpus=8, max_gpus=4), "max_gpus (4) is smaller than min_gpus (8)"),
    (dict(micro_batch_sizes=[4096]), "exceed max_train_batch_size"),
    (dict(max_gpu=3), "elasticity.max_gpu"),
    (dict(enabled=False), "elasticity is disabled"),
])
def test_bad_config_names_the_key(elastic, needle):
    with pytest.raises(ElasticityConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        compute_elastic_config(_cfg(**elastic), V)


def test_missing_section_and_old_target_version():
    with pytest.raises(ElasticityConfigError, match="'elasticity' is missing"):
        compute_elastic_config({"train_batch_size": 4}, V)
    with pytest.raises(ElasticityConfigError, match="older than 0.3.8"):
        compute_elastic_config(_cfg(), "0.3.0")
