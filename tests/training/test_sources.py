"""Label sources in training: datasets of several sources keep theirs, the pooled learner refuses to mix
them, extra rows never move the target's folds and weigh what cross-validation chooses, and answers ask at
the running executor's label version."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from ficco.features.label_source import LABEL_VERSION
from ficco.training.crossval import cross_validate, cv_folds, cv_groups
from ficco.training.dataset_table import concat_tables, load_dataset_table
from ficco.training.fit import EXTRA_WEIGHTS, TrainConfig, configs_for, fit_pair_model
from ficco.training.model import LABEL_VERSION_NAME, PAIR_FEATURE_NAMES, pair_costs, pair_matrix
from ficco.training.promotion import pooled

RATIO = TrainConfig(objective="ratio", max_depth=3, n_estimators=20, learning_rate=0.3)


def as_measured(src: Path, dst: Path, protocol: dict, gpu: str = "NVIDIA H200") -> Path:
    """A copy of simulated dataset ``src`` whose manifest says it was measured on GPUs under ``protocol``."""
    shutil.copytree(src, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    manifest["backend"] = "gpu"
    manifest["protocol"] = protocol
    manifest["fingerprint"] = {"backend": "gpu", "gpu_name": gpu, "gpu_count": 2, "world_size": 2}
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


@pytest.fixture(scope="module")
def two_sources(sim_dataset, sim_moe_dataset, tmp_path_factory):
    """The dense simulated dataset as a label-version-2 sweep and the MoE one as a version-3 sweep."""
    root = tmp_path_factory.mktemp("sources")
    old = as_measured(sim_dataset, root / "old", {"max_rounds": 96, "eager_timed_factor": 3.0})
    new = as_measured(sim_moe_dataset, root / "new", {"max_rounds": 96, "copy_streams": "1"})
    return old, new


def test_extra_datasets_keep_their_label_source_and_host_factor_and_are_not_scored(two_sources):
    old, new = two_sources
    alone = load_dataset_table(old)
    both = load_dataset_table(old, extra=[new])
    table = both.table
    assert alone.table.is_target.all()
    assert table.is_target.sum() == len(alone.table) and (~table.is_target).sum() > 0
    assert sorted(s.label_version for s in table.label_sources) == [2, 3]
    np.testing.assert_array_equal(np.unique(table.label_versions[table.is_target]), [2.0])
    np.testing.assert_array_equal(np.unique(table.label_versions[~table.is_target]), [3.0])
    extra_factor = load_dataset_table(new).table.host_factor
    np.testing.assert_allclose(table.host_factors[~table.is_target], extra_factor)
    roles = {(Path(s["path"]).name, s["role"], s["label_version"]) for s in both.info["sources"]}
    assert roles == {("old", "target", 2), ("new", "extra", 3)}
    assert both.info["extra"] == [str(new)] and both.hash != alone.hash


def test_the_pooled_learner_refuses_datasets_of_different_sources_in_one_line(two_sources):
    old, new = two_sources
    with pytest.raises(ValueError, match=r"label_version 2 vs 3") as err:
        pooled(load_dataset_table(old, new))
    message = str(err.value)
    assert "\n" not in message and str(old) in message and str(new) in message and "copy_streams" in message
    one = pooled(load_dataset_table(old))  # one source: the rows at the target's one host factor
    assert len(np.unique(one.table.host_factors)) == 1


def test_the_train_command_refuses_the_pooled_learner_naming_both_datasets(two_sources, tmp_path):
    from typer.testing import CliRunner

    from ficco.cli import app

    old, new = two_sources
    args = ["train", "--dataset", str(old), "--dataset", str(new), "--learner", "pooled"]
    result = CliRunner().invoke(app, [*args, "--model-root", str(tmp_path)])
    assert result.exit_code == 2
    line = result.output.strip()
    assert line.count("\n") == 0 and "different label sources" in line and "label_version 2 vs 3" in line


def test_extra_rows_never_move_the_target_rows_groups_or_folds(table):
    """Rows added to a table take the groups and folds the target rows alone give."""
    extra = dataclasses.replace(table.subset(table.families == "grid"), target=None)
    scaled = dataclasses.replace(extra, X=extra.X.copy())
    combined = concat_tables(table, scaled)
    combined = dataclasses.replace(combined, target=np.arange(len(combined)) < len(table))
    groups, alone = cv_groups(combined), cv_groups(table)
    np.testing.assert_array_equal(groups[: len(table)], alone)
    folds = cv_folds(groups, target=combined.is_target)
    np.testing.assert_array_equal(folds[: len(table)], cv_folds(alone))
    other = combined.families[len(table) :]
    assert set(groups[len(table) :]) <= set(alone) and len(other)
    orphan = dataclasses.replace(
        table.subset(np.arange(4)), families=np.array(["new-family"] * 4, dtype=object)
    )
    lonely = concat_tables(table, orphan)
    lonely = dataclasses.replace(lonely, target=np.arange(len(lonely)) < len(table))
    assert set(cv_folds(cv_groups(lonely), target=lonely.is_target)[len(table) :]) == {-1}  # never held out


def test_extra_weight_zero_is_the_target_alone_and_cross_validation_tries_the_weights(table):
    extra = dataclasses.replace(table.subset(np.arange(40)), times_ms=table.times_ms[:40] * 1.7)
    combined = concat_tables(table, extra)
    combined = dataclasses.replace(combined, target=np.arange(len(combined)) < len(table))
    without = fit_pair_model(combined, dataclasses.replace(RATIO, extra_weight=0.0), seed=0, n_jobs=1)
    alone = fit_pair_model(table, RATIO, seed=0, n_jobs=1)
    np.testing.assert_array_equal(
        pair_costs(without, table.X, table.modes), pair_costs(alone, table.X, table.modes)
    )
    light = fit_pair_model(combined, dataclasses.replace(RATIO, extra_weight=0.3), seed=0, n_jobs=1)
    assert not np.array_equal(
        pair_costs(light, table.X, table.modes), pair_costs(alone, table.X, table.modes)
    )
    assert configs_for(table, (RATIO,)) == (RATIO,)  # no extra rows: nothing to weigh
    tried = configs_for(combined, (RATIO,))
    assert [c.extra_weight for c in tried] == list(EXTRA_WEIGHTS) and tried[1].key().endswith(",x0.3")


@pytest.mark.heavy
def test_cross_validation_scores_target_rows_only_and_chooses_an_extra_weight(table, fast_policies):
    shuffled = np.random.default_rng(0).permutation(len(table))  # labels of other scenarios: pure noise
    noisy = dataclasses.replace(table, times_ms=table.times_ms[shuffled], target=None)
    combined = concat_tables(table, noisy)
    combined = dataclasses.replace(combined, target=np.arange(len(combined)) < len(table))
    cv = cross_validate(combined, configs=(RATIO,), policies=fast_policies[:1], seed=0)
    loss = cv.config_loss  # shuffled labels only hurt the target's held-out picks: they weigh less
    assert loss["ratio,d3,n20,lr0.3"] > max(loss["ratio,d3,n20,lr0.3,x0.3"], loss["ratio,d3,n20,lr0.3,x0"])
    assert cv.choice.config.extra_weight < 1.0
    assert set(cv.folds[: len(table)]) == set(cv_folds(cv_groups(table)))


def test_pairs_carry_the_label_version_and_answers_ask_at_the_running_executor(table):
    assert LABEL_VERSION_NAME in PAIR_FEATURE_NAMES
    column = PAIR_FEATURE_NAMES.index(LABEL_VERSION_NAME)
    Z, _ = pair_matrix(table.X[:3], table.modes[:3])
    np.testing.assert_array_equal(Z[:, column], LABEL_VERSION)
    Z, (rows, _) = pair_matrix(table.X[:3], table.modes[:3], label_version=np.array([1.0, 2.0, 3.0]))
    np.testing.assert_array_equal(Z[:, column], np.array([1.0, 2.0, 3.0])[rows])


def test_a_model_learns_what_a_newer_executor_changed_and_answers_for_it(table):
    """The same scenarios under two label versions, shard/dma 1.5x slower under the older: the model answers
    at the running executor's version as the newer labels say, and at the older one as those say."""
    from ficco.features import SCHEDULE_INDEX
    from ficco.features.label_source import LabelSource

    def version(t, v):
        source = LabelSource(backend="gpu", label_version=v, gpu_name="NVIDIA H200", world_size=2,
                             host_factor=1.0, settings={}, fingerprint={})  # fmt: skip
        return dataclasses.replace(t, label_sources=(source,), sources=np.zeros(len(t), dtype=np.int64))

    shard = SCHEDULE_INDEX["shard/dma"]
    older = table.times_ms.copy()
    older[:, shard] *= 1.5
    both = concat_tables(
        version(dataclasses.replace(table, times_ms=older), 1), version(table, LABEL_VERSION)
    )
    strong = TrainConfig(objective="ratio", max_depth=6, n_estimators=150, learning_rate=0.3)
    model = fit_pair_model(both, strong, seed=0, n_jobs=1)
    now = pair_costs(model, table.X, table.modes)[:, shard]
    before = pair_costs(model, table.X, table.modes, label_version=1.0)[:, shard]
    assert np.median(before - now) == pytest.approx(np.log(1.5), abs=0.1)


def test_a_repeat_of_another_executor_is_refused_and_one_of_other_round_counts_pools(sim_dataset, tmp_path):
    target = as_measured(sim_dataset, tmp_path / "v2", {"max_rounds": 96, "eager_timed_factor": 3.0})
    rounds = as_measured(sim_dataset, tmp_path / "v1", {"max_rounds": 24})
    executor = as_measured(sim_dataset, tmp_path / "v3", {"max_rounds": 96, "copy_streams": "1"})
    pooled_labels = load_dataset_table(target, repeats=[rounds])  # versions 1 and 2: only the rounds differ
    assert pooled_labels.info["repeats"] == [str(rounds)]
    with pytest.raises(ValueError, match=r"repeat .*v3 and dataset .*v2 have different label sources") as err:
        load_dataset_table(target, repeats=[executor])
    assert "label_version 2 vs 3" in str(err.value) and "--extra" in str(err.value)


@pytest.mark.heavy
def test_promotion_compares_on_the_same_rows_and_states_the_band(two_sources, tmp_path):
    """`ficco train --promote` against a current model of another recipe: the check's table is printed, the
    verdict kept in the card, and a candidate that is not better is registered but not promoted."""
    from typer.testing import CliRunner

    from ficco.cli import app
    from ficco.training.predict.registry import current_version

    old, new = two_sources
    runner = CliRunner()
    first = runner.invoke(app, ["train", "--dataset", str(old), "--model-root", str(tmp_path), "--promote"])
    assert first.exit_code == 0, first.output
    assert "nothing to compare with" in first.output
    model_id = next(p.name for p in tmp_path.iterdir() if p.is_dir())  # h200x2-sim: the rows are simulated
    before = current_version(tmp_path, model_id)
    again = runner.invoke(
        app, ["train", "--dataset", str(old), "--extra", str(new), "--model-root", str(tmp_path), "--promote"]
    )
    assert again.exit_code == 0, again.output
    assert "on the same rows and folds" in again.output and "band" in again.output
    cards = sorted((tmp_path / model_id).glob("*/card.json"))
    card = json.loads(cards[-1].read_text())
    check = card["promotion"]
    assert set(check["modes"]) <= {"eager", "graph"} and check["rows"] > 0
    assert all(m["band"] >= 0 for m in check["modes"].values())
    promoted = current_version(tmp_path, model_id) != before
    assert promoted == check["better"] and ("not promoted" in again.output) == (not check["better"])
    assert card["learner"] == "sources" and card["dataset"]["extra"] == [str(new)]


def _evaluation(regret: float, loss: float, slow_on_peer_rows: int, peer_slow: int = 3):
    """An ``Evaluation`` whose summary holds only what promotion compares (one mode, graph)."""
    from ficco.training.evaluate import Evaluation

    model = {"loss": loss, "geomean_regret": regret, "n_slower_than_serial_2pct": 9, "n_scenarios": 297}
    holdout = {
        "model": model,
        "vllm_sp_rule": {"n_slower_than_serial_2pct": peer_slow},
        "model_on_async_tp_rows": {"n_slower_than_serial_2pct": slow_on_peer_rows},
    }
    return Evaluation(summary={"modes": {"graph": {"family_holdout": holdout}}}, cv=None, regrets={})


def test_promotion_holds_the_peer_rules_bar_or_the_current_models_where_it_already_misses_it():
    from ficco.training.promotion import compare

    band = {"graph": 0.002}
    # the current model has 6 slow picks on the rule's rows (the rule: 3): a candidate with 6 may replace it
    ok = compare(_evaluation(0.010, 0.010, 6), _evaluation(0.012, 0.012, 6), band)
    assert ok.better, ok.reason
    # ... one with more than the current's may not, and the reason names both counts
    worse = compare(_evaluation(0.010, 0.010, 7), _evaluation(0.012, 0.012, 6), band)
    assert (
        not worse.better
        and "7 slow picks" in worse.reason
        and "its 3 and the current model's 6" in worse.reason
    )
    # where the current model meets the rule's bar, the candidate is held to the rule's count
    held = compare(_evaluation(0.010, 0.010, 4), _evaluation(0.012, 0.012, 2), band)
    assert not held.better and "4 slow picks" in held.reason
    # regret worse beyond the band refuses whatever the loss
    noisy = compare(_evaluation(0.015, 0.009, 2), _evaluation(0.012, 0.012, 2), band)
    assert not noisy.better and "graph regret" in noisy.reason


def test_a_model_answers_only_the_world_sizes_of_its_target_rows(two_sources):
    """Extra rows of another world size teach the model but do not make it answer that world size."""
    from ficco.features.hardware import get_hardware
    from ficco.training.train import answered_world_sizes

    old, new = two_sources
    x4 = get_hardware("h200x4")
    table = load_dataset_table(old, extra=[new]).table
    at_four = tuple(
        s if target else dataclasses.replace(s, hardware=x4, world_size=4)
        for s, target in zip(table.scenarios, table.is_target, strict=True)
    )
    assert answered_world_sizes(dataclasses.replace(table, scenarios=at_four)) == [2]
    flipped = dataclasses.replace(table, scenarios=at_four, target=~table.is_target)
    assert answered_world_sizes(flipped) == [4]
