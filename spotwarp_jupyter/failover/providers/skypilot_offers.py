"""Offers from SkyPilot's catalog: spot prices for the spec's accelerator on the enabled clouds, cheapest first."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from ...engine.errors import SpotWarpError
from ..provider import LaunchSpec, Offer
from .skypilot_sdk import SkyPilotUnavailable, load_sky, one_line


def _split_gpus(gpus: str | None) -> tuple[str | None, int]:
    if not gpus:
        return None, 1
    name, _, count = gpus.partition(":")
    return name.strip(), int(float(count)) if count.strip() else 1


def catalog_offers(spec: LaunchSpec, provider: str = "skypilot") -> list[Offer]:
    """Every spot offer in SkyPilot's catalog for spec's accelerator, clouds and price cap, cheapest first."""
    sky = load_sky()
    name, count = _split_gpus(spec.gpus)
    if name is None:
        raise SpotWarpError("the SkyPilot provider needs --gpus (e.g. A100:1) to pick offers from the catalog")
    clouds = list(spec.clouds) or enabled_clouds(sky)
    if not clouds:
        return []
    try:
        listed = sky.list_accelerators(
            gpus_only=True, name_filter=f"^{re.escape(name)}$", quantity_filter=count,
            clouds=clouds, case_sensitive=False, all_regions=True,
        )
    except Exception as e:  # noqa: BLE001 (a catalog SkyPilot cannot read or fetch is one line)
        raise SkyPilotUnavailable(f"SkyPilot's catalog could not be read: {one_line(e)}") from None
    best: dict[tuple[str, str | None, str | None], Offer] = {}
    for infos in listed.values():
        for info in infos:
            price = info.spot_price
            if price is None or (isinstance(price, float) and math.isnan(price)):
                continue  # no spot market there
            if spec.max_price is not None and price > spec.max_price:
                continue
            cloud = str(info.cloud).lower()
            key = (cloud, info.region, info.instance_type)
            if key in best and best[key].price_per_hour <= price:  # type: ignore[operator]
                continue
            best[key] = Offer(
                provider=provider, cloud=cloud, region=info.region, instance_type=info.instance_type,
                accelerators=f"{info.accelerator_name}:{int(info.accelerator_count)}",
                price_per_hour=float(price),
                details={"on_demand_price": float(info.price), "vcpus": info.cpu_count, "memory_gib": info.memory},
            )
    return sorted(best.values(), key=lambda o: (o.price_per_hour, o.cloud, o.region or "", o.instance_type or ""))


def enabled_clouds(sky: Any, wanted: Sequence[str] = ()) -> list[str]:
    """The clouds SkyPilot may launch on; `sky check` runs once for wanted clouds its cache lacks."""
    from sky.client import sdk  # enabled_clouds and check are not re-exported at the top level

    try:
        enabled = [str(c).lower() for c in sky.get(sdk.enabled_clouds())]
        missing = tuple(c for c in wanted if c not in enabled)
        if missing or not enabled:
            # The API server only caches what the last `sky check` found; credentials set up since count too.
            sky.get(sdk.check(missing or None, verbose=False))
            enabled = [str(c).lower() for c in sky.get(sdk.enabled_clouds())]
    except Exception as e:  # noqa: BLE001
        raise SkyPilotUnavailable(f"SkyPilot could not list the enabled clouds: {one_line(e)}") from None
    return enabled
