"""Route -> tool translation, as fastapi-mcp does it: each route of the app's OpenAPI document
becomes one tool (its input schema and description), and a call becomes one HTTP request
handled by the app."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from worldenv.awm.adapter.dbapi import BINDING, CONNECTION
from worldenv.awm.adapter.freeze import CLOCK
from worldenv.core.app import ToolContext, ToolSpec
from worldenv.core.contract import CallContext, ToolInfo, ToolResult
from worldenv.core.dispatch import Connect, execute_tool, tool_failure

__all__ = ["METHODS", "AwmTool", "tools_of"]

if TYPE_CHECKING:
    from worldenv.awm.adapter.app import AwmApp

METHODS = ("get", "post", "put", "patch", "delete")  # what fastapi-mcp turns into tools


class AwmTool:
    """One route as a tool: the worker calls it as it calls a compiled tool."""

    def __init__(self, spec: ToolSpec, info: ToolInfo) -> None:
        self.spec = spec
        self.info = info

    def call(self, connect: Connect, arguments: dict[str, Any], context: CallContext
             ) -> ToolResult:
        CLOCK.set(context.clock)
        try:
            result = execute_tool(connect(), self.spec, {"arguments": arguments}, context)
        except Exception as exc:
            return tool_failure(self.info.name, exc)
        assert isinstance(result, ToolResult)
        return result


def _route_runner(app: AwmApp, operation_id: str, method: str, path: str,
                  parameters: list[dict[str, Any]]) -> Callable[..., ToolResult]:
    """The tool function of one route: fastapi-mcp's ``_execute_api_tool`` without HTTP."""

    def run(ctx: ToolContext, arguments: dict[str, Any]) -> ToolResult:
        args = dict(arguments)
        url = path
        for param in parameters:
            name = param.get("name")
            if param.get("in") == "path" and name in args:
                url = url.replace(f"{{{name}}}", _wire(args.pop(name)))
        query: list[tuple[str, str]] = []
        headers: list[tuple[str, str]] = []
        for param in parameters:
            name = param.get("name")
            if param.get("in") in ("query", "header") and name in args:
                value = args.pop(name)
                if value is None:
                    continue
                if param.get("in") == "header":
                    headers.append((str(name), _wire(value)))
                    continue
                values = value if isinstance(value, list) else [value]
                query.extend((str(name), _wire(v)) for v in values)
        body = json.dumps(args).encode() if args else None
        BINDING.bind(ctx.db)
        try:
            status, raw = app.request(method, url, query, body, headers)
        finally:
            CONNECTION.rollback()  # what the code left uncommitted, as a server's session
            BINDING.unbind()
        text = raw.decode("utf-8", "replace")
        try:
            parsed = json.loads(raw)
            shown = json.dumps(parsed, indent=2, ensure_ascii=False)
        except ValueError:
            parsed, shown = None, text
        if 400 <= status < 600:
            return ToolResult(True, f"Error calling {operation_id}. Status code: {status}. "
                                    f"Response: {text}")
        return ToolResult(False, shown, parsed if isinstance(parsed, dict) else None)

    run.__name__ = operation_id
    return run


def _wire(value: Any) -> str:
    """A parameter value in a URL as httpx writes it."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    return "" if value is None else str(value)


def tools_of(app: AwmApp) -> list[AwmTool]:
    """fastapi-mcp's ``convert_openapi_to_mcp_tools`` on the app's OpenAPI document."""
    openapi = app.fastapi.openapi()
    resolved = _resolve(openapi, openapi)
    tools: list[AwmTool] = []
    seen: set[str] = set()
    for path, path_item in resolved.get("paths", {}).items():
        for method, operation in path_item.items():
            operation_id = operation.get("operationId") if method in METHODS else None
            if not operation_id:
                continue
            if operation_id in seen:
                raise ValueError(f"two routes have the operation_id {operation_id!r}")
            seen.add(operation_id)
            description = _describe(method, path, operation)
            schema = _input_schema(operation_id, operation)
            parameters = list(operation.get("parameters", []))
            spec = ToolSpec(app.service, operation_id,
                            _route_runner(app, operation_id, method, path, parameters),
                            description, True)
            # Every route may write; a GET usually does not, so it reads first.
            tools.append(AwmTool(spec, ToolInfo(spec.full_name, description, schema, None,
                                                True, reads_first=method == "get")))
    return sorted(tools, key=lambda t: t.info.name)


def _describe(method: str, path: str, operation: dict[str, Any]) -> str:
    summary = operation.get("summary", "")
    description = operation.get("description", "")
    text = f"{summary}" if summary else f"{method.upper()} {path}"
    if description:
        text += f"\n\n{description}"
    responses = operation.get("responses", {})
    if not responses:
        return text
    info = "\n\n### Responses:\n"
    success_code = next((c for c in range(200, 300) if str(c) in responses), None)
    success = responses[str(success_code)] if success_code is not None else None
    chosen = {str(success_code): success} if success is not None else responses
    for code, data in chosen.items():
        info += f"\n**{code}**: {data.get('description', '')}"
        if data == success:
            info += " (Success Response)"
        for content_type, content in data.get("content", {}).items():
            if "schema" not in content:
                continue
            info += f"\nContent-Type: {content_type}"
            display = _clean(content["schema"])
            example = None
            if "examples" in content:
                for item in content["examples"].values():
                    if "value" in item:
                        example = item["value"]
                        break
            elif "example" in content:
                example = content["example"]
            if not example:
                example = _example(display)
            if example:
                info += "\n\n**Example Response:**\n```json\n"
                info += json.dumps(example, indent=2)
                info += "\n```"
    return text + info


def _input_schema(operation_id: str, operation: dict[str, Any]) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    required: list[str] = []
    params = operation.get("parameters", [])
    groups: list[tuple[str, dict[str, Any], bool]] = []
    for where, default_required in (("path", True), ("query", False)):
        for param in params:
            if param.get("in") == where:
                groups.append((param.get("name"), param,
                               param.get("required", default_required)))
    body = operation.get("requestBody", {})
    if body and "content" in body:
        content_type = next(iter(body["content"]), None)
        if content_type and "schema" in body["content"][content_type]:
            schema = body["content"][content_type]["schema"]
            for name, prop in schema.get("properties", {}).items():
                groups.append((name, {"name": name, "schema": prop},
                               name in schema.get("required", [])))
    for name, param, is_required in groups:
        prop_schema = param.get("schema", {})
        prop = dict(prop_schema)
        prop["title"] = name
        if param.get("description", ""):
            prop["description"] = param["description"]
        if "type" not in prop:
            prop["type"] = (prop_schema.get("type", "string") if param.get("in") == "path"
                            else _single_type(prop_schema))
        if "default" in prop_schema:
            prop["default"] = prop_schema["default"]
        properties[name] = prop
        if is_required:
            required.append(name)
    schema_out: dict[str, Any] = {"type": "object", "properties": properties,
                                  "title": f"{operation_id}Arguments"}
    if required:
        schema_out["required"] = required
    return schema_out


def _single_type(schema: dict[str, Any]) -> str:
    if "anyOf" in schema:
        found = [s.get("type") for s in schema["anyOf"] if s.get("type")]
        kinds = [k for k in dict.fromkeys(found) if k != "null"]
        return str(kinds[0]) if kinds else "string"
    return str(schema.get("type", "string"))


def _resolve(part: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    part = dict(part)
    ref = part.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
        found = reference.get("components", {}).get("schemas", {}).get(ref.split("/")[-1])
        if found is not None:
            part.pop("$ref")
            part.update(dict(found))
    for key, value in part.items():
        if isinstance(value, dict):
            part[key] = _resolve(value, reference)
        elif isinstance(value, list):
            part[key] = [_resolve(v, reference) if isinstance(v, dict) else v for v in value]
    return part


def _clean(schema: dict[str, Any]) -> dict[str, Any]:
    schema = dict(schema)
    for name in ("allOf", "anyOf", "oneOf", "nullable", "discriminator", "readOnly",
                 "writeOnly", "xml", "externalDocs"):
        schema.pop(name, None)
    if "properties" in schema:
        schema["properties"] = {k: _clean(v) if isinstance(v, dict) else v
                                for k, v in schema["properties"].items()}
    if schema.get("type") == "array" and isinstance(schema.get("items"), dict):
        schema["items"] = _clean(schema["items"])
    return schema


def _example(schema: Any) -> Any:
    if not schema or not isinstance(schema, dict):
        return None
    kind = schema.get("type")
    if kind == "object":
        out = {}
        for name, prop in schema.get("properties", {}).items():
            value = _example(prop)
            if value is not None:
                out[name] = value
        return out
    if kind == "array":
        if "items" in schema:
            item = _example(schema["items"])
            if item is not None:
                return [item]
        return []
    if kind == "string":
        return {"date-time": "2023-01-01T00:00:00Z", "date": "2023-01-01",
                "email": "user@example.com", "uri": "https://example.com"}.get(
            schema.get("format", ""), schema.get("title", "string"))
    return {"integer": 1, "number": 1.0, "boolean": True}.get(str(kind))
