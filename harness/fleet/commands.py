"""``ficco fleet run|emit|shard``: one sweep's shards on a Ray cluster, as a Slurm or Kubernetes job, or one
of them here (``ficco dataset gather`` unions them). Every option of a fleet verb besides its own is an
option of the ``ficco bench`` sweep it splits (docs/fleet.md)::

    ficco fleet run auto --shards 16 --tp 8 --hardware h100x8 --out /shared/h100x8
    ficco fleet emit slurm --shards 16 --tp 8 --hardware h100x8 --out /shared/h100x8
    ficco fleet shard --shard 2/16 --tp 8 --hardware h100x8 --out /shared/h100x8
    ficco dataset gather /shared/h100x8/shards --out /shared/h100x8
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ficco.errors import FAILURE, fail, fail_on_value_error
from ficco.harness.fleet.emit import Engine

if TYPE_CHECKING:
    import click

    from ficco.harness.commands import SweepJob
    from ficco.harness.fleet.shards import Shard, ShardedSweep

PASS_ON = {"context_settings": {"ignore_unknown_options": True}}
"""Typer settings of a fleet verb: the options it does not know are the sweep's (``ficco bench``'s)."""
BenchOptions = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="BENCH_OPTION",
        help="The sweep: any `ficco bench` option (--tp, --hardware, --out, --ops, ...).",
        show_default=False,
    ),
]


def _address(value: str) -> str:
    """``ADDRESS`` unless it is an option (the address goes first: later, an option's value would be read)."""
    if value.startswith("-"):
        raise typer.BadParameter(f"the address comes first (`ficco fleet run ADDRESS ...`); got {value!r}")
    return value


ShardsOption = Annotated[
    int, typer.Option(min=0, max=100_000, help="Shards (run: 0 = one per node that fits; emit: >= 1).")
]
ShareNodesOption = Annotated[
    bool,
    typer.Option(
        "--share-nodes",
        help="Let shards share a GPU node (--tp GPUs each) instead of holding it whole: faster, but "
        "co-tenants share NVLink and host, which disturbs overlap timing (the card says so).",
    ),
]
RetriesOption = Annotated[int, typer.Option(min=0, max=100, help="Retries of a failed shard (Ray, k8s).")]
OrderOption = Annotated[
    Path | None,
    typer.Option(
        "--order",
        help="Measure the plan in this order (the order.json `ficco retrain --budget-minutes M --order-only` "
        "writes: what each scenario teaches first); each shard keeps it, so a --time-budget stops every "
        "shard after its most useful scenarios.",
        show_default=False,
    ),
]


def run(
    address: Annotated[
        str,
        typer.Argument(
            callback=_address,
            metavar="ADDRESS",
            help="The Ray cluster: auto (the running one), local (start one here) or a head's HOST:PORT.",
        ),
    ],
    bench: BenchOptions = None,
    shards: ShardsOption = 0,
    share_nodes: ShareNodesOption = False,
    max_retries: RetriesOption = 3,
    order: OrderOption = None,
) -> None:
    """Run every shard of the sweep as a Ray task, each in a placement group of one node, retried and resumed
    when it fails, then gather them into --out (needs ficco\\[fleet])."""
    from ficco.harness.fleet import ray_tasks
    from ficco.harness.fleet.gather import gather

    job, argv = _sweep(bench, order)
    try:
        ray_tasks.connect(address)
        count = shards or ray_tasks.default_shards(job.backend.value, job.plan.settings["tp"], share_nodes)
        typer.echo(f"ray: {count} shards of {len(job.plan)} scenarios", err=True)
        sweep = _sharded(job, count, share_nodes=share_nodes, max_retries=max_retries)
        dirs = ray_tasks.run_on_ray(address, sweep, argv=argv, scenarios=len(job.plan))
        done = gather(dirs, sweep.out)
    except ConnectionError as err:  # no cluster to run on: a failure, not a bad value
        raise fail(str(err), FAILURE) from None
    except (ValueError, RuntimeError) as err:
        raise fail(str(err)) from None
    typer.echo(
        f"gathered {done.shards} shards into {done.out}: {done.rows} rows, content hash {done.rows_hash[:16]}"
    )


def emit(
    engine: Annotated[
        Engine, typer.Argument(help="slurm: a job array script; k8s: an indexed Job manifest.")
    ],
    bench: BenchOptions = None,
    shards: ShardsOption = 0,
    share_nodes: ShareNodesOption = False,
    max_retries: RetriesOption = 3,
    image: Annotated[str, typer.Option(help="Container image of k8s (ficco with a CUDA torch).")] = (
        "ficco-bench:latest"
    ),
    order: OrderOption = None,
) -> None:
    """Write the job that runs the sweep's shards on a cluster scheduler into OUT/shards/, and print the
    gather command to run once every shard has finished."""
    from ficco.harness.fleet.emit import gather_command, write_job

    job, argv = _sweep(bench, order)
    if shards < 1:
        raise fail("ficco fleet emit needs --shards N (N >= 1)")
    head = [sys.executable, "-m", "ficco.cli"] if engine is Engine.slurm else ["ficco"]
    sweep = _sharded(job, shards, share_nodes=share_nodes, max_retries=max_retries)
    command = [*head, "fleet", "shard", *argv, "--out", str(sweep.out)]
    path = write_job(engine, command, sweep, hardware_id=job.hardware.id, image=image)
    typer.echo(f"wrote {path} ({shards} shards of {len(job.plan)} scenarios)")
    typer.echo(f"after every shard has finished: {gather_command(sweep.out)}")


def shard(
    bench: BenchOptions = None,
    shard: Annotated[
        str | None,
        typer.Option(
            help="Which shard, I/N (0 <= I < N; balanced by estimated GPU time). Default: from "
            "SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_COUNT, or JOB_COMPLETION_INDEX and FICCO_SHARD_COUNT.",
        ),
    ] = None,
    order: OrderOption = None,
) -> None:
    """Measure one shard of the sweep into OUT/shards/shard-I-of-N, continuing it if started (what `ficco
    fleet run` and the jobs of `ficco fleet emit` run on each node)."""
    from ficco.harness.commands import measure
    from ficco.harness.fleet.emit import gather_command

    job, _ = _sweep(bench, order)
    part = _shard(shard)
    job = shard_job(job, part)
    measure(job)
    typer.echo(f"shard {part}: {job.out}; once every shard is done: {gather_command(job.out.parents[1])}")


def _sweep(args: list[str] | None, order: Path | None = None) -> tuple[SweepJob, list[str]]:
    """The sweep of the ``ficco bench`` options ``args`` (its plan in ``order``'s order when given), and
    the options a shard's command repeats (:func:`forwarded_options`, and ``--order``)."""
    from ficco.harness.commands import parse_sweep
    from ficco.harness.fleet.shards import in_order

    job, bench = parse_sweep(args or [])
    argv = forwarded_options(bench)
    if order is not None:
        try:
            keys = list(json.loads(order.read_text())["order"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise fail(f"--order {order}: not an order.json ({type(err).__name__}: {err})") from None
        with fail_on_value_error():
            job = dataclasses.replace(job, plan=in_order(job.plan, keys, source=str(order)))
        argv += ["--order", str(order.resolve())]
    return dataclasses.replace(job, out=job.out.resolve()), argv


def forwarded_options(ctx: click.Context) -> list[str]:
    """The ``ficco bench`` options of ``ctx`` that each shard's command repeats: those given on the command
    line or in the environment (less ``--out``: the fleet gives it), paths made absolute."""
    argv: list[str] = []
    for param in ctx.command.params:
        name = param.name
        source = ctx.get_parameter_source(name)
        if param.param_type_name != "option" or name == "out" or source is None or source.name == "DEFAULT":
            continue
        value = ctx.params[name]
        if param.is_flag:
            argv += [param.opts[0]] if value else []
            continue
        if isinstance(value, Path) or (name == "hardware" and str(value).endswith(".json")):
            value = Path(value).resolve()
        argv += [param.opts[0], str(getattr(value, "value", value))]
    return argv


def _sharded(job: SweepJob, shards: int, *, share_nodes: bool, max_retries: int) -> ShardedSweep:
    """The ``ShardedSweep`` of ``job`` in ``shards`` shards."""
    from ficco.harness.fleet.shards import ShardedSweep

    return ShardedSweep(
        out=job.out, shards=shards, backend=job.backend.value, world_size=job.plan.settings["tp"],
        share_nodes=share_nodes, max_retries=max_retries,
    )  # fmt: skip


def _shard(value: str | None) -> Shard:
    """The shard of ``--shard``, else of the job array's environment (``shards.shard_from_env``)."""
    import os

    from ficco.harness.fleet.shards import Shard, shard_from_env

    try:
        part = Shard.parse(value) if value is not None else shard_from_env(os.environ)
    except ValueError as err:
        raise fail(f"--shard: {err}") from None
    if part is None:
        raise fail("give --shard I/N, or run in a Slurm job array or a Kubernetes indexed Job")
    return part


def shard_job(job: SweepJob, part: Shard) -> SweepJob:
    """Shard ``part`` of ``job``: its part of the plan, its directory (refused if it holds another plan's
    shard), its share of the re-measure; records the run."""
    from ficco.features.dataset import PLAN, read_manifest
    from ficco.harness.fleet.shards import plan_hash, record_run, shard_dir, shard_plan
    from ficco.harness.plan import scenario_seconds

    plan, settings = job.plan, job.settings
    costs = scenario_seconds(plan, job.hardware, modes=settings.modes, timing=settings.timing)
    sub = shard_plan(plan, part, costs)
    directory = shard_dir(job.out, part)
    if (directory / PLAN).is_file():
        before = json.loads((directory / PLAN).read_text())["settings"].get("shard", {})
        if before.get("plan_hash") != plan_hash(sub):
            raise fail(
                f"{directory} holds shard {part} of another plan (hash {str(before.get('plan_hash'))[:16]}, "
                f"this one {plan_hash(sub)[:16]}): run it with the options it was started with, or choose "
                "another --out"
            )
    with fail_on_value_error():
        manifest = read_manifest(directory)
    record_run(directory, finished_before=0 if manifest is None else len(manifest["finished"]))
    typer.echo(f"shard {part}: {len(sub)} of {len(plan)} scenarios into {directory}", err=True)
    remeasure = math.ceil(settings.remeasure / part.count)
    return dataclasses.replace(
        job, plan=sub, out=directory, settings=dataclasses.replace(settings, remeasure=remeasure)
    )


def register(app: typer.Typer) -> None:
    """Add ``ficco fleet run|emit|shard`` to ``app``."""
    fleet = typer.Typer(
        help="Run one `ficco bench` sweep as shards across machines: on Ray, as a Slurm or Kubernetes job, "
        "or one shard here. Options a verb does not know are the sweep's `ficco bench` options.",
        no_args_is_help=True,
    )
    for name, verb in (("run", run), ("emit", emit), ("shard", shard)):
        fleet.command(name, **PASS_ON)(verb)
    app.add_typer(fleet, name="fleet")
