"""``ficco serve``, ``ficco score`` and ``ficco recommend``.

    ficco serve                    # 127.0.0.1:8000 (make serve); trains the default model if none
    ficco serve --host 0.0.0.0     # what the container runs
    ficco score datasets/model_configs/Llama-3.1-8B.json --tp 2 --tokens 4096,16384 --format table
    ficco recommend --op ag_gemm --m 8192 --n 14336 --k 4096

``score`` and ``recommend`` answer without a server, through the same code as ``POST /v1/score`` and
``POST /v1/recommend``. Heavy imports (fastapi, uvicorn, xgboost) happen inside the commands.
"""

from __future__ import annotations

import json
import logging
import shlex
import socket
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ficco.errors import FAILURE, fail
from ficco.training.options import DTypeOption, HostFactorOption

if TYPE_CHECKING:
    from ficco.service.core.config import ModelSettings, Settings
    from ficco.service.core.store import ModelStore

SERVE_COMMAND = ("ficco", "serve", "--host", "0.0.0.0")
"""The container's command (the Dockerfile's CMD; tests/service/test_dockerfile.py checks it)."""


class ScoreFormat(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


class RecommendFormat(StrEnum):
    table = "table"
    json = "json"


_MODE_HELP = "eager, or graph: the layer runs inside a replayed CUDA graph (the best schedule can differ)."
_MODEL_ROOT_HELP = "Model registry root (default: $FICCO_MODEL_ROOT, else models/ at the repository root)."
_TP_HELP = (
    "Ranks in the tensor/expert-parallel group (2..8; default: the hardware's GPU count): a world size the "
    "hardware's model was trained at (--world-size is its last release's spelling)."
)
_HARDWARE_HELP = (
    "Hardware id, e.g. h200x2, h200x2-sim (its simulated model), a custom id registered before, or a "
    "HardwareProfile JSON file (default: $FICCO_DEFAULT_HARDWARE or h200x2)."
)


def _settings(*, server: bool = False, **overrides: Any) -> Any:
    """The server's ``Settings`` (``server``) or only ``ModelSettings`` (what answering offline needs,
    so a bad server-only variable does not matter), from the environment with the given options on top;
    a bad value exits with one ``error:`` line."""
    from ficco.service.core.config import ModelSettings, Settings, SettingsError, load_settings

    try:
        return load_settings(Settings if server else ModelSettings, **overrides)
    except SettingsError as err:
        raise fail(str(err)) from None


def _hardware_id(value: str | None, settings: ModelSettings) -> str | None:
    """``--hardware`` as the id a request names: a HardwareProfile JSON file becomes its id (registered
    under the model root, as ``ficco bench`` and ``ficco retrain`` do); an id stays as given."""
    if value is None or not value.endswith(".json"):
        return value
    from ficco.features.hardware import load_hardware

    try:
        return load_hardware(value, settings.MODEL_ROOT).id
    except ValueError as err:
        raise fail(f"--hardware {value!r}: {err}") from None


def _offline_request(
    schema: Any, model_root: Path | None, hardware: str | None, **fields: Any
) -> tuple[ModelSettings, Any]:
    """The settings to answer offline with (``--model-root`` over the environment) and the request
    ``schema`` of the options ``fields`` and ``--hardware`` (:func:`_hardware_id`); a bad value exits with
    one ``error:`` line."""
    settings = _settings(MODEL_ROOT=model_root)
    return settings, _answer(schema, hardware=_hardware_id(hardware, settings), **fields)


def _loaded_store(settings: ModelSettings) -> ModelStore:
    """A store with every registered model loaded; exits with a clear message when none loads."""
    from ficco.service.core.store import ModelStore

    store = ModelStore(
        settings.MODEL_ROOT,
        cache_size=0,
        threads=settings.PREDICT_THREADS,
        bulk_threads=settings.BATCH_THREADS,
    )
    store.refresh()
    if not store.served:
        root = settings.MODEL_ROOT
        reason = store.last_reload_error or ("the registry is empty" if root.is_dir() else "no such folder")
        raise fail(
            f"no model could be loaded from {root}: {reason}. `ficco serve --prepare-only --model-root "
            f"{shlex.quote(str(root))}` trains the default model there from the shipped dataset."
        )
    return store


def _answer(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call the shared engine, turning its errors (and schema errors) into a clean exit: the line a 404 or
    422 of the service holds for the same mistake (``errors.error_line``), exit status 2."""
    from pydantic import ValidationError

    from ficco.service.errors import (
        InvalidFieldsError,
        NoModelError,
        UnknownHardwareError,
        error_line,
        from_pydantic,
    )

    try:
        return fn(*args, **kwargs)
    except ValidationError as err:
        raise fail(error_line([from_pydantic(e) for e in err.errors()])) from None
    except (InvalidFieldsError, UnknownHardwareError, NoModelError) as err:
        raise fail(str(err)) from None


def serve(
    host: Annotated[
        str | None, typer.Option(help="Interface to bind (default: $FICCO_HOST or 127.0.0.1).")
    ] = None,
    port: Annotated[int | None, typer.Option(help="TCP port (default: $FICCO_PORT or 8000).")] = None,
    model_root: Annotated[Path | None, typer.Option(help=_MODEL_ROOT_HELP)] = None,
    prepare_only: Annotated[
        bool,
        typer.Option("--prepare-only", help="Only make sure the default model is registered, then exit."),
    ] = False,
) -> None:
    """Start the recommendation service (uvicorn), training the default model first if none is registered.

    The default model is $FICCO_DEFAULT_HARDWARE's (h200x2); when the registry has none, it is trained
    from the shipped dataset $FICCO_DATASET_ROOT/<hardware> (datasets/h200x2) and promoted. Other
    settings (body limit, batch limit, reload token and polling) come from FICCO_* variables.
    """
    import uvicorn

    from ficco.service.core.protocol import with_limits
    from ficco.service.default_model import ensure_default_model
    from ficco.service.main import create_app

    settings: Settings = _settings(server=True, HOST=host, PORT=port, MODEL_ROOT=model_root)
    logging.basicConfig(level=settings.LOG_LEVEL.upper(), format="%(levelname)s:     %(name)s: %(message)s")
    sock = None if prepare_only else _listening(settings.HOST, settings.PORT)
    try:
        ensure_default_model(settings)
    except (FileNotFoundError, ValueError) as err:
        raise fail(str(err)) from None
    if sock is None:
        return
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        http=with_limits(settings, app.state.metrics.reject),
        h11_max_incomplete_event_size=settings.MAX_HEADER_BYTES,
        limit_concurrency=settings.MAX_CONNECTIONS,
        host=settings.HOST,
        port=settings.PORT,
        log_level=settings.LOG_LEVEL.lower(),
        access_log=settings.ACCESS_LOG,
    )
    server = uvicorn.Server(config)
    server.run(sockets=[sock])
    if not server.started:
        raise fail("the server did not start (the log above says why)", FAILURE)


def _listening(host: str, port: int) -> socket.socket:
    """A socket listening on ``host``:``port`` for the server, bound before the models load; a clean exit
    (status 1) naming the address when it cannot be had (in use, not this machine's)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as err:
        raise fail(
            f"cannot listen on {host}:{port}: {err.strerror or err}; choose another port with --port "
            "or FICCO_PORT (or another --host)",
            FAILURE,
        ) from None


def _read_config(file: Path) -> dict[str, Any]:
    """The JSON object in ``file``; ``ValueError`` saying what is wrong (for bad JSON: line, column and
    reason)."""
    try:
        data = json.loads(file.read_bytes())
    except json.JSONDecodeError as err:
        raise ValueError(f"invalid JSON at line {err.lineno}, column {err.colno}: {err.msg}") from None
    except (OSError, UnicodeDecodeError, RecursionError) as err:
        raise ValueError(f"cannot read it: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"must hold a JSON object (a config.json); got a JSON {type(data).__name__}")
    return data


def _where(field: str, index: int) -> str:
    """``field`` of config ``index``'s error as a prefix for its file's line: ``""`` for the config itself,
    ``"num_hidden_layers: "`` within it, ``"tokens.1: "`` for a shared setting."""
    inner = field.removeprefix(f"configs.{index}.config").removeprefix(".")
    return f"{inner}: " if inner else ""


def _score_files(
    paths: list[Path], request: Any, store: ModelStore, default_hardware: str
) -> tuple[Any, list[str]]:
    """Score every config file ``paths`` name (files, model folders holding config.json, folders of both)
    with ``request``'s settings (a ``ScoreSettings``); return the batch answer (one item per file, in
    order: unreadable files are refused items too) and one ``<file>: <reason>`` line per refused file."""
    from ficco.features.model_config import config_name, config_paths
    from ficco.service.errors import field_error
    from ficco.service.schemas import NamedConfig
    from ficco.service.scoring import failed_item, score_item, scores

    settings = request.model_dump()
    items, problems = [], []
    for path in paths:
        try:
            files = config_paths(path)
        except ValueError as err:
            problems.append(str(err))
            continue
        for file in files:
            index, name = len(items), config_name(file)
            try:
                named = NamedConfig.model_construct(config=_read_config(file), name=name)
            except ValueError as err:
                item = failed_item(
                    index, name, [field_error(["body", "configs", index, "config"], None, str(err))]
                )
            else:
                item = _answer(
                    score_item, store.served, settings, named, index, default_hardware=default_hardware
                )
            items.append(item)
            problems += [f"{file}: {_where(e.field, index)}{e.msg}" for e in item.errors or []]
    return scores(items), problems


def score(
    configs: Annotated[
        list[Path],
        typer.Argument(
            exists=True,
            help="Hugging Face config.json files, model folders holding one, or folders of them.",
        ),
    ],
    tp: Annotated[int | None, typer.Option("--tp", help=_TP_HELP)] = None,
    tokens: Annotated[str, typer.Option(help="Comma-separated token counts, e.g. 4096,16384.")] = "4096",
    dtype: DTypeOption = "bf16",
    hardware: Annotated[str | None, typer.Option(help=_HARDWARE_HELP)] = None,
    output_format: Annotated[
        ScoreFormat, typer.Option("--format", help="table, json (the API's answer) or csv.")
    ] = ScoreFormat.table,
    model_root: Annotated[Path | None, typer.Option(help=_MODEL_ROOT_HELP)] = None,
    mode: Annotated[str, typer.Option(help=_MODE_HELP)] = "eager",
    kv_layout: Annotated[
        str,
        typer.Option(
            help="KV heads fewer than tp ranks: megatron (refuse, the default) or vllm (replicate)."
        ),
    ] = "megatron",
    host_factor: HostFactorOption = None,
) -> None:
    """Score model configs offline (as POST /v1/score, or /v1/score/batch for several): each layer's pairs,
    schedules and projected savings.

    Every readable, valid config is scored; each refused one (bad JSON: its line, column and reason; a
    config ficco cannot read or split) gets an ``error:`` line on stderr, and the exit status is then 1.
    Options no model answers (a hardware, or a --tp it was not trained at) are one line, exit status 2.
    """
    from ficco.service.report import score_csv, score_table
    from ficco.service.schemas import ScoreSettings

    try:
        counts = [int(t) for t in tokens.split(",") if t.strip()]
    except ValueError as err:
        raise fail(f"--tokens must be comma-separated ints; got {tokens!r}: {err}") from None
    settings, request = _offline_request(
        ScoreSettings,
        model_root,
        hardware,
        tp=tp,
        tokens=counts,
        dtype=dtype,
        mode=mode,
        kv_layout=kv_layout,
        host_factor=host_factor,
    )
    from ficco.service.scoring import resolve_settings

    store = _loaded_store(settings)
    _answer(resolve_settings, store.served, request, default_hardware=settings.DEFAULT_HARDWARE)  # once
    result, problems = _score_files(configs, request, store, settings.DEFAULT_HARDWARE)
    scored = [item.result for item in result.data if item.result is not None]
    if output_format is ScoreFormat.json:
        one = result.count == 1 and not problems
        typer.echo((scored[0] if one else result).model_dump_json(indent=2))
    elif output_format is ScoreFormat.csv:
        typer.echo(score_csv(scored), nl=False)
    elif scored:
        typer.echo("\n\n".join(score_table(r) for r in scored))
    for problem in problems:
        typer.echo(f"error: {problem}", err=True)
    if problems:
        typer.echo(f"scored {result.count - result.failed} of {result.count} configs", err=True)
        raise typer.Exit(1)


def recommend(
    op: Annotated[str, typer.Option(help="ag_gemm, gemm_rs, a2a_gemm or gemm_a2a.")],
    m: Annotated[int, typer.Option(help="Rows (tokens); features/scenario.py gives each op's convention.")],
    n: Annotated[int, typer.Option(help="Output features of the GEMM on one rank.")],
    k: Annotated[int, typer.Option(help="Reduction dimension of the GEMM on one rank.")],
    dtype: DTypeOption = "bf16",
    tp: Annotated[int | None, typer.Option("--tp", help=_TP_HELP)] = None,
    hardware: Annotated[str | None, typer.Option(help=_HARDWARE_HELP)] = None,
    experts: Annotated[int, typer.Option(help="MoE ops only: experts in the layer.")] = 0,
    top_k: Annotated[int, typer.Option(help="MoE ops only: experts per token.")] = 0,
    imbalance: Annotated[float, typer.Option(help="MoE ops only: busiest rank's load over the mean.")] = 1.0,
    output_format: Annotated[
        RecommendFormat, typer.Option("--format", help="table or json (the API's answer).")
    ] = RecommendFormat.table,
    model_root: Annotated[Path | None, typer.Option(help=_MODEL_ROOT_HELP)] = None,
    mode: Annotated[str, typer.Option(help=_MODE_HELP)] = "eager",
    host_factor: HostFactorOption = None,
) -> None:
    """Recommend a schedule for one scenario offline (as POST /v1/recommend)."""
    from ficco.service.engine import recommend_scenarios
    from ficco.service.report import recommendation_table
    from ficco.service.schemas import ScenarioIn

    settings, item = _offline_request(
        ScenarioIn,
        model_root,
        hardware,
        op=op,
        m=m,
        n=n,
        k=k,
        dtype=dtype,
        world_size=tp,
        experts=experts,
        top_k=top_k,
        imbalance=imbalance,
        mode=mode,
        host_factor=host_factor,
    )
    served = _loaded_store(settings).served
    rec = _answer(recommend_scenarios, served, [item], default_hardware=settings.DEFAULT_HARDWARE)[0]
    typer.echo(
        rec.model_dump_json(indent=2) if output_format is RecommendFormat.json else recommendation_table(rec)
    )


def register(app: typer.Typer) -> None:
    """Add ``serve``, ``score`` and ``recommend`` to the ``ficco`` command line."""
    app.command("serve")(serve)
    app.command("score")(score)
    app.command("recommend")(recommend)
