"""The API description says every answer an operation can give: besides its success, the refusals
every endpoint shares (cluster.api.errors, DRF's permissions and throttles), each as a JSON object
that names what is wrong (a field, or ``detail``)."""

from __future__ import annotations

ERROR = {
    "type": "object",
    "description": "What is wrong: the field names, or `detail`, with the reasons",
    "additionalProperties": True,
}
REASONS = {
    "400": "Bad input: the fields (or query parameters) named, and why; nothing was changed",
    "401": "No credentials, or credentials that are not valid",
    "403": "The caller's role (or node credential) may not do this",
    "404": "No such object (or a list page past the last)",
    "409": "The object's state does not allow this now (it says which state), or it is still in use",
    "413": "The request body is over the size limit",
    "429": "Too many requests or failed attempts: Retry-After says when to try again",
}


def add_error_responses(result, generator, request, public):
    """drf-spectacular postprocessing hook: the shared refusals on every operation."""
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR
    ref = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for path, item in result.get("paths", {}).items():
        for method, operation in item.items():
            if method not in ("get", "post", "put", "patch", "delete"):
                continue
            codes = {"401", "403", "429"}
            if "{" in path or method == "get":  # a list's page past the last is a 404 too
                codes.add("404")
            if method != "get" or operation.get("parameters"):
                codes.add("400")
            if method != "get":
                codes |= {"409", "413"}
            responses = operation.setdefault("responses", {})
            for code in sorted(codes):
                responses.setdefault(code, {"description": REASONS[code], "content": ref})
    return result
