"""``GET /v1/models``: the models the fleet serves, as OpenAI lists them.

From the workers' announcements (:mod:`batchpipe.fleet`): one ``model`` object per model a
live worker serves, ``created`` the oldest live announcement's time, ``owned_by``
``batchpipe``, and batchpipe's own ``batchpipe`` field telling its requests topic(s),
endpoints and live workers. ``GET /v1/models/{model}`` is one of them, 404 otherwise. The
official SDK reads it with ``client.models.list()`` and ``models.retrieve()``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from batchpipe.api.context import owner, services
from batchpipe.api.errors import not_found
from worker.obs.announce import Announcement

router = APIRouter()


def _model(name: str, workers: list[Announcement]) -> dict[str, Any]:
    return {
        "id": name,
        "object": "model",
        "created": int(min(w.at for w in workers)),
        "owned_by": "batchpipe",
        "batchpipe": {
            "requests_topics": sorted({w.requests_topic for w in workers}),
            "endpoints": sorted({e for w in workers for e in w.endpoints}),
            "workers": len(workers),
        },
    }


def _served(request: Request) -> dict[str, list[Announcement]]:
    fleet = services(request).fleet
    return {} if fleet is None else fleet.served()


@router.get("/v1/models")
def list_models(request: Request, who: str = Depends(owner)) -> dict[str, Any]:
    served = _served(request)
    return {"object": "list", "data": [_model(m, served[m]) for m in sorted(served)]}


@router.get("/v1/models/{model:path}")
def retrieve_model(model: str, request: Request, who: str = Depends(owner)) -> dict[str, Any]:
    served = _served(request)
    if model not in served:
        raise not_found("model", model, "model")
    return _model(model, served[model])
