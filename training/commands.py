"""``ficco train``, ``ficco evaluate``, ``ficco report``, ``ficco results`` and ``ficco retrain`` (and
``ficco export``, from ``training.export_command``); examples in docs/cli.md. Heavy imports (xgboost,
pandas, matplotlib) happen inside the commands.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ficco.errors import FAILURE, fail, fail_on_value_error
from ficco.features import DEFAULT_HARDWARE_ID, MODES
from ficco.files import SHIPPED, work_root, writable_model_root
from ficco.tables import text_table
from ficco.training.export_command import export_command
from ficco.training.options import (
    DatasetOption,
    ExtraOption,
    JobsOption,
    Learner,
    LearnerOption,
    RegistryOption,
    RepeatOption,
    SeedOption,
)

if TYPE_CHECKING:
    from ficco.features import HardwareProfile
    from ficco.harness.plan import Plan


RETRAIN_TOKENS = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
"""The token counts ``ficco retrain`` sweeps by default (rounded up to multiples of its world size)."""


class RetrainBackend(StrEnum):
    """Where ``ficco retrain`` measures (``--backend``); ``auto`` is ``gpu`` (see ``_retrain_backend``)."""

    auto = "auto"
    gpu = "gpu"
    sim = "sim"


def _registry(path: Path | None) -> Path:
    """``--registry``, else the registry the training commands read and write
    (``ficco.files.writable_model_root``: never an installed package's)."""
    return path or writable_model_root()


def _load(
    datasets: list[Path],
    repeats: list[Path] | None = None,
    extra: list[Path] | None = None,
    learner: Learner = Learner.sources,
) -> Any:
    """The datasets as ``training.dataset_table.load_dataset_table`` reads them, learned as ``learner``
    says (``pooled``: one host factor, refused for datasets of different label sources); the CLI's one
    error line for a bad dataset."""
    from ficco.training.dataset_table import load_dataset_table
    from ficco.training.promotion import pooled

    try:
        loaded = load_dataset_table(*datasets, repeats=repeats or (), extra=extra or ())
        return pooled(loaded) if learner == Learner.pooled else loaded
    except (OSError, ValueError) as err:
        named = " ".join(
            [
                *map(str, datasets),
                *(f"--repeat {r}" for r in repeats or ()),
                *(f"--extra {e}" for e in extra or ()),
            ]
        )
        raise fail(f"--dataset {named}: {err}") from None


def pickers_table(pickers: dict[str, dict[str, Any] | None]) -> str:
    """Picker -> metrics (None: not applicable) as a text table of ``training.metrics.REPORTED``."""
    from ficco.training.metrics import REPORTED, reported_cells

    rows = [[name, *(reported_cells(m) if m else ["n/a"] * len(REPORTED))] for name, m in pickers.items()]
    return text_table(["", *REPORTED], rows, align="<" + ">" * len(REPORTED), min_width=14)


def format_summary(summary: dict[str, Any]) -> str:
    """The evaluation summary as short text tables: per mode, every picker of the family holdout (then of
    its dense and MoE rows apart, when both are there), the region holdout's model line and the
    cross-validated choice."""
    lines = []
    for mode, result in summary["modes"].items():
        lines += [f"[{mode}] family holdout", pickers_table(result["family_holdout"])]
        for group, pickers in result.get("family_holdout_by_op_group", {}).items():
            lines += [f"[{mode}] family holdout, {group} ops only", pickers_table(pickers)]
        rescored = result.get("rescored", {})
        if rescored:
            regrets = ", ".join(
                f"{name} {rescored[name]['geomean_regret']:.4f}"
                for name in ("model", "first_sweep_best", "size_heuristic")
                if name in rescored
            )
            lines.append(
                f"[{mode}] family-holdout picks against the independent sweep "
                f"({rescored['model']['n_scenarios']} scenarios), "
                f"geomean regret: {regrets}"
            )
        region = result["region_holdout"].get("model")
        if region:
            lines.append(
                f"[{mode}] region holdout (largest GEMMs): model geomean regret "
                f"{region['geomean_regret']:.4f}, "
                f"in best set {region['in_best_set']:.3f}, max regret {region['max_regret']:.4f}"
            )
    cv = summary["cv"]
    lines.append(
        f"chosen config {cv['config']}, fallback {cv['policy']}; CV loss by config {cv['config_loss']}"
    )
    return "\n".join(lines)


def evaluate_command(
    dataset: DatasetOption,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object (nothing else on stdout).")
    ] = False,
    out: Annotated[
        Path | None, typer.Option("--out", help="Also write the JSON object to this file.")
    ] = None,
    transfer: Annotated[
        Path | None,
        typer.Option(
            "--transfer",
            help="A second dataset (e.g. another world size or other families): train on --dataset, test "
            "on this one's scenarios that --dataset does not hold.",
        ),
    ] = None,
    rescore: Annotated[
        Path | None,
        typer.Option(
            "--rescore",
            help="An independent sweep of (some of) --dataset's scenarios, from another session and not "
            "passed as --dataset or --repeat: the family-holdout picks are also scored against its labels, "
            "as an independent re-measurement would score them (under 'rescored').",
        ),
    ] = None,
    repeat: RepeatOption = None,
    extra: ExtraOption = None,
    learner: LearnerOption = Learner.sources,
    seed: SeedOption = 0,
    jobs: JobsOption = 1,
) -> None:
    """Evaluate the predictor on unseen scenarios, per execution mode: grouped cross-validation holding out
    whole model families (and grid regions), a split holding out the largest GEMMs, against the baselines
    (always serial, always shard/dma, the best fixed schedule, a FiCCO-style size heuristic, always PyTorch
    async-TP) and the noise ceiling (the re-measure's picks scored against the sweep)."""
    from ficco.training.evaluate import evaluate

    if rescore is not None and rescore.resolve() in {p.resolve() for p in [*dataset, *(repeat or [])]}:
        raise fail(f"--rescore {rescore} is also a --dataset or --repeat: its labels trained the model")
    loaded = _load(dataset, repeat, extra, learner)
    other = _load([transfer]) if transfer is not None else None
    independent = _load([rescore]).table if rescore is not None else None
    with fail_on_value_error():
        evaluation = evaluate(
            loaded.table, noise=loaded.noise, transfer=other.table if other else None,
            transfer_noise=other.noise if other else None, rescore=independent, seed=seed, n_jobs=jobs,
            progress=True,
        )  # fmt: skip
    summary = {**evaluation.summary, "dataset": loaded.info}
    if other is not None:
        summary["transfer_dataset"] = other.info
    if rescore is not None:
        summary["rescore_dataset"] = str(rescore)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(summary, indent=1) + "\n")
    typer.echo(json.dumps(summary, indent=1) if as_json else format_summary(summary))


def train_command(
    dataset: DatasetOption,
    registry: RegistryOption = None,
    promote: Annotated[
        bool,
        typer.Option(
            "--promote",
            help="Make the new version the current model if it beats the current model's recipe on the same "
            "rows and folds (lower held-out loss, no mode's regret worse beyond the refits' noise band, no "
            "more slow picks than vLLM's rule on its rows); the check and its numbers are printed.",
        ),
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="With --promote: promote without the check against the current.")
    ] = False,
    repeat: RepeatOption = None,
    extra: ExtraOption = None,
    learner: LearnerOption = Learner.sources,
    seed: SeedOption = 0,
    jobs: JobsOption = 1,
) -> None:
    """Train on the whole dataset with cross-validated hyper-parameters and decision policy, and register
    the model as `models/<hardware_id>/<UTC time>-<dataset hash>/` (`card.json` holds the metrics)."""
    from ficco.features.provenance import backend_of_id
    from ficco.harness.gaps import dataset_gaps, gaps_line
    from ficco.training.predict import registry as reg
    from ficco.training.train import register_trained, train_model

    loaded = _load(dataset, repeat, extra, learner)
    root = _registry(registry)
    with fail_on_value_error():
        trained = train_model(loaded.table, noise=loaded.noise, seed=seed, n_jobs=jobs, progress=True)
    typer.echo(format_summary(trained.evaluation.summary))
    verdict = None
    if promote and not force:
        verdict = _promotion_check(loaded, trained, root, seed=seed, jobs=jobs)
    model_id, version = register_trained(
        root,
        trained,
        loaded,
        seed=seed,
        learner=str(learner),
        promotion=verdict.to_dict() if verdict else None,
    )
    typer.echo(f"registered {model_id}/{version} ({backend_of_id(model_id)} model) under {root}")
    for path in loaded.paths:
        gaps = dataset_gaps(path)
        line = None if gaps is None else gaps_line(gaps)
        if line:
            typer.echo(f"data gaps: {line}")
    if promote and (verdict is None or verdict.better):
        reg.promote(root, model_id, version)
        typer.echo(f"promoted {model_id}/{version} to current")
    elif promote:
        typer.echo(f"not promoted: {verdict.reason} (--force promotes anyway)")


def _promotion_check(loaded: Any, trained: Any, root: Path, *, seed: int, jobs: int) -> Any:
    """The candidate against the current model's recipe on the same rows and folds
    (``training.promotion``), printed; None when there is no current model to compare with."""
    from ficco.features.provenance import registry_id, rows_backend
    from ficco.training.predict.registry import current_card
    from ficco.training.promotion import compare, current_recipe_evaluation, refit_band

    model_id = registry_id(loaded.hardware.id, rows_backend(loaded.info["backends"]))
    card = current_card(root, model_id)
    if card is None:
        typer.echo(f"no current {model_id} model: nothing to compare with")
        return None
    typer.echo(f"checking against the current {model_id} model's recipe on the same rows and folds ...")
    with fail_on_value_error():
        current = current_recipe_evaluation(loaded, card, seed=seed, n_jobs=jobs)
        band = refit_band(loaded.table, trained.choice, seed=seed, n_jobs=jobs)
    verdict = compare(trained.evaluation, current, band)
    rows = [
        [mode, f"{m['candidate_regret']:.2%}", f"{m['current_regret']:.2%}", f"+-{m['band']:.2%}",
         str(m["candidate_slow"]), str(m["current_slow"]),
         "n/a" if m["candidate_peer_slow"] is None
         else f"{m['candidate_slow_on_peer_rows']} vs {m['candidate_peer_slow']}"]
        for mode, m in verdict.modes.items()
    ]  # fmt: skip
    headers = ["mode", "regret", "current", "band", "slow picks", "current", "slow vs vLLM's rule"]
    typer.echo(text_table(headers, rows))
    typer.echo(("better: " if verdict.better else "not better: ") + verdict.reason)
    return verdict


def report_command(
    dataset: DatasetOption,
    out: Annotated[Path, typer.Option("--out", help="Directory for report.md and its PNG plots.")],
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="Registered version (or 'current') of the dataset's hardware whose recommendations the "
            "schedule maps show. Default: the held-out cross-validation picks.",
        ),
    ] = None,
    registry: RegistryOption = None,
    repeat: RepeatOption = None,
    seed: SeedOption = 0,
    jobs: JobsOption = 1,
) -> None:
    """Write a markdown report with PNG plots: per mode, the confusion matrix of held-out picks, regret CDFs
    of the model, the baselines and the noise ceiling in one plot, and the predicted schedule map next to
    the measured one per op."""
    from ficco.training.evaluate import evaluate
    from ficco.training.predict.registry import ModelLoadError, load_predictor
    from ficco.training.report import write_report

    loaded = _load(dataset, repeat)
    predicted, label = None, "predicted (held out)"
    if model is not None:
        try:
            predictor = load_predictor(
                _registry(registry), loaded.hardware.id, None if model == "current" else model
            )
        except ModelLoadError as err:
            raise fail(str(err)) from None
        table = loaded.table  # the model asked for the host of the machine that measured the dataset
        predicted = predictor.decide(table.X, table.modes, host_factor=table.host_factors).final
        label = f"model {predictor.version} (may have trained on these)"
    evaluation = evaluate(loaded.table, noise=loaded.noise, seed=seed, n_jobs=jobs, progress=True)
    path = write_report(
        loaded.table, evaluation, out,
        title=f"ficco predictor on {loaded.info['path']} ({loaded.hardware.id})",
        predicted=predicted, predicted_label=label,
    )  # fmt: skip
    typer.echo(f"report: {path}")


def results_command(
    out: Annotated[Path, typer.Option("--out", help="Where to write the page.")] = Path("docs/results.md"),
) -> None:
    """Write the results page from a source checkout's committed evaluations and benchmark results
    (``python -m benchmarks.results_page``, developer tooling an installed ficco does not hold)."""
    import subprocess
    import sys

    from ficco import CHECKOUT

    if CHECKOUT is None or not (CHECKOUT / "benchmarks" / "results_page.py").is_file():
        message = "ficco results renders the page from a source checkout's committed results: run it in one"
        raise fail(message, FAILURE)
    out.parent.mkdir(parents=True, exist_ok=True)  # a path that cannot be written: the CLI's one error line
    command = [sys.executable, "-m", "benchmarks.results_page", "--out", str(out.resolve())]
    raise typer.Exit(subprocess.run(command, cwd=CHECKOUT).returncode)


def retrain_command(
    hardware: Annotated[
        str,
        typer.Option(
            "--hardware",
            help="Hardware profile id (h200x2, h100x8, or a custom one registered before) or a "
            "HardwareProfile JSON file (registers its id): the machine, or the what-if.",
        ),
    ] = DEFAULT_HARDWARE_ID,
    backend: Annotated[
        RetrainBackend,
        typer.Option(
            "--backend",
            help="gpu: sweep this machine's GPUs through torchrun (a measured model, registered under "
            "--hardware); sim: the analytic model of --hardware (a simulated model, registered apart under "
            "<hardware>-sim, never over a measured one); auto: gpu, and without GPUs a stop that names "
            "--backend sim.",
        ),
    ] = RetrainBackend.auto,
    budget: Annotated[
        int,
        typer.Option(
            "--budget",
            min=0,
            help="Measure only this many scenarios, the most informative ones (0: the whole plan).",
        ),
    ] = 0,
    budget_minutes: Annotated[
        float,
        typer.Option(
            "--budget-minutes",
            min=0.0,
            help="Measure for this many device-minutes, in the order of what each scenario teaches (the "
            "prior's uncertainty and the spread over the plan), checkpointing a model into OUT/checkpoints "
            "as it goes, then train on top of the prior (0: the whole plan, no prior). The same command "
            "again continues. Simulated sweeps count the simulator's estimate of the GPU time.",
        ),
    ] = 0.0,
    checkpoint_minutes: Annotated[
        float,
        typer.Option(
            "--checkpoint-minutes",
            min=0.0,
            help="With --budget-minutes: device-minutes before the first checkpoint; the next at twice, four "
            "times, ... that, and at the budget (0: only at the budget).",
        ),
    ] = 1.0,
    prior: Annotated[
        list[Path] | None,
        typer.Option(
            "--prior",
            help="With --budget-minutes: a measured dataset of another machine for the prior (repeat it). "
            "Default: the datasets of the other machines' current models in the registry. The simulator of "
            "--hardware always joins.",
            show_default=False,
        ),
    ] = None,
    no_prior: Annotated[
        bool,
        typer.Option("--no-prior", help="With --budget-minutes: train on the new rows alone, no prior."),
    ] = False,
    order_only: Annotated[
        bool,
        typer.Option(
            "--order-only",
            help="With --budget-minutes: write the prior and the order (OUT/order.json) and stop, for a "
            "fleet to measure (`ficco fleet run --order OUT/order.json ...`, docs/fleet.md).",
        ),
    ] = False,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Dataset directory to write. Default: runs/retrain/<hardware>-<backend>-<UTC time> in "
            "the checkout (installed: in ~/.local/share/ficco).",
        ),
    ] = None,
    registry: RegistryOption = None,
    configs: Annotated[
        Path,
        typer.Option("--configs", help="Directory of Hugging Face config.json files, one per model family."),
    ] = SHIPPED / "datasets" / "model_configs",
    tp: Annotated[
        int | None,
        typer.Option(
            "--tp", help="World size of every scenario, 2 to --hardware's GPU count. Default: the GPU count."
        ),
    ] = None,
    tokens: Annotated[
        str | None,
        typer.Option(
            "--tokens",
            help="Comma-separated token counts per layer call, each a multiple of --tp. Default: "
            f"{','.join(map(str, RETRAIN_TOKENS))}, each rounded up to a multiple of --tp.",
        ),
    ] = None,
    grid: Annotated[
        int, typer.Option("--grid", min=0, help="Log-uniform grid scenarios added to the model ones.")
    ] = 260,
    noise: Annotated[
        float, typer.Option("--noise", min=0.0, max=1.0, help="Sim only: log-normal noise on every time.")
    ] = 0.01,
    seed: Annotated[
        int,
        typer.Option("--seed", help="Seed of the grid, the sim noise and XGBoost (same seed, same model)."),
    ] = 0,
    jobs: JobsOption = 1,
) -> None:
    """Measure a sweep on this machine (or simulate one for --hardware), train a model on it, compare it
    with the current model on the new data, register it and promote it only if it is better."""
    from ficco.features.provenance import MEASURED, SIMULATED, backend_of_id, registry_id
    from ficco.harness.launch import build_plan, check_tp, hardware_profile, parse_tokens
    from ficco.training.metrics import REPORTED
    from ficco.training.predict.registry import ModelLoadError, load_predictor
    from ficco.training.retrain import (
        ORDER_FILE,
        informative_subset,
        load_prior,
        prior_datasets,
        retrain,
        retrain_within,
        write_order,
    )

    root = _registry(registry)
    hw = hardware_profile(hardware, root)
    backend = _retrain_backend(backend, hw)
    tp = check_tp(tp or hw.gpu_count, hw)
    token_list = parse_tokens(tokens, tp, RETRAIN_TOKENS)
    model_id = registry_id(hw.id, SIMULATED if backend is RetrainBackend.sim else MEASURED)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = out or work_root() / "runs" / "retrain" / f"{hw.id}-{backend.value}-{stamp}"
    try:
        current = load_predictor(root, model_id)
    except ModelLoadError as err:
        typer.echo(f"current model: none usable ({err})", err=True)
        current = None
    plan = build_plan(
        configs, hw, tp=tp, tokens=token_list, grid=grid, include_moe=backend is RetrainBackend.sim, seed=seed
    )
    measure = _measure_gpu(tp) if backend is RetrainBackend.gpu else _measure_sim(hw, seed, noise)
    log = lambda text: typer.echo(text, err=True)  # noqa: E731
    if budget and budget_minutes:
        raise fail("give --budget (scenarios) or --budget-minutes (device time), not both")
    if budget_minutes:
        typer.echo(f"retrain {model_id} on {backend.value}: {budget_minutes:g} device-minutes of a "
                   f"{len(plan)}-scenario plan -> {out}", err=True)  # fmt: skip
        with fail_on_value_error():
            datasets = [] if no_prior else (prior if prior is not None else prior_datasets(root, hw.id))
            the_prior = None if no_prior else load_prior(plan, out, datasets=datasets, seed=seed, n_jobs=jobs,
                                                        log=log)  # fmt: skip
            if order_only:
                ordered_plan, _ = write_order(plan, the_prior, out)
                typer.echo(f"wrote {out / ORDER_FILE}: {len(ordered_plan)} scenarios in the order to measure")
                return
            outcome = retrain_within(
                plan, out, measure, budget_minutes=budget_minutes, prior=the_prior, registry=root,
                current=current, simulated=backend is RetrainBackend.sim,
                checkpoint_minutes=checkpoint_minutes, seed=seed, n_jobs=jobs, log=log,
            )  # fmt: skip
    else:
        plan = informative_subset(plan, budget, current)
        typer.echo(f"retrain {model_id} on {backend.value}: {len(plan)} scenarios -> {out}", err=True)
        with fail_on_value_error():
            outcome = retrain(plan, out, measure, registry=root, current=current, seed=seed, n_jobs=jobs,
                              log=log)  # fmt: skip
    if "modes" in outcome.new_metrics:
        typer.echo(format_summary(outcome.new_metrics))
    else:
        typer.echo(f"chose {outcome.new_metrics['choice']} (held-out loss by candidate: "
                   f"{outcome.new_metrics['cv_loss']})")  # fmt: skip
    if outcome.current_metrics is not None:
        cur = outcome.current_metrics
        typer.echo(
            f"current model {current.version} on the new data: "
            + ", ".join(f"{k} {cur[k]:.4f}" for k in REPORTED[:5])
        )
    verdict = "promoted to current" if outcome.promoted else "registered, not promoted"
    kind = backend_of_id(outcome.model_id)
    typer.echo(f"{outcome.model_id}/{outcome.version} ({kind} model): {verdict} ({outcome.reason})")
    if kind == SIMULATED:
        typer.echo(
            f"a simulated model answers only when asked for by its id, e.g. `ficco recommend --hardware "
            f"{outcome.model_id} ...`; the measured model of {hw.id} is untouched"
        )


def _retrain_backend(backend: RetrainBackend, hw: HardwareProfile) -> RetrainBackend:
    """``gpu`` or ``sim``: ``auto`` is ``gpu``; ``gpu`` on a machine of fewer than 2 GPUs, or of other GPUs
    than ``hw``'s, stops with one line (a measured model is only ever trained on measurements of its GPUs,
    and a simulated one only when asked for)."""
    from ficco.features.provenance import SIMULATED, registry_id
    from ficco.harness.launch import check_machine_gpus, gpu_names

    if backend is RetrainBackend.sim:
        return backend
    names = gpu_names()
    if len(names) < 2:
        raise fail(
            f"retrain measures on GPUs and nvidia-smi lists {len(names)} here: run it on a machine with "
            f"{hw.id}'s GPUs, or pass --backend sim to train a simulated model (registered apart as "
            f"{registry_id(hw.id, SIMULATED)}; the measured {hw.id} model stays)"
        )
    check_machine_gpus(hw)  # before the plan and the current model are read
    return RetrainBackend.gpu


def _measure_sim(hw: HardwareProfile, seed: int, noise: float) -> Callable[..., None]:
    """Measurement by the simulator of ``hw`` (in this process): ``measure(plan, out, deadline=None)``."""

    def measure(plan: Plan, out: Path, deadline: float | None = None) -> None:
        from ficco.harness.sim import SimBackend
        from ficco.harness.sweep import run_sweep

        run_sweep(plan, SimBackend(hw, seed=seed, noise=noise), out, deadline=deadline)

    return measure


def _measure_gpu(tp: int) -> Callable[..., None]:
    """Measurement on this machine's GPUs: the harness sweep under torchrun, one process per GPU;
    ``measure(plan, out, deadline=None)`` starts no scenario after ``deadline`` (``time.time()``)."""

    def measure(plan: Plan, out: Path, deadline: float | None = None) -> None:
        from ficco.harness.launch import BenchBackend, WorkerSettings, run_torchrun

        # The dataset protocol's defaults (rounds, block length), no re-measure.
        settings = WorkerSettings(modes=MODES, deadline=deadline)
        run_torchrun(plan, out, backend=BenchBackend.gpu, tp=tp, nproc=None, settings=settings)

    return measure


def register(app: typer.Typer) -> None:
    """Add ``train``, ``evaluate``, ``report``, ``results`` and ``retrain`` to ``app``."""
    app.command("train")(train_command)
    app.command("evaluate")(evaluate_command)
    app.command("report")(report_command)
    app.command("results")(results_command)
    app.command("retrain")(retrain_command)
    app.command("export")(export_command)
