"""GET /v1/models (registered models and what is served) and POST /v1/models/reload (admin, bearer token)."""

from __future__ import annotations

from fastapi import APIRouter

from ficco.service.deps import ReloadAuth, StoreDep
from ficco.service.schemas import (
    ErrorPublic,
    HardwareModelsPublic,
    ModelsPublic,
    ModelVersionPublic,
    ReloadPublic,
)

router = APIRouter(prefix="/v1/models", tags=["models"])


@router.get("", response_model=ModelsPublic)
def read_models(store: StoreDep) -> ModelsPublic:
    """Registered hardware ids with their versions and metrics, and the versions this process serves."""
    registered = store.registry.list_models(store.root)
    served = store.served
    data = []
    for hw in sorted(set(registered) | set(served)):
        current = store.registry.current_version(store.root, hw)
        serving = served[hw].version if hw in served else None
        versions = [
            ModelVersionPublic(
                version=card["version"],
                current=card["version"] == current,
                serving=card["version"] == serving,
                card=store.public_card(card),
            )
            for card in registered.get(hw, [])
        ]
        data.append(HardwareModelsPublic(hardware_id=hw, current=current, serving=serving, versions=versions))
    return ModelsPublic(data=data, count=len(data))


@router.post(
    "/reload",
    response_model=ReloadPublic,
    dependencies=[ReloadAuth],
    responses={code: {"model": ErrorPublic} for code in (401, 403, 404)},
)
def reload_models(store: StoreDep) -> ReloadPublic:
    """Reload every hardware's current version now; a failed load keeps the previous model serving."""
    outcomes = store.refresh(force=True)
    serving = {hw: model.version for hw, model in store.served.items()}
    return ReloadPublic(outcomes=outcomes, serving=serving, last_reload_error=store.last_reload_error)
