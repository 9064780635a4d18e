"""Which parts of a JSON Schema have a finite value at all.

A required property (or a minimum item) whose schema refers back to itself, with no
alternative that ends, admits no finite JSON value: `{"$defs": {"n": {"type": "object",
"properties": {"c": {"$ref": "#/$defs/n"}}, "required": ["c"]}}, "$ref": "#/$defs/n"}`.
The grammar library compiles such a schema, and then the parser runs out of its limits
mid-reply (inference/grammar.LIMITS). So the schema is checked first, and refused.

The check is the grammar "productive symbols" fixpoint: a subschema has a value when
every clause of its condition has an alternative that has one. Clauses come from `$ref`,
`allOf` (each), `anyOf`/`oneOf` (any), and, when `type` allows only objects and arrays,
the required properties and the first `minItems` items. Anything else (a scalar type, no
`type`, a keyword not followed here) counts as having a value: only a sure refusal is
made, and what the grammar library itself refuses is left to it. Linear in the schema's
size: a worklist, no recursion (a hostile schema nests as deep as the body allows).
"""

from __future__ import annotations

from collections import deque

# A clause is satisfied by any of its alternatives: a node index or True (always).
_Clause = list
ANY = True


def _pointer_token(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _resolve(root: object, ref: str) -> object | None:
    """The subschema a local `$ref` ("#", "#/a/b") points at; None if it does not exist
    or the ref is not a local JSON pointer (the grammar library deals with those)."""
    if not ref.startswith("#") or (len(ref) > 1 and ref[1] != "/"):
        return None
    node = root
    for token in ref[2:].split("/") if len(ref) > 1 else []:
        token = _pointer_token(token)
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return None
    return node


class _Graph:
    """Every subschema as a node with its clauses (AND of ORs)."""

    def __init__(self, root: object):
        self.root = root
        self.index: dict[int, int] = {}  # id(subschema) -> node
        self.clauses: list[list[_Clause]] = []
        self.paths: list[str] = []
        self.refs: list[int] = []  # nodes some $ref points at
        self._pending: deque[tuple[object, str]] = deque()
        self.node(root, "#")
        while self._pending:
            self._build(*self._pending.popleft())

    def node(self, schema: object, path: str) -> int | bool:
        if isinstance(schema, bool):
            return schema
        if not isinstance(schema, dict):
            return ANY  # not a schema: the grammar library says what it makes of it
        key = id(schema)
        if key not in self.index:
            self.index[key] = len(self.clauses)
            self.clauses.append([])
            self.paths.append(path)
            self._pending.append((schema, path))
        return self.index[key]

    def _virtual(self, clauses: list[_Clause], path: str) -> int:
        self.clauses.append(clauses)
        self.paths.append(path)
        return len(self.clauses) - 1

    def _build(self, schema: dict, path: str) -> None:
        n = self.index[id(schema)]
        clauses = self.clauses[n]
        ref = schema.get("$ref")
        if isinstance(ref, str):
            target = _resolve(self.root, ref)
            if target is not None:
                alt = self.node(target, ref)
                if not isinstance(alt, bool):
                    self.refs.append(alt)
                clauses.append([alt])
        if isinstance(schema.get("allOf"), list):
            for i, sub in enumerate(schema["allOf"]):
                clauses.append([self.node(sub, f"{path}/allOf/{i}")])
        for word in ("anyOf", "oneOf"):
            subs = schema.get(word)
            if isinstance(subs, list) and subs:
                clauses.append([self.node(s, f"{path}/{word}/{i}") for i, s in enumerate(subs)])
        # Children reached by no clause are still nodes: a $ref may point into them.
        for word in ("properties", "$defs", "definitions", "patternProperties"):
            if isinstance(schema.get(word), dict):
                for name, sub in schema[word].items():
                    self.node(sub, f"{path}/{word}/{_escape(name)}")
        for word in ("items", "additionalProperties", "contains", "not", "if", "then", "else"):
            if isinstance(schema.get(word), dict):
                self.node(schema[word], f"{path}/{word}")
        for word in ("prefixItems", "items"):
            if isinstance(schema.get(word), list):
                for i, sub in enumerate(schema[word]):
                    self.node(sub, f"{path}/{word}/{i}")
        kinds = schema.get("type")
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if not isinstance(kinds, list) or not kinds or set(kinds) - {"object", "array"}:
            return  # a scalar (or any type) is a value
        if "const" in schema or "enum" in schema:
            return  # listed values: the grammar library checks them
        alternatives = []
        if "object" in kinds:
            alternatives.append(self._virtual(self._object(schema, path), path))
        if "array" in kinds:
            alternatives.append(self._virtual(self._array(schema, path), path))
        clauses.append(alternatives)

    def _object(self, schema: dict, path: str) -> list[_Clause]:
        required = schema.get("required")
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        clauses = []
        for name in required if isinstance(required, list) else []:
            if isinstance(name, str) and name in props:
                clauses.append([self.node(props[name], f"{path}/properties/{_escape(name)}")])
        return clauses

    def _array(self, schema: dict, path: str) -> list[_Clause]:
        least = schema.get("minItems")
        if not isinstance(least, int) or isinstance(least, bool) or least <= 0:
            return []
        prefix = schema.get("prefixItems")
        if not isinstance(prefix, list):
            prefix = schema["items"] if isinstance(schema.get("items"), list) else []
        rest = schema.get("items") if not isinstance(schema.get("items"), list) else None
        if rest is None:
            rest = schema.get("additionalItems")
        clauses = [[self.node(s, f"{path}/prefixItems/{i}")]
                   for i, s in enumerate(prefix[:least])]
        if least > len(prefix) and isinstance(rest, dict):
            clauses.append([self.node(rest, f"{path}/items")])
        return clauses


def endless_part(schema: object) -> str | None:
    """The JSON pointer of a part of `schema` (the root, or what a `$ref` names) that no
    finite JSON value satisfies, because what it requires contains itself; None if none."""
    if not isinstance(schema, dict):
        return None  # true, or not a schema: the grammar library's to judge
    graph = _Graph(schema)
    clauses = graph.clauses
    open_clauses = [0] * len(clauses)
    users: list[list[tuple[int, int]]] = [[] for _ in clauses]  # node -> (node, clause)
    done = [[False] * len(cs) for cs in clauses]
    ready: deque[int] = deque()
    for n, cs in enumerate(clauses):
        for c, alts in enumerate(cs):
            if any(a is True for a in alts):
                done[n][c] = True
                continue
            open_clauses[n] += 1
            for a in alts:
                if not isinstance(a, bool):
                    users[a].append((n, c))
        if open_clauses[n] == 0:
            ready.append(n)
    valued = [False] * len(clauses)
    while ready:
        n = ready.popleft()
        if valued[n]:
            continue
        valued[n] = True
        for m, c in users[n]:
            if not done[m][c]:
                done[m][c] = True
                open_clauses[m] -= 1
                if open_clauses[m] == 0:
                    ready.append(m)
    for n in [0, *graph.refs]:
        if not valued[n]:
            return graph.paths[n]
    return None
