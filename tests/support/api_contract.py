"""api/openapi.yaml as a checker: every answer the REST API gives must match its written schema."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import yaml
from openapi_schema_validator import OAS30Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT4

SPEC_PATH = Path(__file__).parents[2] / "api" / "openapi.yaml"
SPEC_URI = "urn:spotwarp-openapi"


@functools.lru_cache(maxsize=1)
def spec() -> dict[str, Any]:
    return yaml.safe_load(SPEC_PATH.read_text())


def _operation_path(parts: tuple[str, ...]) -> str:
    """`("spotwarp", "api", "snapshots", "ab12", "restore")` -> `/snapshots/{id}/restore`."""
    assert parts[:2] == ("spotwarp", "api"), parts
    wanted = "/" + "/".join(parts[2:])
    for template in spec()["paths"]:
        pattern = "^" + re.sub(r"\{[^/]+\}", "[^/]+", template) + "$"
        if re.match(pattern, wanted):
            return template
    raise AssertionError(f"{wanted} is not a path of api/openapi.yaml")


def response_schema(method: str, parts: tuple[str, ...], code: int) -> dict[str, Any]:
    """The JSON schema api/openapi.yaml gives for this answer (fails the test when it gives none)."""
    operation = spec()["paths"][_operation_path(parts)].get(method.lower())
    assert operation is not None, f"{method} {parts} is not in api/openapi.yaml"
    response = operation["responses"].get(str(code))
    assert response is not None, f"{method} {'/'.join(parts)} answered {code}, which api/openapi.yaml does not list"
    if "$ref" in response:
        response = spec()["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]
    return response["content"]["application/json"]["schema"]


def check(method: str, parts: tuple[str, ...], code: int, body: Any) -> None:
    """Validate one answer against its schema, optional fields and all (unknown fields fail where closed)."""
    schema = response_schema(method, parts, code)
    registry = Registry().with_resource(SPEC_URI, Resource(contents=spec(), specification=DRAFT4))
    validator = OAS30Validator(_with_base(schema), registry=registry)
    errors = sorted(validator.iter_errors(body), key=lambda e: list(e.absolute_path))
    assert not errors, f"{method} {'/'.join(parts)} {code} does not match api/openapi.yaml: " + "; ".join(
        f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in errors[:5])


def _with_base(schema: Any) -> Any:
    """Rewrite `#/components/...` references to the spec's URI, so they resolve from any sub-schema."""
    if isinstance(schema, dict):
        return {k: (v.replace("#", SPEC_URI + "#", 1) if k == "$ref" and v.startswith("#") else _with_base(v))
                for k, v in schema.items()}
    if isinstance(schema, list):
        return [_with_base(v) for v in schema]
    return schema
